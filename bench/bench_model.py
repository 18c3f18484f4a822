#!/usr/bin/python3
"""mega's cpu GPT-2 and Llama next to Debian's PyTorch on the same model and
machine.

    /usr/bin/python3 bench/bench_model.py BUILD/bench/bench_model \
        [--threads 1,2] [--rounds 3] [--steps 6] [--vocab 256,50304]
        [--arch gpt2,llama] [--channels C] [--layers L] [--seq T] [--batch B]

For each architecture and thread count it runs the C benchmark and the same
training step in PyTorch (forward, backward, AdamW; GPT-2 or Llama from
tests/ref/make_ref.py, C=256, 4 layers, 4 heads, T=256, B=8; the Llama of
the same width and depth has 2 query groups, SwiGLU of int(8C/3 / 64) x 64,
RoPE, RMSNorm, an untied head and no biases) alternately, --rounds times
each, every run in
its own process with OPENBLAS_NUM_THREADS / OMP_NUM_THREADS (and, with
--coretype, OPENBLAS_CORETYPE) set, and prints min, median and max tokens/s
of each and the ratios. PyTorch runs its AdamW with and without foreach and,
above one thread, with libgomp's default and passive waiting (its spinning
threads fight OpenBLAS's on shared cores); its fastest variant is the
baseline. Both sides use the same OpenBLAS for their GEMMs. --vocab runs
the whole comparison once per vocabulary size (GPT-2's 50,257 is 50,304
padded as Megatron pads it) and prints how much slower the larger ones are
than the first. It never fails on a time.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
C, L, NH, T, B, V = 256, 4, 4, 256, 8, 256
LLAMA = False


def shape_args():
    return ["--channels", str(C), "--layers", str(L), "--seq", str(T), "--batch", str(B),
            "--vocab", str(V)] + (["--llama"] if LLAMA else [])


def torch_model():
    """The model bench_model builds, in torch.nn (tests/ref/make_ref.py)."""
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "ref"))
    import make_ref
    if not LLAMA:
        return make_ref.GPT({"vocab_size": V, "max_seq_len": T, "num_layers": L,
                             "num_heads": NH, "channels": C, "ln_eps": 1e-5})
    return make_ref.Llama({"vocab_size": V, "max_seq_len": T, "num_layers": L,
                           "num_heads": NH, "num_kv_heads": max(NH // 2, 1), "channels": C,
                           "head_dim": C // NH, "ffn_hidden": int(4 * C * 2 / 3 / 64) * 64,
                           "ln_eps": 1e-5, "rope_theta": 10000.0, "rotary_percent": 1.0,
                           "untied": True, "no_bias": True})


def torch_run(threads, steps, warmup, foreach):
    """One PyTorch measurement (in this process): tokens/s per step."""
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = torch_model()
    decay = [p for p in model.parameters() if p.dim() == 2]
    rest = [p for p in model.parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8, foreach=foreach)
    data = torch.randint(0, V, (B, T + 1))
    x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()
    rates = []
    for it in range(warmup + steps):
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, V), y.view(-1))
        loss.backward()
        opt.step()
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        if it >= warmup:
            rates.append((B * T / dt, B * T / dc))
    return rates


CORETYPE = None


def env_for(threads, omp_passive=False):
    env = dict(os.environ)
    if CORETYPE == "":
        env.pop("OPENBLAS_CORETYPE", None)
    elif CORETYPE:
        env["OPENBLAS_CORETYPE"] = CORETYPE
    env["OPENBLAS_NUM_THREADS"] = str(threads)
    env["OMP_NUM_THREADS"] = str(threads)
    if omp_passive:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    return env


def run_c(binary, threads, steps):
    out = subprocess.run([binary, "--threads", str(threads), "--steps", str(steps)] + shape_args(),
                         env=env_for(threads), capture_output=True, text=True, check=True)
    return [(float(l.split()[-1]), float(l.split()[-3])) for l in out.stdout.splitlines()
            if l.startswith("step ")]


def run_torch(threads, steps, foreach, omp_passive):
    out = subprocess.run([sys.executable, __file__, "--torch-child", str(threads), str(steps),
                          "1" if foreach else "0"] + shape_args(),
                         env=env_for(threads, omp_passive), capture_output=True, text=True,
                         check=True)
    return [tuple(float(x) for x in v.split(",")) for v in out.stdout.split()]


def run_shape(args, core):
    """The comparison at the current shapes; {threads: (mega, torch) wall medians, then
    (mega, torch) CPU-time medians}."""
    import torch
    result = {}
    print(f"# model {'llama' if LLAMA else 'gpt2'} C={C} layers={L} heads={NH} T={T} B={B} "
          f"V={V}; torch {torch.__version__}; "
          f"{args.rounds} rounds x {args.steps} steps per run; tokens/s of "
          f"forward+backward+AdamW; OPENBLAS_CORETYPE={core}")
    med = lambda runs, k: statistics.median(r[k] for r in runs)
    for threads in (int(t) for t in args.threads.split(",")):
        # PyTorch's variants: AdamW with and without foreach, and with more than
        # one thread libgomp's default (spinning) and passive waiting; the
        # fastest by median is the baseline.
        variants = [(f, p) for f in (False, True) for p in ((False, True) if threads > 1
                                                             else (False,))]
        c, tv = [], {v: [] for v in variants}
        for _ in range(args.rounds):
            c += run_c(args.binary, threads, args.steps)
            for v in variants:
                tv[v] += run_torch(threads, args.steps, *v)
        name = lambda v: ("foreach" if v[0] else "for-loop") + (
            ", OMP_WAIT_POLICY=PASSIVE" if v[1] else "")
        best = max(variants, key=lambda v: med(tv[v], 0))
        tb = tv[best]
        mc, mt = med(c, 0), med(tb, 0)
        others = ", ".join(f"{name(v)} {med(tv[v], 0):.0f}" for v in variants if v != best)
        print(f"threads={threads} wall tokens/s: mega min {min(r[0] for r in c):.0f} "
              f"median {mc:.0f} max {max(r[0] for r in c):.0f} | torch ({name(best)}) min "
              f"{min(r[0] for r in tb):.0f} median {mt:.0f} max {max(r[0] for r in tb):.0f} "
              f"[other torch medians: {others}] | ratio of medians {mc / mt:.2f}x, "
              f"of maxima {max(r[0] for r in c) / max(r[0] for r in tb):.2f}x")
        if threads == 1:
            cc, ct = med(c, 1), med(tb, 1)
            print(f"threads=1 CPU-time tokens/s (immune to time taken by other processes): "
                  f"mega median {cc:.0f} | torch median {ct:.0f} | ratio {cc / ct:.2f}x")
        result[threads] = (mc, mt, med(c, 1), med(tb, 1))
    return result


def main():
    global C, L, T, B, V, LLAMA
    if len(sys.argv) in (15, 16) and sys.argv[1] == "--torch-child":
        C, L, T, B, V = (int(sys.argv[k]) for k in (6, 8, 10, 12, 14))
        LLAMA = sys.argv[-1] == "--llama"
        rates = torch_run(int(sys.argv[2]), int(sys.argv[3]), 2, sys.argv[4] == "1")
        print(" ".join(f"{w:.1f},{c:.1f}" for w, c in rates))
        return 0
    ap = argparse.ArgumentParser()
    ap.add_argument("binary", help="path to the built bench_model")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--coretype", default=None,
                    help="OPENBLAS_CORETYPE for both sides (default: the environment's; "
                         "'' for OpenBLAS's own detection)")
    ap.add_argument("--vocab", default=str(V), help="vocabulary sizes to compare, e.g. 256,50304")
    ap.add_argument("--arch", default="gpt2", help="architectures to compare, e.g. gpt2,llama")
    ap.add_argument("--channels", type=int, default=C)
    ap.add_argument("--layers", type=int, default=L)
    ap.add_argument("--seq", type=int, default=T)
    ap.add_argument("--batch", type=int, default=B)
    args = ap.parse_args()
    C, L, T, B = args.channels, args.layers, args.seq, args.batch
    global CORETYPE
    CORETYPE = args.coretype
    import torch
    core = (os.environ.get("OPENBLAS_CORETYPE", "(unset)") if args.coretype is None
            else args.coretype or "(unset)")
    first_v, first = None, {}
    for arch in args.arch.split(","):
        LLAMA = arch == "llama"
        for V in (int(v) for v in args.vocab.split(",")):
            for threads, r in run_shape(args, core).items():
                if first_v is None or threads not in first:
                    first[threads] = r
                    continue
                r0 = first[threads]
                print(f"threads={threads} {arch} V={V} against the first ({first_v}), its "
                      f"tokens/s over the first's: wall mega {r[0] / r0[0]:.2f}x, torch "
                      f"{r[1] / r0[1]:.2f}x; CPU-time mega {r[2] / r0[2]:.2f}x, torch "
                      f"{r[3] / r0[3]:.2f}x")
            first_v = first_v or f"{arch} V={V}"
    return 0


if __name__ == "__main__":
    sys.exit(main())
