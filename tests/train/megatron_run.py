"""Running a Megatron launch script through megaw and megad run, for
megatron_scripts.py: the checks' record, the data (a GPT-2-sized
vocabulary, Megatron's indexed dataset), the launches, the loop that
applies each refusal's replacement until the job trains, Megatron's log
line read back, and Megatron's learning rate and rampup restated.

Reads MEGAW and MEGAD from the test's arguments: MEGAW MEGAD WORKDIR."""
import json
import math
import os
import re
import struct
import subprocess
import sys
import tempfile
import time

from megatron_example_scripts import REPLACE

MEGAW, MEGAD = sys.argv[1], sys.argv[2]
VOCAB = 50257  # GPT-2's vocab.json entries; <|endoftext|> is the last
FAILS = []


def check(what, ok, detail=""):
    print("%s: %s%s" % ("ok" if ok else "FAIL", what, "" if ok else " -- " + detail))
    if not ok:
        FAILS.append(what)
    return ok


# ---- the data: GPT-2's vocabulary's size and an indexed dataset ----

def bytes_to_unicode():
    """GPT-2's byte-to-unicode table: printable bytes as themselves, the
    other 68 from U+0100 on."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def write_vocab(dirname):
    """vocab.json with 50,257 entries, as GPT-2's: the 256 byte tokens in
    GPT-2's spelling, filler tokens, <|endoftext|> last; and merges.txt
    without merges (so text encodes byte by byte)."""
    vocab = {u: k for k, u in enumerate(bytes_to_unicode())}
    vocab.update({"t%d" % k: k for k in range(256, VOCAB - 1)})
    vocab["<|endoftext|>"] = VOCAB - 1
    vpath, mpath = os.path.join(dirname, "gpt2-vocab.json"), os.path.join(dirname, "gpt2-merges.txt")
    with open(vpath, "w") as f:
        json.dump(vocab, f)
    with open(mpath, "w") as f:
        f.write("#version: 0.2\n")
    return vpath, mpath


def write_mmidx(prefix, docs):
    """Megatron's MMIDIDX from the format: uint16 ids (dtype 8)."""
    lengths, pointers, offset = [], [], 0
    with open(prefix + ".bin", "wb") as f:
        for d in docs:
            f.write(struct.pack("<%dH" % len(d), *d))
            lengths.append(len(d))
            pointers.append(offset)
            offset += 2 * len(d)
    doc_idx = list(range(len(docs) + 1))
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", 8))
        f.write(struct.pack("<Q", len(docs)))
        f.write(struct.pack("<Q", len(doc_idx)))
        f.write(struct.pack("<%di" % len(lengths), *lengths))
        f.write(struct.pack("<%dq" % len(pointers), *pointers))
        f.write(struct.pack("<%dq" % len(doc_idx), *doc_idx))


# ---- the launches ----

