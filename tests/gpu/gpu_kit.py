#!/usr/bin/env python3
"""The device kit: what scripts/gpu-check's bundle runs on a GPU machine, in
one command and well inside its 10 minutes (see ../shared/notes/device.md).

    python3 KIT/tests/gpu/gpu_kit.py --bundle KIT [--out DIR] [--budget S] [--dry-run]

  libs     every library megaw, the module and the test programs need
           resolves inside the bundle, the CUDA pip packages, or the base
           system (glibc, libstdc++); nothing is missing
  suite    suite 'gpu': test_cuda_backend (every op against the cpu
           backend, fp32 and bf16), test_nccl, cuda_training.py; where
           cuDNN's attention fails its checks, the later steps run the
           flash kernels instead (MEGA_CUDNN_ATTENTION=off) and say so
  curves   a small GPT trained 50 steps on cuda and on cpu from the same
           checkpoint: fp32 within 1e-4 relative, bf16 within 1e-2
  bench    GPT-2 124M (12 x 768, 12 heads, T 1024, vocabulary 50,257 padded
           to 50,304) on one GPU: megaw fp32 and --bf16 (attention through
           cuDNN; again with the flash kernels), and PyTorch on the
           same card (bf16 autocast, SDPA, fused AdamW), eager and compiled:
           tokens/s, MFU against the card's bf16 dense peak, peak memory
  profile  where megaw's time goes: ncu's kernel times over one --bf16
           iteration of GPT-2 124M (one micro batch), grouped by kernel;
           again as run (no cache flushes, free clocks) beside the bench's
           time per micro batch: what is left is the GPU waiting
  detail   (only when asked: --only ...,detail) what bounds the kernels that
           --detail matches: ncu's throughput, occupancy and stall reasons
  sanitize compute-sanitizer memcheck and racecheck on test_cuda_backend,
           memcheck on a small megaw --backend cuda run (fp32 and --bf16)

--dry-run runs the same steps on this machine's CPU with a tiny model (the
curves compare cpu with cpu): it proves the bundle runs from anywhere with
only its own libraries. Each step has a timeout, and a step that cannot
finish inside --budget is skipped and says so. Full logs go to DIR/logs
(DIR/gpu-check-logs.tar.gz with --out); a short table is printed last and
written to DIR/summary.txt and summary.json.
"""
import argparse
import glob
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tarfile
import tempfile
import threading
import time

# bf16 dense tensor-core peaks (TFLOPS, without sparsity) from NVIDIA's data
# sheets; MFU is quoted against these, as Megatron and llm.c do.
PEAKS = [("H200", 989.4), ("H100 NVL", 835.0), ("H100 PCIe", 756.0), ("H100", 989.4),
         ("A100", 312.0), ("L40S", 362.0)]
# glibc and the C++ runtime come from the machine (the GPU image's are newer
# and backward compatible); cuBLAS, cuBLASLt, cuDNN and NCCL from its pip packages.
SYSTEM_LIBS = ("libc.so", "libm.so", "libdl.so", "libpthread.so", "librt.so", "ld-linux",
               "libstdc++.so", "libgcc_s.so", "linux-vdso")
CUDA_PIP_LIBS = ("libcublas.so", "libcublasLt.so", "libnccl.so", "libcudnn")


