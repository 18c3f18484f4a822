#!/usr/bin/python3
"""--data-order megatron gives exactly Megatron-LM core's GPTDataset order.

Megatron's index building is restated here in Python from its source
(megatron/core/datasets/gpt_dataset.py: _get_num_epochs,
_build_document_sample_shuffle_indices, _build_document_index,
_build_shuffle_index, _query_document_sample_shuffle_indices;
helpers.cpp: build_sample_idx, build_blending_indices;
blended_megatron_dataset_builder.py and blended_megatron_dataset_config.py:
the split matrix and the samples asked of each dataset of a blend), using
numpy's own RandomState, so the shuffles are numpy's and not mega's
restatement of them. Datasets are written as MMIDIDX pairs from the format
alone; data_samples (built with mega) prints the token ids of every
training and evaluation sample of a job, and each must equal Megatron's.
The cases cover several epochs with and without the separate final epoch,
a single epoch, empty documents, a split with evaluation, blends
(--data-path W P ... and --train-data-path/--valid-data-path), a blend of
one, another --seed; then the refusals, and megaw itself: its losses under
--data-order megatron are the same at DP 1 and DP 2 and differ from file
order's.

  /usr/bin/python3 megatron_order_check.py DATA_SAMPLES MEGAW WORKDIR
"""
import math
import os
import random
import re
import shutil
import subprocess
import sys

try:
    import numpy
except ImportError:
    print("python3-numpy is not installed: skipped (scripts/install-deps)")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "engine"))
from indexed_check import write_mmidx  # noqa: E402
import ranks  # noqa: E402

VOCAB = 255  # NullTokenizer --vocab-size 255: ids 0..255


# ---- Megatron's GPTDataset, restated ----

def num_epochs(tokens_per_epoch, num_samples, seq_length):
    epochs, tokens = 1, tokens_per_epoch
    requested = num_samples * seq_length + 1
    while tokens < requested:
        epochs += 1
        tokens += tokens_per_epoch
    return epochs


def build_document_index(documents, epochs, rs, separate_final_epoch):
    if not separate_final_epoch or epochs == 1:
        index = numpy.mgrid[0:epochs, 0:len(documents)][1]
        index[:] = documents
        index = index.reshape(-1).astype(numpy.int32)
        rs.shuffle(index)
        return index
    first = build_document_index(documents, epochs - 1, rs, False)
    last = build_document_index(documents, 1, rs, False)
    return numpy.concatenate((first, last))


def build_sample_idx(sizes, document_index, seq_length, epochs, tokens_per_epoch):
    """helpers.cpp's build_sample_idx, drop_last_partial_sequence and
    add_extra_token_to_sequence true."""
    num_samples = (epochs * tokens_per_epoch - 1) // seq_length
    out = [(0, 0)]
    pos, offset = 0, 0
    while len(out) <= num_samples:
        remaining = seq_length + 1
        while remaining != 0:
            length = int(sizes[document_index[pos]]) - offset
            remaining -= length
            if remaining <= 0:
                offset += remaining + length - 1
                remaining = 0
            else:
                if pos == len(document_index) - 1:
                    assert len(out) == num_samples
                    offset = int(sizes[document_index[pos]]) - 1
                    break
                pos += 1
                offset = 0
        out.append((pos, offset))
    return out


def build_shuffle_index(num_samples, total_size, rs):
    first = numpy.arange(0, num_samples, 1, dtype=numpy.uint32)
    rs.shuffle(first)
    if num_samples == total_size:
        return first
    last = numpy.arange(num_samples, total_size, 1, dtype=numpy.uint32)
    rs.shuffle(last)
    return numpy.concatenate((first, last))


