#!/usr/bin/python3
"""megaw --backend cuda trains the losses of --backend cpu (within 1e-4,
relative) on the same job. Skipped (77) without a GPU or the module.
A PP=2 run needs the NCCL communicator, which is not built yet.

usage: cuda_training.py MEGAW
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "engine"))
import pipeline_check as pc  # noqa: E402


def losses(megaw, args):
    p = subprocess.run([megaw, "--json"] + args, capture_output=True, text=True, timeout=240)
    if p.returncode != 0:
        return None, p.stderr.strip()
    return {l["iteration"]: l["loss"] for l in map(json.loads, p.stdout.splitlines())
            if "loss" in l}, ""


def main():
    megaw = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data.txt")
        pc.write_data(data)
        args = pc.MODEL + ["--train-iters", "5", "--data-path", data]
        gpu, why = losses(megaw, args + ["--backend", "cuda"])
        if gpu is None:
            if "no CUDA device" in why:
                print("skipped:", why)
                return 77
            print("FAIL --backend cuda:", why)
            return 1
        cpu, why = losses(megaw, args + ["--backend", "cpu"])
        bad = [i for i in cpu if abs(gpu[i] - cpu[i]) > 1e-4 * abs(cpu[i])]
        for i in sorted(cpu):
            print("iteration %d: cuda %.7f cpu %.7f" % (i, gpu[i], cpu[i]))
        return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