class Kit:
    def __init__(self, a):
        self.a = a
        self.bundle = os.path.abspath(a.bundle)
        self.bin = os.path.join(self.bundle, "bin")
        self.work = tempfile.mkdtemp(prefix="gpu-kit-")
        self.out = os.path.abspath(a.out) if a.out else tempfile.mkdtemp(prefix="gpu-check-")
        self.logs = os.path.join(self.out, "logs")
        os.makedirs(self.logs, exist_ok=True)
        self.deadline = time.time() + a.budget
        self.rows = []  # (step, what, verdict, detail)
        self.facts = {}
        self.env = dict(os.environ)
        self.env["LD_LIBRARY_PATH"] = ":".join([os.path.join(self.bundle, "lib")] +
                                               ([] if a.dry_run else pip_cuda_dirs()))
        self.env["MEGA_CUDA_MODULE"] = os.path.join(self.bin, "libmega_cuda.so")
        self.backend = "cpu" if a.dry_run else "cuda"

    def row(self, step, what, verdict, detail=""):
        self.rows.append((step, what, verdict, detail))
        print("%-7s %-34s %-7s %s" % (step, what, verdict, detail), flush=True)

    def left(self):
        return self.deadline - time.time()

    def run(self, name, cmd, timeout, env=None, cwd=None):
        """(rc, stdout, stderr, seconds); rc None when it timed out or there
        was no time left for it. Both streams go to logs/NAME.log."""
        timeout = min(timeout, self.left())
        if timeout < 5:
            return None, "", "no time left in the budget", 0.0
        t0 = time.time()
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               timeout=timeout, env=env or self.env, cwd=cwd or self.work)
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            rc, out, err = None, dec(e.stdout), dec(e.stderr) + "\ntimed out after %ds" % timeout
        except OSError as e:
            rc, out, err = 127, "", "cannot run %s: %s" % (cmd[0], e)
        secs = time.time() - t0
        with open(os.path.join(self.logs, name + ".log"), "w") as f:
            f.write("$ %s\n# rc %s, %.1f s\n%s\n--- stderr\n%s" % (" ".join(cmd), rc, secs, out,
                                                                  err))
        return rc, out, err, secs


def dec(b):
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def pip_cuda_dirs():
    """The lib folders of the nvidia-* pip packages beside this Python (the
    GPU machine's torch venv ships cuBLAS, cuDNN and NCCL there)."""
    dirs = []
    for sp in sys.path:
        dirs += sorted(glob.glob(os.path.join(sp, "nvidia", "*", "lib")))
    return list(dict.fromkeys(d for d in dirs if os.path.isdir(d)))


def tail(text, n=300):
    text = " ".join(text.split())
    return text[-n:]


def head(text, n=100):
    text = " ".join(text.split())
    return text[:n]


def step_facts(k):
    k.facts["python"] = sys.version.split()[0]
    k.facts["bundle"] = k.bundle
    try:  # the commit scripts/gpu-check built from ("-dirty": with changes not committed)
        with open(os.path.join(k.bundle, "SOURCE")) as f:
            k.facts["source"] = f.read().strip()
    except OSError:
        k.facts["source"] = "unknown (no SOURCE in the bundle)"
    if shutil.which("nvidia-smi") and not k.a.dry_run:
        rc, out, _, _ = k.run("nvidia-smi", ["nvidia-smi", "--query-gpu=name,driver_version,"
                                             "memory.total,clocks.max.sm", "--format=csv,noheader"],
                              30)
        if rc == 0 and out.strip():
            name, drv, mem, clk = [s.strip() for s in out.strip().splitlines()[0].split(",")]
            k.facts.update(card=name, driver=drv, memory=mem, max_sm_clock=clk)
    rc, out, err, _ = k.run("megaw-version", [os.path.join(k.bin, "megaw"), "--version"], 30)
    k.facts["megaw"] = "; ".join((out or err).strip().splitlines())  # and its libraries
    peak = next((tf for key, tf in PEAKS if key in k.facts.get("card", "")), None)
    k.facts["bf16_peak_tflops"] = peak
    print("facts:", json.dumps(k.facts), flush=True)


def step_libs(k):
    """ldd under the kit's LD_LIBRARY_PATH: every library found, and found
    where it should be (a bundle library shadowed by the system's means the
    bundle is incomplete)."""
    bad = []
    if not shutil.which("ldd"):
        k.row("libs", "every library resolves", "skipped", "no ldd on this machine")
        return True
    for prog in sorted(os.listdir(k.bin)):
        path = os.path.join(k.bin, prog)
        rc, out, err, _ = k.run("ldd-" + prog, ["ldd", path], 30)
        for line in out.splitlines():
            name = line.strip().split(" ")[0]
            where = line.split("=>")[1].strip() if "=>" in line else ""
            if "not found" in where:
                bad.append("%s: %s not found" % (prog, name))
            elif name.startswith(SYSTEM_LIBS) or not where:
                continue
            elif name.startswith(CUDA_PIP_LIBS) or name.startswith("libcudart"):
                continue
            elif not where.startswith(k.bundle + "/"):
                bad.append("%s: %s from %s, not the bundle" % (prog, name, where.split(" ")[0]))
    k.row("libs", "every library resolves", "FAIL" if bad else "ok", "; ".join(bad[:4]))
    return not bad