class GPTDataset:
    def __init__(self, docs, indices, num_samples, seq_length, seed):
        self.docs = docs
        sizes = [len(d) for d in docs]
        tokens_per_epoch = sum(sizes[i] for i in indices)
        epochs = num_epochs(tokens_per_epoch, num_samples, seq_length)
        separate = False
        sans_final = None
        if epochs > 1:
            sans_final = ((epochs - 1) * tokens_per_epoch - 1) // seq_length
            from_final = num_samples - sans_final
            per_epoch = (tokens_per_epoch - 1) // seq_length
            assert 0 <= from_final <= per_epoch + 1
            separate = from_final < int(0.80 * per_epoch)
        rs = numpy.random.RandomState(seed)
        self.document_index = build_document_index(numpy.array(indices, dtype=numpy.int32),
                                                   epochs, rs, separate)
        self.sample_index = build_sample_idx(sizes, self.document_index, seq_length, epochs,
                                             tokens_per_epoch)
        total = len(self.sample_index) - 1
        self.shuffle_index = build_shuffle_index(sans_final if separate else total, total, rs)
        self.epochs, self.separate = epochs, separate

    def __getitem__(self, idx):
        idx = int(self.shuffle_index[idx])
        beg, beg_off = self.sample_index[idx]
        end, end_off = self.sample_index[idx + 1]
        if beg == end:
            doc = self.docs[self.document_index[beg]]
            return doc[beg_off:end_off + 1]
        parts = []
        for i in range(beg, end + 1):
            doc = self.docs[self.document_index[i]]
            off = beg_off if i == beg else 0
            parts += doc[off:] if i < end else doc[off:end_off + 1]
        return parts


# ---- the builder: split, blends ----

def normalize(weights):
    w = numpy.array(weights, dtype=numpy.float64)
    return (w / numpy.sum(w)).tolist()


def split_ranges(split, count):
    """parse_and_normalize_split, convert_split_vector_to_split_matrix,
    and the builder's int(round(bookend * count))."""
    vector = list(map(float, re.findall(r"[.0-9]+", split)))
    vector = normalize(vector + [0.0] * (3 - len(vector)))
    expansion = [0]
    for v in vector:
        expansion.append(expansion[-1] + v)
    out = []
    for a, b in zip(expansion[:-1], expansion[1:]):
        out.append(None if b <= a else (int(round(a * count)), int(round(b * count))))
    return out


def sizes_per_dataset(weights, size, surplus):
    return [int(math.ceil(math.ceil(size * w) * (1 + surplus))) for w in weights]


def blending_indices(weights, size):
    counts = [0] * len(weights)
    out = []
    for s in range(size):
        x = max(float(s), 1.0)
        best = max(range(len(weights)), key=lambda d: (weights[d] * x - counts[d], -d))
        out.append((best, counts[best]))
        counts[best] += 1
    return out


class Blend:
    """A split of a blend as the builder makes it: a lone GPTDataset, or a
    BlendedDataset of GPTDatasets built for their share plus the surplus."""

    def __init__(self, datasets, weights, size, seq_length, seed, force_blend=False):
        # datasets: (docs, indices) pairs
        if len(datasets) == 1 and not force_blend:
            self.parts = [GPTDataset(*datasets[0], size, seq_length, seed)]
            self.index = None
            return
        w = normalize(weights)
        target = sizes_per_dataset(w, size, 0.0)
        buffer = sizes_per_dataset(w, size, 0.005)
        self.parts = [GPTDataset(docs, ind, n, seq_length, seed)
                      for (docs, ind), n in zip(datasets, buffer)]
        self.index = blending_indices(w, sum(target))

    def __getitem__(self, s):
        if self.index is None:
            return self.parts[0][s]
        d, k = self.index[s]
        return self.parts[d][k]


# ---- the job ----

def flag(flags, name, default=None):
    return flags[flags.index(name) + 1] if name in flags else default


def data_list(flags, name):
    if name not in flags:
        return []
    out, k = [], flags.index(name) + 1
    while k < len(flags) and not flags[k].startswith("--"):
        out.append(flags[k])
        k += 1
    return out


