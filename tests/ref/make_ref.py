#!/usr/bin/python3
"""PyTorch reference vectors for mega's GPT (llm.c style).

Reads the tiny checkpoint the C side wrote (gpt_tiny.safetensors: the
initial weights under Hugging Face GPT-2 names, the batch as input.tokens /
input.targets, the config in __metadata__), builds the same GPT-2 from
torch.nn modules in float64, and writes the vectors the C test compares
against (gpt_tiny_ref.safetensors).

Run with Debian's torch:  /usr/bin/python3 tests/ref/make_ref.py
  --ckpt PATH   checkpoint to read (default: next to this script)
  --out PATH    vectors to write (default: next to this script)
  --check PATH  instead of keeping --out, compare it with PATH and exit 1
                on a difference (used by the torch_tests meson option)

Each set of vectors is one function returning {name: array}; add a set by
writing a function and listing it in VECTOR_SETS.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))


# ---- safetensors, by hand (python3-safetensors is not in Debian) ----------

def read_safetensors(path):
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = buf[8 + n:]
    tensors = {}
    for name, e in header.items():
        assert e["dtype"] == "F32", f"{path}: {name}: dtype {e['dtype']}"
        b, end = e["data_offsets"]
        tensors[name] = np.frombuffer(data[b:end], dtype="<f4").reshape(e["shape"]).copy()
    return tensors, meta


def write_safetensors(path, tensors, meta=None):
    header, offset, blobs = {}, 0, []
    if meta:
        header["__metadata__"] = {k: str(v) for k, v in meta.items()}
    for name, arr in tensors.items():
        a = np.ascontiguousarray(np.asarray(arr, dtype="<f4"))
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        blobs.append(a.tobytes())
        offset += a.nbytes
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    os.replace(path + ".tmp", path)


# ---- GPT-2 in torch.nn ------------------------------------------------------

class Block(nn.Module):
    def __init__(self, C, nh, eps):
        super().__init__()
        self.nh = nh
        self.ln_1 = nn.LayerNorm(C, eps=eps)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=eps)
        self.c_fc = nn.Linear(C, 4 * C)
        self.gelu = nn.GELU(approximate="tanh")
        self.mlp_proj = nn.Linear(4 * C, C)

    def attn(self, x):
        B, T, C = x.shape
        hs = C // self.nh
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.nh, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp_proj(self.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, eps = cfg["channels"], cfg["ln_eps"]
        self.wte = nn.Embedding(cfg["vocab_size"], C)
        self.wpe = nn.Embedding(cfg["max_seq_len"], C)
        self.h = nn.ModuleList(Block(C, cfg["num_heads"], eps) for _ in range(cfg["num_layers"]))
        self.ln_f = nn.LayerNorm(C, eps=eps)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # head tied to wte

    # Hugging Face name -> (module parameter, transposed?). Conv1D stores
    # [in, out]; nn.Linear stores [out, in].
    def hf_params(self):
        out = {"transformer.wte.weight": (self.wte.weight, False),
               "transformer.wpe.weight": (self.wpe.weight, False)}
        for i, b in enumerate(self.h):
            p = f"transformer.h.{i}."
            out.update({
                p + "ln_1.weight": (b.ln_1.weight, False), p + "ln_1.bias": (b.ln_1.bias, False),
                p + "attn.c_attn.weight": (b.c_attn.weight, True),
                p + "attn.c_attn.bias": (b.c_attn.bias, False),
                p + "attn.c_proj.weight": (b.c_proj.weight, True),
                p + "attn.c_proj.bias": (b.c_proj.bias, False),
                p + "ln_2.weight": (b.ln_2.weight, False), p + "ln_2.bias": (b.ln_2.bias, False),
                p + "mlp.c_fc.weight": (b.c_fc.weight, True),
                p + "mlp.c_fc.bias": (b.c_fc.bias, False),
                p + "mlp.c_proj.weight": (b.mlp_proj.weight, True),
                p + "mlp.c_proj.bias": (b.mlp_proj.bias, False),
            })
        out["transformer.ln_f.weight"] = (self.ln_f.weight, False)
        out["transformer.ln_f.bias"] = (self.ln_f.bias, False)
        return out

    def load_hf(self, tensors):
        with torch.no_grad():
            for name, (p, t) in self.hf_params().items():
                w = torch.from_numpy(tensors[name]).to(p.dtype)
                p.copy_(w.t() if t else w)


def load(ckpt):
    tensors, meta = read_safetensors(ckpt)
    cfg = {k: (float(v) if k in ("init_std", "ln_eps") else int(v)) for k, v in meta.items()
           if k in ("vocab_size", "max_seq_len", "num_layers", "num_heads", "channels",
                    "init_std", "ln_eps")}
    model = GPT(cfg).double()
    model.load_hf(tensors)
    tokens = torch.from_numpy(tensors["input.tokens"]).long()
    targets = torch.from_numpy(tensors["input.targets"]).long()
    return model, tokens, targets


# ---- vector sets --------------------------------------------------------------

def forward_backward(model, tokens, targets):
    """logits, the mean token loss over every target (tensors), and
    {name: gradient} of every param in HF layout for that mean loss. Also
    used by tests/train/vocab_parity.py on megaw's own checkpoints."""
    model.zero_grad()
    logits = model(tokens)
    loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
    loss.backward()
    grads = {name: (p.grad.t() if t else p.grad).numpy()
             for name, (p, t) in model.hf_params().items()}
    return logits, loss, grads