def verdict(rc):
    return {0: "ok", 77: "skipped", None: "timeout"}.get(rc, "FAIL")


def step_suite(k):
    py = sys.executable
    gpu_tests = os.path.join(k.bundle, "tests", "gpu")
    progs = [("test_cuda_backend", [os.path.join(k.bin, "test_cuda_backend")], 150),
             ("test_nccl", [os.path.join(k.bin, "test_nccl")], 45)]
    for mode in ("single", "bf16", "pp2", "dp2", "llama", "llama-tp2", "dropout",
                 "dropout-bf16"):
        progs.append(("cuda_training_" + mode, [py, os.path.join(gpu_tests, "cuda_training.py"),
                                                os.path.join(k.bin, "megaw"), mode], 120))
    for name, cmd, timeout in progs:
        rc, out, err, secs = k.run(name, cmd, timeout)
        v = verdict(rc)
        lines = (out + "\n" + err).strip().splitlines()
        fails = [ln for ln in lines if ln.startswith("FAIL")]
        if v == "skipped":
            detail = head(next((ln for ln in lines if ln.startswith("skipped")), ""), 100)
        elif v == "ok":
            n = sum(1 for ln in lines if ln.startswith("ok ") or " iteration " in ln)
            detail = "%d checks, %.0f s" % (n, secs)
        else:
            detail = tail("; ".join(fails[:3]) or (lines[-1] if lines else err), 160)
        k.row("suite", name, v, detail)
        if name == "test_cuda_backend" and v != "skipped":
            cudnn_verdict(k, lines, v)


def cudnn_verdict(k, lines, v):
    """When cuDNN's attention failed test_cuda_backend's checks (or the
    program died inside them), the later steps run the flash kernels
    (MEGA_CUDNN_ATTENTION=off) so that one run still measures the rest; the
    table says so."""
    start, done = "# cuDNN attention cases", "# cuDNN attention cases done"
    started = start in lines  # test_cuda_backend's markers
    # only lines inside them: other checks' reasons may name cuDNN too
    # (attention dropout's refusal says it draws no mask, as flash does not)
    first = lines.index(start) + 1 if started else len(lines)
    last = lines.index(done, first) if done in lines[first:] else len(lines)
    bad = [ln for ln in lines[first:last] if ln.startswith("FAIL") and "cuDNN" in ln]
    died = v != "ok" and started and done not in lines
    if bad or died:
        k.env["MEGA_CUDNN_ATTENTION"] = "off"
        k.row("suite", "cuDNN attention off from here", "note",
              tail(bad[0] if bad else "test_cuda_backend died in its cuDNN cases", 150))


# --- loss curves ------------------------------------------------------------

# heads of 64 at T 128: --bf16 runs cuDNN's attention (or the flash kernels)
CURVE_MODEL = ["--num-layers", "4", "--hidden-size", "128", "--num-attention-heads", "2",
               "--seq-length", "128", "--micro-batch-size", "4", "--global-batch-size", "8",
               "--lr", "1e-3", "--lr-warmup-iters", "5", "--clip-grad", "1.0", "--seed", "11"]
CURVE_ITERS = 50  # 10 in the dry run: there it proves the bundle runs, in the default suite


def write_text(path, words=40000):
    vocab = ("pipeline bubble microbatch stage rank gradient schedule warmup steady cooldown "
             "activation tensor layer embedding loss attention norm").split()
    out, s = [], 2024
    for _ in range(words):
        s = (s * 1103515245 + 12345) % (1 << 31)
        out.append(vocab[s % len(vocab)])
    with open(path, "w") as f:
        f.write(" ".join(out))


def json_losses(out):
    got = {}
    for line in out.splitlines():
        if line.startswith("{"):
            j = json.loads(line)
            if "loss" in j:
                got[j["iteration"]] = j["loss"]
    return got


