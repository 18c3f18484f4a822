#!/usr/bin/python3
"""PyTorch reference vectors for mega's GPT-2 and Llama (llm.c style).

Reads a tiny checkpoint the C side wrote (gpt_tiny.safetensors or
llama_tiny.safetensors: the initial weights under Hugging Face names, the
batch as input.tokens / input.targets, the config in __metadata__, its
"arch" gpt2 or llama), builds the same model from torch.nn modules in
float64, and writes the vectors the C tests compare against
(gpt_tiny_ref.safetensors, llama_tiny_ref.safetensors).

The Llama here is written from Hugging Face's LlamaForCausalLM as its
modeling code defines it (RMSNorm, rotate-half RoPE on q and k, repeat_kv
for grouped-query attention, SiLU-gated MLP), independently of mega's C:
a checkpoint that loads into it and gives the same logits loads into HF's.

Run with Debian's torch:  /usr/bin/python3 tests/ref/make_ref.py [--llama]
  --llama       the Llama pair (default: the GPT-2 pair)
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


# ---- hidden dropout, mega's counter-based mask (kernels/dropout.h) restated --

M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def splitmix64(x):
    """kernels/rng.h's mega_splitmix64 over a uint64 array (wrapping)."""
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def threshold_scale(p):
    """kernels/dropout.h's threshold and float scale of probability p."""
    return min(int(p * 4294967296.0 + 0.5), 4294967295), float(np.float32(1.0 / (1.0 - p)))


class HiddenDropout:
    """drop(x [B,T,C], layer, site): x times the mask of samples first..first+B-1,
    kept elements scaled by float32(1/(1-p)); layer -1 site 0 is the
    embeddings', site 1 the attention's output, site 2 the MLP's. With
    attn_p, drop.attn(probs [B,nh,T,T], layer) is attention dropout (site 3):
    the mask of (sample, head, query, key)."""

    def __init__(self, p, seed, first_sample, attn_p=0.0):
        self.p, self.seed, self.first, self.attn_p = p, seed, first_sample, attn_p
        self.threshold, self.scale = threshold_scale(p)

    def key(self, layer, site):
        where = np.uint64((((layer + 1) & 0xFFFFFFFF) << 8) | site)
        return splitmix64(np.uint64(self.seed) ^ splitmix64(where ^ np.uint64(0x64726F706F7574)))

    def keep(self, B, T, C, layer, site):
        key = self.key(layer, site)
        samples = np.arange(self.first, self.first + B, dtype=np.uint64)[:, None]
        rows = splitmix64(splitmix64(key ^ samples) ^ np.arange(T, dtype=np.uint64)[None, :])
        bits = splitmix64(rows[:, :, None] ^ np.arange(C, dtype=np.uint64)[None, None, :])
        return (bits >> np.uint64(32)) >= np.uint64(self.threshold)

    def __call__(self, x, layer, site):
        if not self.p:
            return x
        B, T, C = x.shape
        mask = torch.from_numpy(self.keep(B, T, C, layer, site)).to(x.dtype)
        return x * mask * self.scale

    def attn(self, att, layer):
        if not self.attn_p:
            return att
        B, nh, T, _ = att.shape
        threshold, scale = threshold_scale(self.attn_p)
        key = self.key(layer, 3)
        samples = np.arange(self.first, self.first + B, dtype=np.uint64)[:, None, None]
        heads = np.arange(nh, dtype=np.uint64)[None, :, None]
        t = np.arange(T, dtype=np.uint64)
        rows = splitmix64(splitmix64(splitmix64(key ^ samples) ^ heads) ^ t[None, None, :])
        bits = splitmix64(rows[..., None] ^ t[None, None, None, :]) >> np.uint64(32)
        mask = torch.from_numpy(bits >= np.uint64(threshold)).to(att.dtype)
        return att * mask * scale


# ---- GPT-2 in torch.nn ------------------------------------------------------

class Block(nn.Module):
    def __init__(self, C, nh, eps, gelu="tanh"):
        super().__init__()
        self.nh = nh
        self.ln_1 = nn.LayerNorm(C, eps=eps)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=eps)
        self.c_fc = nn.Linear(C, 4 * C)
        self.gelu = nn.GELU(approximate=gelu)  # "tanh" (gelu_new), or "none": erf
        self.mlp_proj = nn.Linear(4 * C, C)

    def attn(self, x, drop=None, layer=0):
        B, T, C = x.shape
        hs = C // self.nh
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.nh, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        if drop:  # attention dropout, after the softmax, before v
            att = drop.attn(att, layer)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)

    def forward(self, x, drop=None, layer=0):
        hidden = drop or (lambda v, layer, site: v)
        x = x + hidden(self.attn(self.ln_1(x), drop, layer), layer, 1)
        return x + hidden(self.mlp_proj(self.gelu(self.c_fc(self.ln_2(x)))), layer, 2)


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, eps = cfg["channels"], cfg["ln_eps"]
        self.wte = nn.Embedding(cfg["vocab_size"], C)
        self.wpe = nn.Embedding(cfg["max_seq_len"], C)
        gelu = cfg.get("gelu", "tanh")
        self.h = nn.ModuleList(Block(C, cfg["num_heads"], eps, gelu)
                               for _ in range(cfg["num_layers"]))
        self.ln_f = nn.LayerNorm(C, eps=eps)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        drop = getattr(self, "drop", None)  # hidden dropout: a HiddenDropout, or None
        if drop:
            x = drop(x, -1, 0)
        for i, block in enumerate(self.h):
            x = block(x, drop, i)
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