def vectors_forward_backward(model, tokens, targets):
    """logits [B,T,V], the mean token loss, and grad.<name> of every param
    (HF layout) for that mean loss."""
    logits, loss, grads = forward_backward(model, tokens, targets)
    out = {"logits": logits.detach().numpy(), "loss": loss.detach().numpy()}
    out.update({"grad." + name: g for name, g in grads.items()})
    return out


# ---- AdamW steps (the trainer's; tests/train/test_adamw_parity.c) ------------

# The C test uses the same values; change both together.
ADAMW = dict(steps=4, lr=1e-2, min_lr=1e-3, warmup_iters=2, decay_iters=5,
             beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, clip_grad=0.5)


def megatron_cosine_lr(it, c):
    """Megatron's OptimizerParamScheduler (cosine) for the step taken after
    `it` steps: linear warmup from 0, then cosine from lr to min_lr."""
    if c["warmup_iters"] > 0 and it <= c["warmup_iters"]:
        return c["lr"] * it / c["warmup_iters"]
    if it > c["decay_iters"]:
        return c["min_lr"]
    r = (it - c["warmup_iters"]) / (c["decay_iters"] - c["warmup_iters"])
    return c["min_lr"] + (c["lr"] - c["min_lr"]) * 0.5 * (math.cos(math.pi * r) + 1.0)


def vectors_adamw_steps(model, tokens, targets):
    """ADAMW["steps"] steps of torch.optim.AdamW on the batch, each after
    clip_grad_norm_, weight decay on the 2-D weights only, at Megatron's
    cosine schedule. adamw.loss [steps+1]: the mean token loss before each
    step and after the last; adamw.grad_norm [steps]: the norm before
    clipping; adamw.lr [steps]; adamw.param.<name>: the weights after the
    last step (HF layout)."""
    c = ADAMW
    params = model.hf_params()
    decay = [p for p, _ in params.values() if p.dim() == 2]
    no_decay = [p for p, _ in params.values() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": c["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=c["lr"], betas=(c["beta1"], c["beta2"]), eps=c["eps"])
    losses, norms, lrs = [], [], []

    def loss_fn():
        logits = model(tokens)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))

    for it in range(c["steps"]):
        lr = megatron_cosine_lr(it, c)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), c["clip_grad"])
        opt.step()
        losses.append(loss.item())
        norms.append(norm.item())
        lrs.append(lr)
    with torch.no_grad():
        losses.append(loss_fn().item())
    out = {"adamw.loss": np.array(losses), "adamw.grad_norm": np.array(norms),
           "adamw.lr": np.array(lrs)}
    for name, (p, t) in params.items():
        out["adamw.param." + name] = (p.t() if t else p).detach().numpy()
    return out


VECTOR_SETS = [vectors_forward_backward, vectors_adamw_steps]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", default=os.path.join(HERE, "gpt_tiny.safetensors"))
    ap.add_argument("--out", default=os.path.join(HERE, "gpt_tiny_ref.safetensors"))
    ap.add_argument("--check", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    vectors = {}
    for fn in VECTOR_SETS:
        model, tokens, targets = load(args.ckpt)
        vectors.update(fn(model, tokens, targets))
    write_safetensors(args.out, vectors, {"torch": torch.__version__, "dtype": "float64"})
    if args.check:
        fresh, _ = read_safetensors(args.out)
        committed, _ = read_safetensors(args.check)
        bad = sorted(set(fresh) ^ set(committed))
        for k in sorted(set(fresh) & set(committed)):
            a, b = fresh[k], committed[k]
            if a.shape != b.shape or not np.allclose(a, b, rtol=1e-5, atol=1e-7):
                bad.append(k)
        if bad:
            print("regenerated vectors differ from the committed ones:", ", ".join(bad))
            return 1
        print(f"{len(fresh)} regenerated vectors match {args.check}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