def step_curves(k):
    megaw = os.path.join(k.bin, "megaw")
    data = os.path.join(k.work, "curve.txt")
    write_text(data)
    init = os.path.join(k.work, "curve-init")
    base = CURVE_MODEL + ["--data-path", data, "--json"]
    # one cpu step makes the checkpoint both sides start from (--finetune:
    # its weights, fresh optimizer state and iteration 0)
    first = [x if x != "5" else "0" for x in base]  # no warmup in a 1-step run
    rc, out, err, _ = k.run("curve-init", [megaw] + first + ["--train-iters", "1", "--backend",
                                                              "cpu", "--save", init], 120)
    if rc != 0:
        k.row("curves", "initial checkpoint", verdict(rc), tail(err, 160))
        return
    iters = 10 if k.a.dry_run else CURVE_ITERS
    for prec, rtol in (("fp32", 1e-4), ("bf16", 1e-2)):
        args = base + ["--train-iters", str(iters), "--load", init, "--finetune"]
        args += ["--bf16"] if prec == "bf16" else []
        runs = {}
        for be in (k.backend, "cpu"):
            rc, out, err, secs = k.run("curve-%s-%s" % (prec, be), [megaw] + args +
                                       ["--backend", be], 90)
            runs[be] = (rc, json_losses(out), err, secs)
        what = "%d steps %s, %s vs cpu" % (iters, prec, k.backend)
        bad = [(be, r) for be, r in runs.items() if r[0] != 0 or len(r[1]) != iters]
        if bad:
            be, r = bad[0]
            k.row("curves", what, verdict(r[0]) if r[0] != 0 else "FAIL",
                  "%s: %s" % (be, tail(r[2], 160)))
            continue
        a, b = runs[k.backend][1], runs["cpu"][1]
        rel = max(abs(a[i] - b[i]) / abs(b[i]) for i in b)
        worst = max(b, key=lambda i: abs(a[i] - b[i]) / abs(b[i]))
        k.row("curves", what, "ok" if rel <= rtol else "FAIL",
              "max rel %.2e (tol %.0e) at it %d; loss %.4f -> %.4f" %
              (rel, rtol, worst, b[1], b[iters]))


# --- GPT-2 124M --------------------------------------------------------------

GPT2 = dict(layers=12, channels=768, heads=12, seq=1024, vocab=50257, mbs=8, gbs=16, iters=10)
TINY = dict(layers=2, channels=64, heads=4, seq=64, vocab=50257, mbs=2, gbs=4, iters=4)


def write_tokens(prefix, n_tokens, vocab):
    """A Megatron MMIDIDX dataset of uniform random uint16 token ids, in
    documents of 4,096 tokens (ids below vocab; the end-of-document id is
    vocab)."""
    import array
    doc, s = 4096, 7
    ndocs = (n_tokens + doc - 1) // doc
    toks = array.array("H")
    for _ in range(ndocs * doc):
        s = (s * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        toks.append((s >> 33) % vocab)
    with open(prefix + ".bin", "wb") as f:
        toks.tofile(f)
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, ndocs, ndocs + 1))
        f.write(struct.pack("<%di" % ndocs, *([doc] * ndocs)))
        f.write(struct.pack("<%dq" % ndocs, *[i * doc * 2 for i in range(ndocs)]))
        f.write(struct.pack("<%dq" % (ndocs + 1), *range(ndocs + 1)))


def flops_per_token(m, padded_vocab):
    """llm.c's and the README's count: 6N for the weights' forward and
    backward plus 12 L T C for attention's two products."""
    C, L, T = m["channels"], m["layers"], m["seq"]
    n = padded_vocab * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
    return 6 * n + 12 * L * T * C, n


class MemSampler:
    """Peak device memory of one process tree, sampled from nvidia-smi every
    0.2 s (megaw has no allocator statistics of its own yet)."""

    def __init__(self, enabled):
        self.peak, self.stop, self.t = 0, threading.Event(), None
        if enabled and shutil.which("nvidia-smi"):
            self.t = threading.Thread(target=self.loop, daemon=True)
            self.t.start()

    def loop(self):
        while not self.stop.wait(0.2):
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used",
                                      "--format=csv,noheader,nounits"], capture_output=True,
                                     text=True, timeout=5).stdout
                self.peak = max(self.peak, int(out.split()[0]) * 2**20)
            except (subprocess.SubprocessError, ValueError, IndexError):
                pass

    def done(self):
        self.stop.set()
        if self.t:
            self.t.join()
        return self.peak or None


def mfu(k, tokens_per_s, fpt):
    peak = k.facts.get("bf16_peak_tflops")
    return tokens_per_s * fpt / (peak * 1e12) if peak and tokens_per_s else None


