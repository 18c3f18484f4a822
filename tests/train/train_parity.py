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
DP 2 with the distributed optimizer; and GPT-2 with --no-bias-gelu-fusion,
whose GELU is then torch's exact (erf) F.gelu, as Megatron's is, and whose
losses must also stand apart from the tanh GELU's (the torch model again
with nn.GELU(approximate="tanh") from the same weights): so the check
tells the two forms apart. And GPT-2 with --hidden-dropout 0.1 on TP 2 x PP 2
with sequence parallelism, the torch model drawing mega's counter-based
masks (make_ref.HiddenDropout restates kernels/dropout.h), and GPT-2 with
--attention-dropout 0.1 the same way (the mask of sample, head, query and key).

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
import make_ref  # noqa: E402
import ranks  # noqa: E402

T, G, MB, ITERS, SEED = 16, 8, 2, 5, 3
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
    # weights large enough that c_fc's outputs reach |x| ~ 1, where the two
    # GELUs differ by ~1e-4 (at the default 0.02 the losses agree to 1e-8)
    # hidden dropout: the torch model draws mega's counter-based masks
    # (make_ref.HiddenDropout), so losses, norms and weights must agree
    ("gpt2 hidden dropout tp2 pp2 sp", GPT2 + ["--hidden-dropout", "0.1"], 4,
     ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
      "--sequence-parallel"]),
    # attention dropout: the mask of (sample, head, query, key), heads split
    # over TP, the probabilities recomputed under selective recomputation
    ("gpt2 attention dropout tp2 pp2 sp", GPT2 + ["--attention-dropout", "0.1"], 4,
     ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
      "--sequence-parallel", "--recompute-granularity", "selective"]),
    ("gpt2 erf gelu (--no-bias-gelu-fusion)",
     GPT2 + ["--no-bias-gelu-fusion", "--init-method-std", "0.2"], 1, []),
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
        "64", "--seed", str(SEED), "--data-path", data, "--save", save, "--save-initial",
        "--save-interval", str(ITERS)]
    steps = {}
    for rc, lines, err in ranks.launch(megaw, world, args, work, timeout=240):
        if rc != 0:
            raise RuntimeError("megaw exited %d: %s" % (rc, err.strip()[-400:]))
        steps.update({l["iteration"]: l for l in lines if "loss" in l})
    return data, save, steps


def torch_steps(model, stream, dropout=0.0, attn_dropout=0.0):
    """ITERS steps of the torch model: each iteration's (loss, grad norm, lr);
    with dropout, iteration i holds samples i*G...(i+1)*G-1."""
    params = model.hf_params()
    opt = torch.optim.AdamW(
        [{"params": [p for p, _ in params.values() if p.dim() == 2], "weight_decay": WD},
         {"params": [p for p, _ in params.values() if p.dim() != 2], "weight_decay": 0.0}],
        lr=LR, betas=(BETA1, BETA2), eps=EPS)
    K = (len(stream) - 1) // T
    out = []
    for i in range(ITERS):
        win = [(i * G + j) % K for j in range(G)]
        tok = torch.tensor([stream[k * T:k * T + T] for k in win])
        tgt = torch.tensor([stream[k * T + 1:k * T + T + 1] for k in win])
        lr = megatron_lr(i * G)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad()
        model.drop = (make_ref.HiddenDropout(dropout, SEED, i * G, attn_dropout)
                      if dropout or attn_dropout else None)
        logits = model(tok)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), tgt.view(-1))
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP).item()
        opt.step()
        out.append((loss.item(), norm, lr))
    return out


def model_from(first, config):
    model = hf_ckpt_check.model_of(config)
    model.load_hf(hf_ckpt_check.read_hf_model(first))
    return model


def check(name, megaw, work, model_flags, world, layout):
    data, save, steps = run_megaw(megaw, work, model_flags, world, layout)
    first = os.path.join(save, "iter_0000000")
    config = json.load(open(os.path.join(first, "config.json")))
    erf = "--no-bias-gelu-fusion" in model_flags
    bad = []
    if config["model_type"] == "gpt2" and \
            config.get("activation_function") != ("gelu" if erf else "gelu_new"):
        bad.append("config.json's activation_function is %r" % config.get("activation_function"))
    model = model_from(first, config)
    stream = list(open(data, "rb").read())
    gpt2 = config["model_type"] == "gpt2"
    dropout = config.get("resid_pdrop", 0.0) if gpt2 else 0.0
    attn_dropout = config.get("attn_pdrop", 0.0) if gpt2 else config.get("attention_dropout")
    if ("--hidden-dropout" in model_flags) != (dropout > 0):
        bad.append("config.json's resid_pdrop is %r" % dropout)
    if ("--attention-dropout" in model_flags) != (attn_dropout != 0.0):
        bad.append("config.json's attention dropout is %r" % attn_dropout)
    ref = torch_steps(model, stream, dropout, attn_dropout if gpt2 else 0.0)
    for i, (loss, norm, lr) in enumerate(ref):
        got = steps[i + 1]
        for what, a, b, tol in (("loss", got["loss"], loss, 1e-6),
                                ("grad norm", got["grad_norm"], norm, 1e-6),
                                ("lr", got["lr"], lr, 1e-12)):
            if abs(a - b) > tol * max(abs(b), 1e-30):
                bad.append("iteration %d %s: megaw %.9g, torch %.9g" % (i + 1, what, a, b))
    apart = ""
    if erf:
        # the same weights and steps with the tanh GELU: megaw's losses must
        # be farther from these than five times the tolerance, or the check
        # above could not have told the forms apart
        tanh = torch_steps(model_from(first, dict(config, activation_function="gelu_new")),
                           stream)
        far = max(abs(steps[i + 1]["loss"] - t[0]) / abs(t[0]) for i, t in enumerate(tanh))
        apart = ", losses %.1e from the tanh GELU's" % far
        if far < 5e-6:
            bad.append("megaw's losses are within %.1e of the tanh GELU's" % far)
    last = hf_ckpt_check.read_hf_model(os.path.join(save, "iter_%07d" % ITERS))
    worst = 0.0
    for pname, (p, t) in model.hf_params().items():
        ref, got = (p.t() if t else p).detach().numpy(), last[pname].astype(np.float64)
        # relative to the tensor's largest element: a key bias's gradient is
        # rounding noise (the softmax does not see it), which Adam scales up
        # to whole steps in both; GPT-2's (c_attn.bias's middle third) is
        # left out, or with larger weights it outgrows the others
        if pname.endswith("attn.c_attn.bias"):
            C = ref.shape[0] // 3
            ref = np.concatenate([ref[:C], ref[2 * C:]])
            got = np.concatenate([got[:C], got[2 * C:]])
        err = np.abs(got - ref).max() / np.abs(ref).max()
        worst = max(worst, err)
        if err > 3e-4:
            bad.append("%s after %d steps: relative error %.2e" % (pname, ITERS, err))
    print("%s %s: %d iterations, %d tensors, worst weight error %.1e%s%s" %
          ("FAIL" if bad else "ok  ", name, ITERS, len(model.hf_params()), worst, apart,
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