def megaw_launch(args, world, tmp, timeout=240):
    """world ranks of megaw started by hand; (rcs, stdouts, stderrs)."""
    rdv = tempfile.mkdtemp(dir=tmp, prefix="rdv-")
    base = [MEGAW] + args
    if world > 1:
        base += ["--world-size", str(world), "--rendezvous-dir", rdv]
    procs = [subprocess.Popen(base + (["--rank", str(r)] if world > 1 else []),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    outs = []
    deadline = time.time() + timeout
    for p in procs:
        try:
            outs.append(p.communicate(timeout=max(1, deadline - time.time())))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    return [p.returncode for p in procs], [o for o, _ in outs], [e for _, e in outs]


def megad_run(args, slots, timeout=240):
    p = subprocess.run([MEGAD, "run", "--slots", str(slots)] + args, capture_output=True,
                       text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def flatten(r):
    """megaw_launch's answer as one run's: the first nonzero exit status (else
    0), the stdouts and the stderrs."""
    rcs, outs, errs = r
    bad = [rc for rc in rcs if rc != 0]
    return (bad[0] if bad else 0), "".join(outs), "".join(errs)


# ---- the refusals, until the job trains ----

def remove(argv, flags):
    """argv less each (flag, its number of values)."""
    for flag, n in flags:
        i = argv.index(flag)
        argv = argv[:i] + argv[i + 1 + n:]
    return argv


def until_it_trains(name, argv, run):
    """Runs argv; applies each refusal's replacement; returns (argv, out,
    err, refused flags)."""
    refused = []
    for _ in range(len(REPLACE) + 1):
        rc, out, err = run(argv)
        if rc == 0:
            return argv, out, err, refused
        # the refused flag is the one the message names first (its text may
        # name others, as the way out)
        named = [f for f in REPLACE if f in err and f not in refused]
        flag = min(named, key=err.index) if named else None
        if not check("%s: exit %d is a refusal of a known flag" % (name, rc), rc == 2 and flag,
                     err.strip()[-600:]):
            return argv, out, err, refused
        words, says, instead = REPLACE[flag]
        for s in says:
            check("%s: %s's refusal says '%s'" % (name, flag, s), s in err, err.strip())
        check("%s: the refusal is a line of the program's own" % name,
              all(l.startswith(("megaw: ", "megad: ")) for l in err.splitlines()), err)
        refused.append(flag)
        argv = remove(argv, words) + instead
    return argv, "", "no run", refused


def known_flags():
    """mega's job flags and the Megatron flags it accepts, from megaw --help."""
    text = subprocess.run([MEGAW, "--help"], capture_output=True, text=True).stdout
    head, _, accepted = text.partition("Megatron flags accepted because they restate")
    table = set(re.findall(r"^  (--[a-z0-9_-]+)", head, re.M))
    ok = set(re.findall(r"(--[a-z0-9_-]+)", accepted.split("Other Megatron flags")[0]))
    return table, ok


def no_flag_ignored(name, argv, refused, original):
    table, ok = known_flags()
    for a in argv:
        if a.startswith("--"):
            check("%s: %s is mega's flag or restates mega" % (name, a), a in table or a in ok)
    for a in original:
        if a.startswith("--"):
            check("%s: the script's %s is honoured or refused" % (name, a),
                  a in argv or a in refused or
                  any(a == f for r in refused for f, _ in REPLACE[r][0]))


# ---- what the run shows, and Megatron's formulas ----

LINE = re.compile(r"^ \[[0-9-]+ [0-9:.]+\] iteration +(\d+)/ +(\d+) \| consumed samples: +(\d+) \|"
                  r" elapsed time per iteration \(ms\): [0-9.]+ \|.* learning rate: ([0-9.E+-]+) \|"
                  r" global batch size: +(\d+) \| lm loss: ([0-9.E+-]+) \| loss scale: 1\.0 \|"
                  r" grad norm: [0-9.]+ \| number of skipped iterations: +0 \|"
                  r" number of nan iterations: +0 \|", re.M)
EVAL = re.compile(r"^ validation loss at iteration (\d+) \| lm loss value: ([0-9.E+-]+) \|"
                  r" lm loss PPL: [0-9.E+-]+ \| $", re.M)


def lines_of(out):
    return [(int(m[0]), int(m[1]), int(m[2]), float(m[3]), int(m[4]), m[5])
            for m in LINE.findall(out)]


def megatron_lr(n, lr, min_lr, warmup, decay):
    """OptimizerParamScheduler.get_lr, cosine: linear warmup from 0 for n <=
    warmup, min_lr past the decay, else min + (lr - min) (cos(pi r) + 1) / 2,
    r = (n - warmup) / (decay - warmup); n counts samples."""
    if warmup > 0 and n <= warmup:
        return lr * n / warmup
    if n > decay:
        return min_lr
    r = (n - warmup) / (decay - warmup)
    return min_lr + (lr - min_lr) * 0.5 * (math.cos(math.pi * r) + 1)


def megatron_rampup(c, start, inc, samples, G):
    """RampupBatchsizeNumMicroBatchesCalculator.update's global batch."""
    if c > samples:
        return G
    return start + int(c / (samples / ((G - start) // inc))) * inc


def checkpoints(ckpt):
    return sorted(int(d[5:]) for d in os.listdir(ckpt) if re.fullmatch(r"iter_\d{7}", d))