def bench_row(k, what, tps, fpt, mem, extra=""):
    m = mfu(k, tps, fpt)
    k.row("bench", what, "ok", "%9.0f tok/s | MFU %s | peak mem %s%s" %
          (tps, "%.1f%%" % (100 * m) if m is not None else "n/a",
           "%.1f GiB" % (mem / 2**30) if mem else "n/a", extra))
    k.facts.setdefault("bench", {})[what] = {"tokens_per_s": tps, "mfu": m, "peak_bytes": mem}


def gpt2_args(k, m, iters, mbs, gbs, prefix):
    args = ["--num-layers", m["layers"], "--hidden-size", m["channels"], "--num-attention-heads",
            m["heads"], "--seq-length", m["seq"], "--micro-batch-size", mbs,
            "--global-batch-size", gbs, "--train-iters", iters, "--lr", "6e-4",
            "--tokenizer-type", "NullTokenizer", "--vocab-size", m["vocab"], "--data-path",
            prefix, "--backend", k.backend]
    return [str(x) for x in args]


def step_bench(k):
    m = TINY if k.a.dry_run else GPT2
    padded = (m["vocab"] + 127) // 128 * 128
    fpt, nparams = flops_per_token(m, padded)
    k.facts["bench_model"] = dict(m, padded_vocab=padded, params=nparams,
                                  flops_per_token=fpt)
    prefix = os.path.join(k.work, "tokens")
    write_tokens(prefix, (m["iters"] + 2) * m["gbs"] * (m["seq"] + 1) * 2, m["vocab"])
    args = gpt2_args(k, m, m["iters"], m["mbs"], m["gbs"], prefix) + ["--json"]
    # cuda only, the last two: the flash kernels instead of cuDNN's attention,
    # and the GELU fusion's worth (the cpu backend has neither); unfused with
    # --openai-gelu, so both runs compute the tanh form (alone, Megatron's
    # --no-bias-gelu-fusion means the erf form)
    flash = dict(k.env, MEGA_CUDNN_ATTENTION="off")
    precs = {"fp32": ([], None), "bf16": (["--bf16"], None),
             "bf16-flash": (["--bf16"], flash),
             "bf16-unfused": (["--bf16", "--no-bias-gelu-fusion", "--openai-gelu"], None)}
    for prec in ("fp32", "bf16") + (() if k.a.dry_run else ("bf16-flash", "bf16-unfused")):
        what = "megaw %s %s" % (k.backend, prec)
        mem = MemSampler(not k.a.dry_run)
        rc, out, err, secs = k.run("bench-megaw-" + prec, [os.path.join(k.bin, "megaw")] + args +
                                   precs[prec][0], 150, env=precs[prec][1])
        peak = mem.done()
        steps = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
        if rc != 0 or len(steps) < 3:
            k.row("bench", what, verdict(rc) if rc != 0 else "FAIL", tail(err, 200))
            continue
        tps = statistics.median(s["tokens_per_s"] for s in steps[2:])
        # cuDNN's attention says on stderr when it leaves a shape to flash
        declined = [ln for ln in err.splitlines() if "the flash kernels" in ln]
        bench_row(k, what, tps, fpt, peak, " | %.0f s in all%s" %
                  (secs, " | " + declined[0][:160] if declined and prec == "bf16" else ""))
    torch_bench(k, m)


