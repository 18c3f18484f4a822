#!/usr/bin/python3
"""megaw --backend cuda trains the losses of --backend cpu (within 1e-4,
relative; 1e-3 with --bf16, where one fp32 ulp of difference in a GEMM input
can move its bf16 rounding) on the same job. Skipped (77) without a GPU or the module, and
the two-rank layouts without two GPUs (NCCL takes one GPU per rank).

  single  one rank
  pp2     PP=2: activations over NCCL P2P, the shape messages and the
          grad-norm pieces over the Gloo host groups
  dp2     DP=2 with --overlap-grad-reduce and --use-distributed-optimizer:
          buckets reduce-scattered and parameters all-gathered over NCCL
  bf16    one rank with --bf16 against the cpu backend's --bf16
  llama   one rank of pipeline_check.py's Llama (RMSNorm, SwiGLU, RoPE and
          grouped-query attention kernels, untied head)
  llama-tp2  the Llama at TP=2: query groups split, collectives over NCCL
  dropout    one rank with --attention-dropout 0.9: the same masks as the cpu
  dropout-bf16  the same under --bf16 with 64-wide heads and T 72, a shape
          flash attention takes without the mask: the batched GEMMs, in
          buffers the model sized for them

At these models' initial weights attention dropout of 0.1 moves the losses
by 2e-5 to 3e-4 relative, no more than about the tolerances (1e-4; 1e-3
under --bf16), so a cuda run without the mask, or with another one, would
pass; 0.9 moves them by 5e-4 to 7e-3. The dropout modes also train the cpu
without the mask and fail unless it moves every loss by more than twice the
tolerance; --power runs only that part (no GPU needed: meson's
cuda_training_power_* tests).

usage: cuda_training.py MEGAW [single|pp2|dp2|bf16|llama|llama-tp2|dropout|dropout-bf16]
       [--power]
"""
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "engine"))
import pipeline_check as pc  # noqa: E402
import ranks  # noqa: E402

MODES = {
    "single": (1, []),
    "pp2": (2, ["--pipeline-model-parallel-size", "2", "--variable-seq-lengths"]),
    "dp2": (2, ["--overlap-grad-reduce", "--use-distributed-optimizer", "--bucket-size",
                "20000"]),
    "bf16": (1, ["--bf16"]),
    "llama": (1, []),
    "llama-tp2": (2, ["--tensor-model-parallel-size", "2", "--sequence-parallel"]),
    "dropout": (1, ["--attention-dropout", "0.9"]),
    "dropout-bf16": (1, ["--attention-dropout", "0.9", "--bf16"]),
}
RTOL = {"bf16": 1e-3, "dropout-bf16": 1e-3}


def flash_shaped(model):
    """model with 2 heads of 64 and T 72: a flash shape (worker/backend/backend.h)."""
    widths = {"--hidden-size": "128", "--num-attention-heads": "2", "--seq-length": "72"}
    return [widths.get(model[i - 1], a) if i else a for i, a in enumerate(model)]


def mask_too_weak(megaw, world, args, tmp, cpu, rtol, mode):
    """Whether attention dropout's mask moves some iteration's cpu loss (cpu:
    with it) by no more than 2 x rtol: there a cuda run without the mask, or
    with another one, could pass the check. Says so, and by how much."""
    plain = ["0" if i and args[i - 1] == "--attention-dropout" else a for i, a in enumerate(args)]
    base = ranks.losses_of(ranks.launch(megaw, world, plain + ["--backend", "cpu"], tmp),
                           "cpu %s without the mask" % mode)
    moved = {i: abs(cpu[i] - base[i]) / abs(cpu[i]) for i in cpu}
    for i in sorted(moved):
        print("%s iteration %d: the mask moves the cpu's loss by %.2g (the check needs more "
              "than %.2g)" % (mode, i, moved[i], 2 * rtol))
    weak = [i for i in sorted(moved) if not moved[i] > 2 * rtol]
    if weak:
        print("FAIL %s: the mask moves the losses of iterations %s too little for the check to "
              "see it" % (mode, weak))
    return bool(weak)


def devices():
    """CUDA devices nvidia-smi lists; None without nvidia-smi."""
    if not shutil.which("nvidia-smi"):
        return None
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    if r.returncode != 0:
        return None
    return sum(1 for ln in r.stdout.splitlines() if ln.startswith("GPU "))


def main():
    megaw, mode = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "single"
    power = sys.argv[3:] == ["--power"]
    world, extra = MODES[mode]
    rtol = RTOL.get(mode, 1e-4)
    have = devices()
    if not power and have is not None and have < world:  # else rank 0 waits for the others
        print("skipped: %s needs %d CUDA devices; this machine has %d" % (mode, world, have))
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data.txt")
        ranks.write_data(data)
        model = pc.LLAMA + pc.UNTIE if mode.startswith("llama") else ranks.MODEL
        if mode == "dropout-bf16":
            model = flash_shaped(model)
        args = model + ["--train-iters", str(ranks.ITERS), "--data-path", data] + extra
        cpu_run = lambda: ranks.losses_of(  # noqa: E731
            ranks.launch(megaw, world, args + ["--backend", "cpu"], tmp), "cpu " + mode)
        dropout = "--attention-dropout" in extra
        if power:  # only the dropout modes have a mask to see
            return 1 if not dropout or mask_too_weak(megaw, world, args, tmp, cpu_run(), rtol,
                                                     mode) else 0
        res = ranks.launch(megaw, world, args + ["--backend", "cuda"], tmp, timeout=240)
        why = [err.strip() for rc, _, err in res if rc != 0]
        if any("no CUDA device" in w for w in why):
            print("skipped:", next(w for w in why if "no CUDA device" in w))
            return 77
        if why:
            print("FAIL --backend cuda:", why[0][-600:])
            return 1
        gpu = ranks.losses_of(res, "cuda " + mode)
        cpu = cpu_run()
        bad = [i for i in cpu if abs(gpu[i] - cpu[i]) > rtol * abs(cpu[i])]
        for i in sorted(cpu):
            print("%s iteration %d: cuda %.7f cpu %.7f" % (mode, i, gpu[i], cpu[i]))
        weak = dropout and mask_too_weak(megaw, world, args, tmp, cpu, rtol, mode)
        return 1 if bad or weak else 0


if __name__ == "__main__":
    sys.exit(main())
