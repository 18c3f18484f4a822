#!/usr/bin/python3
"""Tensor-parallel benchmark (seed 004); figures, never a pass/fail.

TP=1, TP=2 and TP=2 with --sequence-parallel on the same model (4 layers,
hidden 256, 8 heads, sequence 128, 4 microbatches of 2): tokens/s, the
step time, the share of each rank's step spent in TP collectives
(tp_comm_s / step_time_s, mean over ranks and iterations after the first),
and the per-rank parameter and activation bytes. Each process runs one BLAS
thread by default, so TP=2 uses two cores where TP=1 uses one; the row
"TP=1 2 BLAS" gives the single process both cores, the fair comparison.
The TP share counts the time inside the collectives, which includes waiting
for the slower peer: on two shared cores it is mostly that.

usage: bench_tp.py MEGAW [ITERS]
"""
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "engine"))
from ranks import launch, write_data  # noqa: E402

MODEL = ["--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "8",
         "--seq-length", "128", "--micro-batch-size", "2", "--global-batch-size", "8",
         "--lr", "1e-3"]


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    megaw = sys.argv[1]
    iters = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    with tempfile.TemporaryDirectory(prefix="bench-tp-") as tmp:
        data = os.path.join(tmp, "data.txt")
        write_data(data)
        base = MODEL + ["--train-iters", str(iters), "--data-path", data]
        print("%-12s %10s %9s %9s %14s %16s" % ("layout", "tokens/s", "step s", "TP comm",
                                               "params/rank", "peak acts/rank"))
        for name, world, extra in (("TP=1", 1, []),
                                   ("TP=1 2 BLAS", 1, ["--blas-threads", "2"]),
                                   ("TP=2", 2, ["--tensor-model-parallel-size", "2"]),
                                   ("TP=2 SP", 2, ["--tensor-model-parallel-size", "2",
                                                   "--sequence-parallel"])):
            res = launch(megaw, world, base + extra, tmp, timeout=900)
            for rc, _, err in res:
                if rc != 0:
                    raise SystemExit("%s: a rank failed: %s" % (name, err.strip()[-400:]))
            lines = [l for _, ls, _ in res for l in ls if l["iteration"] > 1]
            tps = statistics.median(l["tokens_per_s"] for l in lines)
            step = statistics.median(l["step_time_s"] for l in lines)
            share = statistics.mean(l["tp_comm_s"] / l["step_time_s"] for l in lines)
            params = max(l["param_bytes"] for l in lines)
            acts = max(l["peak_activation_bytes"] for l in lines)
            print("%-12s %10.0f %9.3f %8.1f%% %11.1f MB %13.1f MB" %
                  (name, tps, step, 100 * share, params / 1e6, acts / 1e6), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