# ---- Llama in torch.nn, after Hugging Face's modeling_llama ------------------

class RMSNorm(nn.Module):
    def __init__(self, C, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(C))
        self.eps = eps

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin(T, rot, theta):
    """HF's default rotary embedding over the first rot channels of a head."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x, cos, sin):
    """x [B, H, T, hd]: rotate its first cos.shape[-1] channels (HF's
    partial rotary, as GPT-NeoX and Phi apply partial_rotary_factor)."""
    rot = cos.shape[-1]
    xr, xp = x[..., :rot], x[..., rot:]
    return torch.cat((xr * cos + rotate_half(xr) * sin, xp), dim=-1)


class LlamaBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, nh, g, hd, F = (cfg["channels"], cfg["num_heads"], cfg["num_kv_heads"],
                           cfg["head_dim"], cfg["ffn_hidden"])
        bias = not cfg["no_bias"]
        self.nh, self.g, self.hd = nh, g, hd
        self.rot = int(hd * cfg["rotary_percent"])
        self.theta = cfg["rope_theta"]
        self.input_layernorm = RMSNorm(C, cfg["ln_eps"])
        self.q_proj = nn.Linear(C, nh * hd, bias=bias)
        self.k_proj = nn.Linear(C, g * hd, bias=bias)
        self.v_proj = nn.Linear(C, g * hd, bias=bias)
        self.o_proj = nn.Linear(nh * hd, C, bias=bias)
        self.post_attention_layernorm = RMSNorm(C, cfg["ln_eps"])
        self.gate_proj = nn.Linear(C, F, bias=bias)
        self.up_proj = nn.Linear(C, F, bias=bias)
        self.down_proj = nn.Linear(F, C, bias=bias)

    def attn(self, x):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.g, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.g, self.hd).transpose(1, 2)
        cos, sin = rope_cos_sin(T, self.rot, self.theta)
        q, k = apply_rope(q, cos.to(q.dtype), sin.to(q.dtype)), apply_rope(k, cos.to(k.dtype),
                                                                           sin.to(k.dtype))
        rep = self.nh // self.g  # HF's repeat_kv: query head h reads group h // rep
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.hd)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, self.nh * self.hd)
        return self.o_proj(y)

    def forward(self, x):
        x = x + self.attn(self.input_layernorm(x))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["channels"])
        self.layers = nn.ModuleList(LlamaBlock(cfg) for _ in range(cfg["num_layers"]))
        self.norm = RMSNorm(cfg["channels"], cfg["ln_eps"])
        self.lm_head = (nn.Linear(cfg["channels"], cfg["vocab_size"], bias=False)
                        if cfg["untied"] else None)

    def forward(self, idx):
        x = self.embed_tokens(idx)
        for block in self.layers:
            x = block(x)
        head = self.lm_head.weight if self.lm_head is not None else self.embed_tokens.weight
        return F.linear(self.norm(x), head)

    # Hugging Face name -> (module parameter, transposed?): nn.Linear is
    # HF's layout, so nothing is transposed.
    def hf_params(self):
        out = {"model.embed_tokens.weight": (self.embed_tokens.weight, False)}
        for i, b in enumerate(self.layers):
            p = f"model.layers.{i}."
            mods = {"input_layernorm": b.input_layernorm, "self_attn.q_proj": b.q_proj,
                    "self_attn.k_proj": b.k_proj, "self_attn.v_proj": b.v_proj,
                    "self_attn.o_proj": b.o_proj,
                    "post_attention_layernorm": b.post_attention_layernorm,
                    "mlp.gate_proj": b.gate_proj, "mlp.up_proj": b.up_proj,
                    "mlp.down_proj": b.down_proj}
            for name, m in mods.items():
                out[p + name + ".weight"] = (m.weight, False)
                if getattr(m, "bias", None) is not None:
                    out[p + name + ".bias"] = (m.bias, False)
        out["model.norm.weight"] = (self.norm.weight, False)
        if self.lm_head is not None:
            out["lm_head.weight"] = (self.lm_head.weight, False)
        return out

    load_hf = GPT.load_hf


def model_from_config(cfg):
    """The torch model of a config dict (make_config's keys)."""
    return (Llama(cfg) if cfg.get("arch") == "llama" else GPT(cfg)).double()


def make_config(meta):
    """The model config from a checkpoint's __metadata__ (strings)."""
    floats = ("init_std", "ln_eps", "rope_theta", "rotary_percent")
    ints = ("vocab_size", "max_seq_len", "num_layers", "num_heads", "channels", "num_kv_heads",
            "head_dim", "ffn_hidden")
    cfg = {k: float(v) for k, v in meta.items() if k in floats}
    cfg.update({k: int(v) for k, v in meta.items() if k in ints})
    cfg.update({k: meta[k] == "1" for k in ("untied", "no_bias") if k in meta})
    cfg["arch"] = meta.get("arch", "gpt2")
    return cfg


def load(ckpt):
    tensors, meta = read_safetensors(ckpt)
    model = model_from_config(make_config(meta))
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
    ap.add_argument("--llama", action="store_true")
    ap.add_argument("--ckpt", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--check", default=None)
    args = ap.parse_args()
    pair = "llama_tiny" if args.llama else "gpt_tiny"
    args.ckpt = args.ckpt or os.path.join(HERE, pair + ".safetensors")
    args.out = args.out or os.path.join(HERE, pair + "_ref.safetensors")
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