def torch_bench(k, m):
    script = os.path.join(k.bundle, "bench", "bench_gpu_torch.py")
    env = dict(os.environ)  # PyTorch's own libraries, not the bundle's
    try:
        import torch  # noqa: F401
    except ImportError:
        k.row("bench", "pytorch", "skipped", "this python has no torch")
        return
    dev = "cpu" if k.a.dry_run else "cuda"
    for compiled in (False, True):
        what = "pytorch %s %s%s" % (dev, "fp32" if k.a.dry_run else "bf16",
                                    " compiled" if compiled else "")
        if compiled and k.a.dry_run:
            k.row("bench", what, "skipped", "torch.compile is not timed on the CPU dry run")
            continue
        cmd = [sys.executable, script, "--device", dev, "--layers", str(m["layers"]),
               "--channels", str(m["channels"]), "--heads", str(m["heads"]), "--seq",
               str(m["seq"]), "--micro-batch", str(m["mbs"]), "--global-batch", str(m["gbs"])]
        cmd += ["--steps", "3", "--warmup", "1"] if k.a.dry_run else ["--steps", "15"]
        cmd += ["--compile"] if compiled else []
        rc, out, err, secs = k.run("bench-torch" + ("-compiled" if compiled else ""), cmd, 240,
                                   env=env)
        res = next((json.loads(ln) for ln in out.splitlines() if ln.startswith("{")), None)
        if rc != 0 or not res:
            k.row("bench", what, verdict(rc), tail(err, 200))
            continue
        k.facts.setdefault("torch", res.get("torch"))
        fpt, _ = flops_per_token(m, (m["vocab"] + 127) // 128 * 128)
        bench_row(k, what, res["tokens_per_s"], fpt, res.get("peak_bytes"),
                  " | first step %.0f s" % res["first_step_s"])


def kernel_family(name):
    """A kernel's name without its arguments: mega_cu_xent_fwd for our
    lambdas' wrappers, the stem of cuBLAS's and others' names."""
    if "mega_cu_" in name:
        return "mega_cu_" + name.split("mega_cu_")[1].split(":")[0].split("<")[0]
    for anon in ("<unnamed>::", "(anonymous namespace)::"):
        name = name.replace(anon, "")
    return name.replace("void ", "").split("(")[0].split("<")[0][:60]


def ncu_families(csv_text):
    """{kernel family: (kernels, ns)} from ncu --csv's gpu__time_duration rows."""
    import csv
    rows = [r for r in csv.reader(csv_text.splitlines()) if len(r) > 10]
    if len(rows) < 2 or "Kernel Name" not in rows[0]:
        return {}
    ki, vi = rows[0].index("Kernel Name"), rows[0].index("Metric Value")
    fam = {}
    for r in rows[1:]:
        try:
            ns = float(r[vi].replace(",", ""))
        except ValueError:
            continue
        f = kernel_family(r[ki])
        n, t = fam.get(f, (0, 0.0))
        fam[f] = (n + 1, t + ns)
    return fam


def one_micro_batch(k, m, tag):
    """megaw and its arguments for one --bf16 iteration of model m, one
    micro batch, on tokens of its own: what ncu watches."""
    prefix = os.path.join(k.work, "tokens-" + tag)
    write_tokens(prefix, 4 * m["mbs"] * (m["seq"] + 1) * 2, m["vocab"])
    return [os.path.join(k.bin, "megaw")] + gpt2_args(k, m, 1, m["mbs"], m["mbs"], prefix) + \
        ["--bf16"]


def step_profile(k):
    ncu = shutil.which("ncu")
    if k.a.dry_run or not ncu:
        k.row("profile", "ncu kernel times", "skipped",
              "dry run" if k.a.dry_run else "no ncu on this machine")
        return
    cmd = [ncu, "--metrics", "gpu__time_duration.sum", "--csv"] + one_micro_batch(k, GPT2, "prof")
    rc, out, err, secs = k.run("profile-ncu", cmd, 150)
    fam = ncu_families(out)
    if rc != 0 or not fam:
        k.row("profile", "ncu kernel times", verdict(rc) if rc else "FAIL", tail(err, 160))
        return
    total = sum(t for _, t in fam.values())
    k.facts["profile"] = {f: {"kernels": n, "ms": t / 1e6} for f, (n, t) in fam.items()}
    k.row("profile", "one --bf16 micro batch (ncu)", "ok", "%.1f ms in %d kernels, %.0f s" %
          (total / 1e6, sum(n for n, _ in fam.values()), secs))
    for f, (n, t) in sorted(fam.items(), key=lambda x: -x[1][1])[:10]:
        k.row("profile", f[:34], "", "%5.1f%% %7.2f ms %5d kernels" % (100 * t / total, t / 1e6, n))
    profile_as_run(k, ncu)


def profile_as_run(k, ncu):
    """The same micro batch with ncu's cache flushes and base clocks off:
    kernel times as training sees them, beside the bench's time per micro
    batch, so the gap says how long the GPU waited on the host."""
    cmd = [ncu, "--cache-control", "none", "--clock-control", "none", "--metrics",
           "gpu__time_duration.sum", "--csv"] + one_micro_batch(k, GPT2, "asrun")
    rc, out, err, secs = k.run("profile-ncu-as-run", cmd, 150)
    fam = ncu_families(out)
    if rc != 0 or not fam:
        k.row("profile", "ncu as run", verdict(rc) if rc else "FAIL", tail(err, 160))
        return
    ms = sum(t for _, t in fam.values()) / 1e6
    k.facts["profile_as_run_ms"] = ms
    bench = k.facts.get("bench", {}).get("megaw %s bf16" % k.backend)
    wall = 1e3 * GPT2["mbs"] * GPT2["seq"] / bench["tokens_per_s"] if bench else None
    k.row("profile", "as run (no flush, clocks free)", "ok", "%.1f ms of kernels%s, %.0f s" %
          (ms, "; the bench: %.1f ms a micro batch (kernels %.0f%% of it; the step's optimizer "
           "counted whole)" % (wall, 100 * ms / wall) if wall else "", secs))


# What --detail prints per kernel from ncu's raw page (the full CSV stays in
# the logs): time, how busy the SMs, tensor pipes, issue slots and the
# load/store pipe were, warps resident, and the largest reasons warps
# stalled. Names as ncu 2025 (CUDA 13) reports them on an H200 (run 7d).
DETAIL = (("gpu__time_duration.sum", "time"),
          ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "sm%"),
          ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "tensor%"),
          ("sm__issue_active.avg.pct_of_peak_sustained_elapsed", "issue%"),
          ("l1tex__data_pipe_lsu_wavefronts.avg.pct_of_peak_sustained_elapsed", "lsu%"),
          ("sm__warps_active.avg.per_cycle_active", "warps/SM"),
          ("launch__registers_per_thread", "regs"))


