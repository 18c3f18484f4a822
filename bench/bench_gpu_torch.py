#!/usr/bin/env python3
"""PyTorch's GPT-2 training step on one device: the baseline the GPU kit
(tests/gpu/gpu_kit.py) sets beside megaw on the same card in the same run.

    python3 bench/bench_gpu_torch.py [--compile] [--device cuda|cpu]
        [--layers 12] [--channels 768] [--heads 12] [--seq 1024] [--vocab 50304]
        [--micro-batch 8] [--global-batch 16] [--steps 20] [--warmup 5]

GPT-2 as Megatron and llm.c train it: learned positions, pre-layernorm,
tanh GELU, the output layer tied to the embedding, causal attention through
F.scaled_dot_product_attention (flash attention on a GPU), bf16 autocast on
cuda (fp32 master weights), AdamW with fused=True on cuda, gradient
accumulation over global/micro microbatches, clipping at 1.0. Prints one JSON
line: median tokens/s and step time over the steps after --warmup, peak
memory (torch.cuda.max_memory_allocated) and the parameter count.
"""
import argparse
import json
import math
import statistics
import sys
import time


def build(torch, a):
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            C = a.channels
            self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.fc, self.fc2 = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, a.heads, C // a.heads).transpose(1, 2) for t in (q, k, v))
            if hasattr(F, "scaled_dot_product_attention"):
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:  # torch < 2.0 (Debian 12's, for the CPU dry run)
                att = (q @ k.transpose(-2, -1)) / math.sqrt(k.shape[-1])
                mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
                y = att.masked_fill(~mask, float("-inf")).softmax(-1) @ v
            x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
            return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(a.vocab, a.channels)
            self.wpe = nn.Embedding(a.seq, a.channels)
            self.blocks = nn.ModuleList(Block() for _ in range(a.layers))
            self.lnf = nn.LayerNorm(a.channels)
            for p in self.parameters():
                if p.dim() == 2:
                    nn.init.normal_(p, std=0.02)

        def forward(self, idx, targets):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for b in self.blocks:
                x = b(x)
            logits = self.lnf(x) @ self.wte.weight.t()  # tied output layer
            return F.cross_entropy(logits.float().view(-1, a.vocab), targets.reshape(-1))

    return GPT()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--compile", action="store_true")
    p.add_argument("--device", default="cuda")
    for name, v in (("layers", 12), ("channels", 768), ("heads", 12), ("seq", 1024),
                    ("vocab", 50304), ("micro-batch", 8), ("global-batch", 16), ("steps", 20),
                    ("warmup", 5)):
        p.add_argument("--" + name, type=int, default=v)
    a = p.parse_args()
    import torch
    if a.device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"skipped": "torch sees no CUDA device"}))
        return 77
    torch.manual_seed(0)
    dev = torch.device(a.device)
    model = build(torch, a).to(dev)
    nparams = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() == 2]
    rest = [p for p in model.parameters() if p.dim() != 2]
    fused = {"fused": True} if a.device == "cuda" else {}  # older CPU builds lack the flag
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), **fused)
    step_fn = torch.compile(model) if a.compile else model
    accum = a.global_batch // a.micro_batch
    g = torch.Generator(device="cpu").manual_seed(1)
    data = torch.randint(0, 50257, (accum, a.micro_batch, a.seq + 1), generator=g).to(dev)
    amp = torch.autocast(device_type="cuda", dtype=torch.bfloat16) if a.device == "cuda" \
        else torch.autocast(device_type="cpu", enabled=False)
    times, losses = [], []
    t_first = time.perf_counter()
    for step in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        for m in range(accum):
            with amp:
                loss = step_fn(data[m, :, :-1], data[m, :, 1:]) / accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if a.device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item() * accum)
        if step == 0:
            first_s = time.perf_counter() - t_first
    measured = times[a.warmup:]
    step_s = statistics.median(measured)
    out = {"tokens_per_s": a.global_batch * a.seq / step_s, "step_s": step_s,
           "first_step_s": first_s, "params": nparams, "steps": len(measured),
           "loss_first": losses[0], "loss_last": losses[-1],
           "torch": torch.__version__, "compile": a.compile,
           "attention": "sdpa" if hasattr(torch.nn.functional, "scaled_dot_product_attention")
           else "explicit"}
    if a.device == "cuda":
        out["peak_bytes"] = torch.cuda.max_memory_allocated()
        out["device"] = torch.cuda.get_device_name()
    if not all(math.isfinite(x) for x in losses):
        out["error"] = "a loss is not finite"
    print(json.dumps(out))
    return 0 if "error" not in out else 1


if __name__ == "__main__":
    sys.exit(main())