def megatron_samples(flags, datasets):
    """Every training and evaluation sample Megatron's pretrain_gpt.py
    would read for the job's flags (datasets: prefix -> docs)."""
    T = int(flag(flags, "--seq-length"))
    G = int(flag(flags, "--global-batch-size"))
    iters = int(flag(flags, "--train-iters"))
    seed = int(flag(flags, "--seed", "1234"))
    interval = int(flag(flags, "--eval-interval", "0"))
    eval_iters = int(flag(flags, "--eval-iters", "100"))
    train_n = iters * G
    split = flag(flags, "--split")
    shares = normalize(list(map(float, re.findall(r"[.0-9]+", split))) + [0.0] * 3)[:3] \
        if split else [1.0, 0.0, 0.0]
    # the end of training's validation (mega's, without --eval-interval too)
    valid_n = (iters // interval + 1) * eval_iters * G if interval else \
        eval_iters * G if shares[1] > 0 else 0
    test_n = eval_iters * G if shares[2] > 0 else 0  # Megatron's test_samples

    def parse(words):
        if len(words) % 2 == 1:
            return [datasets[p] for p in words], None
        return [datasets[p] for p in words[1::2]], [float(x) for x in words[0::2]]

    info = []
    te = None
    if "--data-path" in flags:
        docs_list, weights = parse(data_list(flags, "--data-path"))
        split = flag(flags, "--split")
        ranges = [split_ranges(split, len(d)) for d in docs_list]
        blend_of_one = weights is not None
        tr = Blend([(d, list(range(*r[0]))) for d, r in zip(docs_list, ranges)], weights,
                   train_n, T, seed, force_blend=blend_of_one)
        va = None
        if valid_n:
            va = Blend([(d, list(range(*r[1]))) for d, r in zip(docs_list, ranges)], weights,
                       valid_n, T, seed, force_blend=blend_of_one)
        # mega leaves out a test share too small for one window in a dataset
        # (Megatron would repeat its documents); the cases avoid that
        if test_n and all(r[2] and sum(len(d[i]) for i in range(*r[2])) > T
                          for d, r in zip(docs_list, ranges)):
            te = Blend([(d, list(range(*r[2]))) for d, r in zip(docs_list, ranges)], weights,
                       test_n, T, seed, force_blend=blend_of_one)
    else:
        docs_list, weights = parse(data_list(flags, "--train-data-path"))
        tr = Blend([(d, list(range(len(d)))) for d in docs_list], weights, train_n, T, seed)
        va = None
        if valid_n:
            vdocs, vweights = parse(data_list(flags, "--valid-data-path"))
            va = Blend([(d, list(range(len(d)))) for d in vdocs], vweights, valid_n, T, seed)
    for b in (tr, va, te):
        for p in (b.parts if b else []):
            info.append((p.epochs, p.separate))
    lines = ["train %d %s" % (s, " ".join(map(str, tr[s]))) for s in range(train_n)]
    lines += ["eval %d %s" % (s, " ".join(map(str, va[s]))) for s in range(valid_n)]
    lines += ["test %d %s" % (s, " ".join(map(str, te[s]))) for s in range(test_n if te else 0)]
    return lines, info


# ---- the cases ----

def cached_run(data_samples, flags, cache, want, read, built, name):
    """data_samples with --data-cache-path gives Megatron's samples, having
    read `read` order indices from the cache and built `built`."""
    run = subprocess.run([data_samples] + flags + ["--data-cache-path", cache],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    m = re.search(r"(\d+) index(?:es)? read from --data-cache-path, (\d+) built", run.stderr)
    counts = (int(m.group(1)), int(m.group(2))) if m else None
    same = run.returncode == 0 and run.stdout.splitlines() == want
    good = same and counts == (read, built)
    print("cache: %-38s %s, indices (read, built) %s, want %s%s"
          % (name, "same" if same else "DIFFERENT", counts, (read, built),
             "" if good else "\n  " + run.stderr.strip()))
    return good


def make_docs(rng, n, lo, hi, empty=()):
    return [[] if k in empty else [rng.randrange(VOCAB + 1) for _ in range(rng.randint(lo, hi))]
            for k in range(n)]


def main():
    data_samples, megaw, work = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(work, exist_ok=True)
    rng = random.Random(20240601)
    datasets = {}
    for name, docs in (("small", make_docs(rng, 12, 5, 40, empty=(3, 8))),
                       ("mid", make_docs(rng, 40, 1, 60)),
                       ("big", make_docs(rng, 300, 20, 200)),
                       ("other", make_docs(rng, 25, 3, 30))):
        prefix = os.path.join(work, name)
        write_mmidx(prefix, docs, "uint16")
        datasets[prefix] = docs
    P = {os.path.basename(p): p for p in datasets}
    base = ["--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2",
            "--micro-batch-size", "1", "--lr", "1e-3", "--tokenizer-type", "NullTokenizer",
            "--vocab-size", str(VOCAB), "--data-order", "megatron"]
    cases = [
        # several epochs; T and the sample count chosen so both final-epoch
        # rules appear among the cases (checked below)
        ("small, many epochs", ["--data-path", P["small"], "--split", "100,0,0",
                                "--seq-length", "16", "--global-batch-size", "4",
                                "--train-iters", "30"]),
        ("small, seq 8", ["--data-path", P["small"], "--split", "100,0,0", "--seq-length", "8",
                          "--global-batch-size", "4", "--train-iters", "20"]),
        ("mid, seed 7", ["--data-path", P["mid"], "--split", "969,30,1", "--seq-length", "16",
                         "--global-batch-size", "8", "--train-iters", "25", "--seed", "7"]),
        ("mid, just past an epoch", ["--data-path", P["mid"], "--split", "100,0,0",
                                     "--seq-length", "32", "--global-batch-size", "3",
                                     "--train-iters", "22"]),
        ("big, one epoch", ["--data-path", P["big"], "--split", "100,0,0", "--seq-length", "32",
                            "--global-batch-size", "8", "--train-iters", "10"]),
        ("split with evaluation", ["--data-path", P["mid"], "--split", "80,20,0",
                                   "--seq-length", "16", "--global-batch-size", "4",
                                   "--train-iters", "12", "--eval-interval", "5",
                                   "--eval-iters", "2"]),
        # core's split bounds (running sums, each rounded) are not the legacy
        # rule's here: 25 documents at 50,25,25 train on 0..11, not 0..12
        ("core's split", ["--data-path", P["other"], "--split", "50,25,25", "--seq-length",
                          "8", "--global-batch-size", "2", "--train-iters", "30",
                          "--eval-interval", "10", "--eval-iters", "2"]),
        ("split with a test share", ["--data-path", P["big"], "--split", "80,10,10",
                                     "--seq-length", "16", "--global-batch-size", "4",
                                     "--train-iters", "10", "--eval-interval", "5",
                                     "--eval-iters", "2"]),
        ("test share, no interval", ["--data-path", "0.3", P["big"], "0.7", P["mid"], "--split",
                                     "70,15,15", "--seq-length", "8", "--global-batch-size", "2",
                                     "--train-iters", "6", "--eval-iters", "3"]),
        ("blend of two", ["--data-path", "0.3", P["small"], "0.7", P["mid"], "--split",
                          "90,10,0", "--seq-length", "16", "--global-batch-size", "4",
                          "--train-iters", "25", "--eval-interval", "10", "--eval-iters", "1"]),
        ("blend of one", ["--data-path", "1.0", P["mid"], "--split", "100,0,0", "--seq-length",
                          "16", "--global-batch-size", "4", "--train-iters", "20"]),
        ("train and valid paths", ["--train-data-path", "2", P["big"], "1", P["other"],
                                   "--valid-data-path", P["small"], "--seq-length", "16",
                                   "--global-batch-size", "4", "--train-iters", "15",
                                   "--eval-interval", "5", "--eval-iters", "2"]),
        ("valid blend", ["--train-data-path", P["other"], "--valid-data-path", "1", P["small"],
                         "3", P["mid"], "--seq-length", "8", "--global-batch-size", "2",
                         "--train-iters", "40", "--eval-interval", "20", "--eval-iters", "3"]),
    ]
    # a blend whose surplus (the 0.5% more samples each dataset is built
    # for) changes a dataset's epoch count, so the surplus is checked too
    T, G = 16, 4
    small_tokens = sum(len(d) for d in datasets[P["small"]])
    for iters in range(10, 400):
        target = sizes_per_dataset([0.5, 0.5], iters * G, 0.0)[0]
        buffer = sizes_per_dataset([0.5, 0.5], iters * G, 0.005)[0]
        if num_epochs(small_tokens, target, T) != num_epochs(small_tokens, buffer, T):
            cases.append(("blend at the surplus", ["--data-path", "1", P["small"], "1", P["other"],
                                                   "--split", "100,0,0", "--seq-length", str(T),
                                                   "--global-batch-size", str(G),
                                                   "--train-iters", str(iters)]))
            break
    else:
        print("no blend in range where the surplus matters")
        return 1
    ok = True
    seen = set()
    for name, flags in cases:
        want, info = megatron_samples(flags, datasets)
        run = subprocess.run([data_samples] + base + flags, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        got = run.stdout.splitlines()
        same = run.returncode == 0 and got == want
        bad = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), None)
        for epochs, separate in info:
            seen.add("one epoch" if epochs == 1 else
                     "separate final epoch" if separate else "several epochs, one shuffle")
        print("%-26s %s: %d samples; Megatron's datasets (epochs, separate final epoch) %s%s"
              % (name, "same" if same else "DIFFERENT", len(want), info,
                 "" if same else "\n  rc %d %s\n  first difference at line %s:\n  mega     %s\n"
                 "  Megatron %s" % (run.returncode, run.stderr.strip(), bad,
                                    got[bad] if bad is not None else got[len(want):][:1],
                                    want[bad] if bad is not None else want[len(got):][:1])))
        ok &= same
    # --data-cache-path: each case's order written, then read back, the
    # same both times; another --seed beside it builds its own files
    cache = os.path.join(work, "cache")
    for old in (cache, os.path.join(work, "megaw-cache")):  # a run before this one's
        shutil.rmtree(old, ignore_errors=True)
    for name, flags in cases:
        want, info = megatron_samples(flags, datasets)
        for attempt, (read, built) in enumerate(((0, len(info)), (len(info), 0))):
            ok &= cached_run(data_samples, base + flags, cache, want, read, built,
                             "%s, %s" % (name, ("first start", "second start")[attempt]))
    reseeded = cases[0][1] + ["--seed", "99"]
    want, info = megatron_samples(reseeded, datasets)
    ok &= cached_run(data_samples, base + reseeded, cache, want, 0, len(info),
                     "%s, another --seed" % cases[0][0])
    need = {"one epoch", "separate final epoch", "several epochs, one shuffle"}
    print("cases cover:", sorted(seen))
    ok &= need <= seen

    # the order is not file order: the first case's first samples differ
    file_flags = [w if w != "megatron" else "file" for w in base] + cases[0][1]
    run = subprocess.run([data_samples] + file_flags, stdout=subprocess.PIPE, text=True)
    differs = run.returncode == 0 and run.stdout.splitlines() != megatron_samples(
        cases[0][1], datasets)[0]
    print("file order differs from Megatron's:", differs)
    ok &= differs

    refusals = [
        ("no --split", ["--data-path", P["mid"]], "needs --split"),
        ("plain file", ["--train-data-path", os.path.join(work, "small.bin")], "plain file"),
        ("evaluation from the training data", ["--train-data-path", P["mid"], "--eval-interval",
                                               "5", "--eval-iters", "1"], "--valid-data-path"),
    ]
    common = ["--seq-length", "8", "--global-batch-size", "2", "--train-iters", "4"]
    for name, flags, words in refusals:
        run = subprocess.run([data_samples] + base + common + flags, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        refused = run.returncode != 0 and words in run.stderr and "data-order megatron" in \
            run.stderr
        print("refused (%s): %s %s" % (name, refused, run.stderr.strip()))
        ok &= refused

    # megaw: DP 2 gives DP 1's losses, and they are not file order's
    model = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
             "--seq-length", "16", "--micro-batch-size", "1", "--global-batch-size", "4",
             "--train-iters", "6", "--lr", "1e-2", "--tokenizer-type", "NullTokenizer",
             "--vocab-size", str(VOCAB), "--data-path", P["mid"], "--split", "100,0,0"]
    # and with --data-cache-path at DP 2: the two ranks start together, one
    # builds the index and the other reads it
    losses = {}
    for label, order, world, extra in (
            ("megatron dp1", "megatron", 1, []), ("megatron dp2", "megatron", 2, []),
            ("file dp1", "file", 1, []),
            ("megatron dp2 cached", "megatron", 2,
             ["--data-cache-path", os.path.join(work, "megaw-cache")])):
        res = ranks.launch(megaw, world, model + ["--data-order", order] + extra, work,
                           timeout=100)
        if any(rc != 0 for rc, _, _ in res):
            print("megaw %s failed: %s" % (label, [e for _, _, e in res]))
            return 1
        losses[label] = [s["loss"] for s in res[0][1] if "loss" in s]
        print("megaw %s: %s" % (label, losses[label]))
        if extra:
            notes = sorted(m.groups() for _, _, e in res
                           for m in [re.search(r"(\d+) index(?:es)? read from --data-cache-"
                                               r"path, (\d+) built", e)] if m)
            once = notes == [("0", "1"), ("1", "0")]
            print("megaw %s: the ranks' (read, built) %s: %s" % (label, notes,
                                                                 "built once" if once else
                                                                 "NOT BUILT ONCE"))
            ok &= once and losses[label] == losses["megatron dp2"]
    def close(a, b):  # the layouts' tolerance (tests/engine/ranks.py): DP sums in its order
        return len(a) == len(b) == 6 and all(abs(x - y) <= ranks.RTOL * abs(x)
                                             for x, y in zip(a, b))
    layout_same = close(losses["megatron dp1"], losses["megatron dp2"])
    file_differs = not close(losses["megatron dp1"], losses["file dp1"])
    ok &= layout_same and file_differs
    print("megaw: DP 2 %s DP 1 within %g, Megatron's order %s file order"
          % ("equals" if layout_same else "DIFFERS FROM", ranks.RTOL,
             "differs from" if file_differs else "EQUALS"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
