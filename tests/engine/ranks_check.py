#!/usr/bin/python3
"""ranks.launch() with ranks that write more than a pipe holds (64 KB):
two pipeline stages of the tiny GPT, each printing a JSON line of about
1 KB an iteration, for enough iterations that each writes twice that.
launch() once read the ranks one after another: rank 1, its pipe full,
stopped, and rank 0, being read and waiting on rank 1, with it, until the
timeout. Every iteration's loss must come back, from every rank's output.

usage: ranks_check.py MEGAW"""
import json
import os
import sys
import tempfile
import time

from ranks import MODEL, launch, losses_range, write_data

PIPE_BYTES = 64 * 1024
ITERS = 150


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="mega-ranks-") as tmp:
        data = os.path.join(tmp, "data.txt")
        write_data(data)
        args = MODEL + ["--train-iters", str(ITERS), "--data-path", data,
                        "--pipeline-model-parallel-size", "2"]
        t0 = time.time()
        try:
            results = launch(sys.argv[1], 2, args, tmp, timeout=60)
            losses_range(results, "2 stages", 1, ITERS)
        except RuntimeError as e:
            print("FAIL %s" % e)
            return 1
        took = time.time() - t0
    ok = True
    for r, (_, lines, _) in enumerate(results):
        size = sum(len(json.dumps(l, separators=(",", ":"))) + 1 for l in lines)
        good = size > 2 * PIPE_BYTES
        print("%s rank %d: %d lines, about %d bytes of JSON" %
              ("ok  " if good else "FAIL", r, len(lines), size))
        ok &= good
    print("2 ranks, %d iterations each, read in %.1f s" % (ITERS, took))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