def detail_rows(csv_text):
    """[(kernel, [(label, value)], [(stall, warps per issue)])] from ncu --page raw --csv."""
    import csv
    import io
    lines = [ln for ln in csv_text.splitlines() if ln.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    if len(rows) < 2:
        return []
    head, out = rows[0], []
    for r in rows[1:]:
        if len(r) != len(head) or "Kernel Name" not in head:
            continue
        got = dict(zip(head, r))
        if not got["Kernel Name"]:
            continue  # the units row
        vals = [(lab, got[m]) for m, lab in DETAIL if m in got]
        stalls = []
        for m, v in got.items():
            if m.startswith("smsp__average_warps_issue_stalled_") and \
                    m.endswith("_per_issue_active.ratio"):
                try:
                    stalls.append((m[len("smsp__average_warps_issue_stalled_"):
                                     -len("_per_issue_active.ratio")], float(v)))
                except ValueError:
                    pass
        stalls.sort(key=lambda x: -x[1])
        out.append((kernel_family(got["Kernel Name"]), vals, stalls[:4]))
    return out


DETAIL_DEFAULT = "fwd_kernel|kv_kernel|q_kernel"  # the flash kernels (kernels/flash_mma.cu)


def step_detail(k):
    """ncu's speed-of-light, occupancy and warp-state sections for the
    kernels --detail names, on a one-layer GPT-2 (the same shapes per layer)."""
    ncu = shutil.which("ncu")
    if k.a.dry_run or not ncu:
        k.row("detail", "ncu sections", "skipped", "dry run" if k.a.dry_run else "no ncu")
        return
    cmd = [ncu, "--section", "SpeedOfLight", "--section", "Occupancy", "--section",
           "WarpStateStats", "--section", "ComputeWorkloadAnalysis", "--section",
           "MemoryWorkloadAnalysis", "--page", "raw", "--csv", "-k", "regex:" + k.a.detail,
           "-c", "12"] + one_micro_batch(k, dict(GPT2, layers=1), "detail")
    # the default names our flash kernels, which run only with cuDNN's off
    env = dict(k.env, MEGA_CUDNN_ATTENTION="off") if k.a.detail == DETAIL_DEFAULT else None
    rc, out, err, secs = k.run("detail-ncu", cmd, 200, env=env)
    rows = detail_rows(out)
    if rc != 0 or not rows:
        k.row("detail", "ncu sections", verdict(rc) if rc else "FAIL", tail(err, 160))
        return
    k.facts["detail"] = [{"kernel": n, "values": dict(v), "stalls": dict(st)}
                         for n, v, st in rows]
    for name, vals, stalls in rows:
        k.row("detail", name[:34], "ok", " ".join("%s %s" % lv for lv in vals))
        k.row("detail", "", "", "stalls per issue: " +
              ", ".join("%s %.2f" % st for st in stalls))


def step_sanitize(k):
    tool = shutil.which("compute-sanitizer")
    if k.a.dry_run or not tool:
        k.row("sanitize", "compute-sanitizer", "skipped",
              "dry run" if k.a.dry_run else "no compute-sanitizer on this machine")
        return
    for t in ("memcheck", "racecheck"):
        rc, out, err, secs = k.run("sanitize-" + t, [tool, "--tool", t, "--error-exitcode", "9",
                                                     os.path.join(k.bin, "test_cuda_backend")], 120)
        summary = [ln for ln in (out + err).splitlines() if "SUMMARY" in ln]
        k.row("sanitize", t + " test_cuda_backend", "ok" if rc == 0 else verdict(rc),
              head(summary[-1] if summary else tail(out + err, 120), 100))
    data = os.path.join(k.work, "sanitize.txt")
    write_text(data, 4000)
    for prec in ("fp32", "bf16"):
        cmd = [tool, "--tool", "memcheck", "--error-exitcode", "9", os.path.join(k.bin, "megaw"),
               "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
               "--seq-length", "64", "--micro-batch-size", "2", "--global-batch-size", "4",
               "--train-iters", "2", "--lr", "1e-3", "--data-path", data, "--backend", "cuda"]
        rc, out, err, secs = k.run("sanitize-megaw-" + prec, cmd + (["--bf16"] if prec == "bf16"
                                                                  else []), 120)
        summary = [ln for ln in (out + err).splitlines() if "SUMMARY" in ln]
        k.row("sanitize", "memcheck megaw " + prec, "ok" if rc == 0 else verdict(rc),
              head(summary[-1] if summary else tail(err, 120), 100))


def finish(k):
    lines = ["", "gpu-check %s | %s | driver %s | %s | source %s" % (
        time.strftime("%Y-%m-%d"), k.facts.get("card", "no GPU (dry run)" if k.a.dry_run else "?"),
        k.facts.get("driver", "-"), k.facts.get("megaw", ""), k.facts.get("source", "?"))]
    for step, what, v, detail in k.rows:
        lines.append("%-7s %-34s %-7s %s" % (step, what, v, detail))
    fails = sum(1 for r in k.rows if r[2] in ("FAIL", "timeout"))
    lines.append("%d ok, %d failed, %d skipped; logs: %s" % (
        sum(1 for r in k.rows if r[2] == "ok"), fails,
        sum(1 for r in k.rows if r[2] == "skipped"), k.logs))
    text = "\n".join(lines)
    with open(os.path.join(k.out, "summary.txt"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(k.out, "summary.json"), "w") as f:
        json.dump({"facts": k.facts, "rows": k.rows}, f, indent=1)
    if k.a.out:
        with tarfile.open(os.path.join(k.out, "gpu-check-logs.tar.gz"), "w:gz") as t:
            t.add(k.logs, arcname="logs")
        shutil.rmtree(k.logs)  # only a few files come back from the machine
    print(text)
    return 1 if fails else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bundle", required=True)
    p.add_argument("--out")
    p.add_argument("--budget", type=float, default=450)
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--only", default="suite,curves,bench,profile,sanitize",
                   help="comma-separated steps among suite, curves, bench, profile, detail, "
                        "sanitize")
    p.add_argument("--detail", default=DETAIL_DEFAULT,
                   help="step detail: ncu's sections for kernels matching this regex")
    a = p.parse_args()
    k = Kit(a)
    steps = a.only.split(",")
    step_facts(k)
    if step_libs(k):
        for name, fn in (("suite", step_suite), ("curves", step_curves), ("bench", step_bench),
                         ("profile", step_profile), ("detail", step_detail),
                         ("sanitize", step_sanitize)):
            if name not in steps:
                continue
            try:  # a step's own bug costs that step, not the run's table
                fn(k)
            except Exception as e:  # noqa: BLE001
                k.row(name, "the kit's own step", "FAIL", "%s: %s" % (type(e).__name__, e))
    rc = finish(k)
    shutil.rmtree(k.work, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
