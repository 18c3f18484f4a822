#!/usr/bin/python3
"""megaw ranks launched by hand, meeting through a Gloo FileStore, for the
engine's checks and the benchmarks: the tiny GPT and its data, launching a
world of ranks, reading their losses, and reading a checkpoint's files."""
import array
import json
import os
import struct
import subprocess
import tempfile
import time
import zlib

MODEL = ["--num-layers", "8", "--hidden-size", "32", "--num-attention-heads", "2",
         "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "16",
         "--lr", "3e-3", "--lr-warmup-iters", "1", "--clip-grad", "1.0", "--seed", "7"]
ITERS = 3
RTOL = 2e-5
CKPT_ITERS, CKPT_SAVE_AT = 4, 2


def write_data(path):
    words = ("pipeline bubble microbatch stage rank gradient schedule warmup steady "
             "cooldown activation tensor layer embedding loss").split()
    out, state = [], 12345
    for _ in range(6000):
        state = (state * 1103515245 + 12345) % (1 << 31)
        out.append(words[state % len(words)])
    with open(path, "w") as f:
        f.write(" ".join(out))


def launch(megaw, world, args, tmp, timeout=120):
    """Runs `world` ranks; returns (returncodes, per-rank JSON lines, stderr texts).
    Each rank writes to files of its own, not a pipe: read one after another,
    a rank that filled its pipe (64 KB) before the one being read ended
    would block, and the ranks waiting on it with it."""
    rdv = tempfile.mkdtemp(dir=tmp, prefix="rdv-")
    base = [megaw] + args + ["--json"]
    if world > 1:
        base += ["--world-size", str(world), "--rendezvous-dir", rdv]
    procs, files = [], []
    for r in range(world):
        cmd = base + (["--rank", str(r)] if world > 1 else [])
        out, err = (os.path.join(rdv, "rank%d.%s" % (r, k)) for k in ("out", "err"))
        with open(out, "w") as fo, open(err, "w") as fe:
            procs.append(subprocess.Popen(cmd, stdout=fo, stderr=fe))
        files.append((out, err))
    deadline = time.time() + timeout
    try:
        for p in procs:
            p.wait(timeout=max(1, deadline - time.time()))
    except subprocess.TimeoutExpired:
        for q in procs:
            q.kill()
            q.wait()
        raise RuntimeError("ranks did not finish within %d s: %s" % (timeout, " ".join(base)))
    results = []
    for p, (out, err) in zip(procs, files):
        with open(out) as fo, open(err) as fe:
            text, errs = fo.read(), fe.read()
        lines = [json.loads(l) for l in text.splitlines() if l.startswith("{")]
        results.append((p.returncode, lines, errs))
    return results


def losses_range(results, what, first, last, rtol=0.0):
    """iteration -> loss for first..last, checking that every rank that knows
    the loss agrees (exactly, or within rtol)."""
    seen = {}
    for rc, lines, err in results:
        if rc != 0:
            raise RuntimeError("%s: a rank exited %d: %s" % (what, rc, err.strip()[-400:]))
        for l in lines:
            if "loss" in l:
                prev, got = seen.setdefault(l["iteration"], l["loss"]), l["loss"]
                if (prev != got) if rtol == 0 else abs(prev - got) > rtol * abs(prev):
                    raise RuntimeError("%s: ranks disagree at iteration %d: %r vs %r" %
                                       (what, l["iteration"], prev, got))
    if sorted(seen) != list(range(first, last + 1)):
        raise RuntimeError("%s: losses for iterations %s, want %d..%d" %
                           (what, sorted(seen), first, last))
    return seen


def losses_of(results, what):
    """iteration -> loss for 1..ITERS, the ranks agreeing within RTOL."""
    return losses_range(results, what, 1, ITERS, RTOL)


def check_manifest(path):
    """Every file of a checkpoint directory is in its manifest, with its size and crc32."""
    man = json.load(open(os.path.join(path, "manifest.json")))
    files = set(os.listdir(path)) - {"manifest.json"}
    if set(man["files"]) != files:
        raise RuntimeError("%s: manifest lists %s, directory holds %s" %
                           (path, sorted(man["files"]), sorted(files)))
    for name, e in man["files"].items():
        data = open(os.path.join(path, name), "rb").read()
        if len(data) != e["size"] or zlib.crc32(data) != e["crc32"]:
            raise RuntimeError("%s/%s: size or crc32 differs from the manifest" % (path, name))
    return sorted(files)


def read_safetensors(path):
    """name -> (shape, floats) of an F32 safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        body = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        lo, hi = t["data_offsets"]
        a = array.array("f")
        a.frombytes(body[lo:hi])
        out[name] = (t["shape"], a)
    return out


def read_checkpoint(it, prefix):
    """name -> (shape, floats) over every PREFIX*.safetensors file of a
    checkpoint directory (one file, or HF's shards when several stages wrote)."""
    out = {}
    for f in sorted(os.listdir(it)):
        if f.startswith(prefix) and f.endswith(".safetensors"):
            out.update(read_safetensors(os.path.join(it, f)))
    return out
