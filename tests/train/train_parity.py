#!/usr/bin/python3
"""megaw's training against PyTorch, end to end: five AdamW iterations.

megaw trains a tiny model with --save-initial; the torch.nn model of
tests/ref/make_ref.py (float64) starts from iter_0000000 and takes the same
steps on the README's data order, with torch.optim.AdamW (weight decay on
2-D weights only, Megatron's rule: no biases, no norms), clip_grad_norm_ and
Megatron's warmup-then-cosine LR for the samples consumed before each step.
Every iteration's loss, grad norm and LR, and every weight after the last
step, must agree. Cases: a Llama with what the committed vectors
(tests/ref/llama_tiny*) leave out (RoPE on half of each head's channels at
base 500000, --kv-channels apart from hidden / heads, biases, a tied head)
on one rank and on TP 2 x PP 2 with sequence parallelism; GPT-2 on PP 2 x
DP 2 with the distributed optimizer.

  /usr/bin/python3 train_parity.py MEGAW WORKDIR
"""
import json
import math
import os
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "ref"))
sys.path.insert(0, os.path.join(HERE, "..", "engine"))
import hf_ckpt_check  # noqa: E402
import ranks  # noqa: E402

T, G, MB, ITERS = 16, 8, 2, 5
LR, MIN_LR, WARMUP, WD, CLIP, BETA1, BETA2, EPS = 5e-3, 5e-4, 2, 0.3, 0.3, 0.9, 0.95, 1e-8
LLAMA = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
         "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
         "--ffn-hidden-size", "48", "--group-query-attention", "--num-query-groups", "2",
         "--rotary-percent", "0.5", "--rotary-base", "500000", "--kv-channels", "16"]
GPT2 = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4"]
CASES = [  # name, model, world, layout
    ("llama one rank", LLAMA, 1, []),
    ("llama tp2 pp2 sp", LLAMA, 4, ["--tensor-model-parallel-size", "2",
                                    "--pipeline-model-parallel-size", "2", "--sequence-parallel"]),
    ("gpt2 pp2 dp2 distributed", GPT2, 4, ["--pipeline-model-parallel-size", "2",
                                           "--use-distributed-optimizer"]),
]


def megatron_lr(samples):
    """OptimizerParamScheduler.get_lr, warmup then cosine, counted in samples."""
    warmup, decay = WARMUP * G, ITERS * G
    if samples <= warmup:
        return LR * samples / warmup
    r = (samples - warmup) / (decay - warmup)
    return MIN_LR + (LR - MIN_LR) * 0.5 * (math.cos(math.pi * r) + 1.0)


def run_megaw(megaw, work, model, world, layout):
    data, save = os.path.join(work, "data.txt"), os.path.join(work, "ckpt")
    ranks.write_data(data)
    subprocess.run(["rm", "-rf", save], check=True)
    args = model + layout + [
        "--seq-length", str(T), "--micro-batch-size", str(MB), "--global-batch-size", str(G),
        "--train-iters", str(ITERS), "--lr", str(LR), "--min-lr", str(MIN_LR),
        "--lr-warmup-iters", str(WARMUP), "--lr-decay-style", "cosine",
        "--weight-decay", str(WD), "--clip-grad", str(CLIP), "--adam-beta1", str(BETA1),
        "--adam-beta2", str(BETA2), "--adam-eps", str(EPS), "--make-vocab-size-divisible-by",
        "64", "--seed", "3", "--data-path", data, "--save", save, "--save-initial",
        "--save-interval", str(ITERS)]
    steps = {}
    for rc, lines, err in ranks.launch(megaw, world, args, work, timeout=240):
        if rc != 0:
            raise RuntimeError("megaw exited %d: %s" % (rc, err.strip()[-400:]))
        steps.update({l["iteration"]: l for l in lines if "loss" in l})
    return data, save, steps


def check(name, megaw, work, model_flags, world, layout):
    data, save, steps = run_megaw(megaw, work, model_flags, world, layout)
    first = os.path.join(save, "iter_0000000")
    model = hf_ckpt_check.model_of(json.load(open(os.path.join(first, "config.json"))))
    model.load_hf(hf_ckpt_check.read_hf_model(first))
    params = model.hf_params()
    opt = torch.optim.AdamW(
        [{"params": [p for p, _ in params.values() if p.dim() == 2], "weight_decay": WD},
         {"params": [p for p, _ in params.values() if p.dim() != 2], "weight_decay": 0.0}],
        lr=LR, betas=(BETA1, BETA2), eps=EPS)
    stream = list(open(data, "rb").read())
    K = (len(stream) - 1) // T
    bad = []
    for i in range(ITERS):
        win = [(i * G + j) % K for j in range(G)]
        tok = torch.tensor([stream[k * T:k * T + T] for k in win])
        tgt = torch.tensor([stream[k * T + 1:k * T + T + 1] for k in win])
        lr = megatron_lr(i * G)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad()
        logits = model(tok)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), tgt.view(-1))
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP).item()
        opt.step()
        got = steps[i + 1]
        for what, a, b, tol in (("loss", got["loss"], loss.item(), 1e-6),
                                ("grad norm", got["grad_norm"], norm, 1e-6),
                                ("lr", got["lr"], lr, 1e-12)):
            if abs(a - b) > tol * max(abs(b), 1e-30):
                bad.append("iteration %d %s: megaw %.9g, torch %.9g" % (i + 1, what, a, b))
    last = hf_ckpt_check.read_hf_model(os.path.join(save, "iter_%07d" % ITERS))
    worst = 0.0
    for pname, (p, t) in params.items():
        ref = (p.t() if t else p).detach().numpy()
        # relative to the tensor's largest element: a key bias's gradient is
        # rounding noise, which Adam scales up to whole steps in both
        err = np.abs(last[pname].astype(np.float64) - ref).max() / np.abs(ref).max()
        worst = max(worst, err)
        if err > 3e-4:
            bad.append("%s after %d steps: relative error %.2e" % (pname, ITERS, err))
    print("%s %s: %d iterations, %d tensors, worst weight error %.1e%s" %
          ("FAIL" if bad else "ok  ", name, ITERS, len(params), worst,
           "".join("\n     " + b for b in bad)), flush=True)
    return not bad


def main():
    megaw, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    ok = True
    for name, model, world, layout in CASES:
        ok &= check(name, megaw, work, model, world, layout)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
