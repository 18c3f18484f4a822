#!/usr/bin/python3
"""megaw reads Megatron's indexed datasets (MMIDIDX) as the format says.

Writes PREFIX.bin/PREFIX.idx pairs from the format alone (no Megatron
code): the same text as a plain file's bytes, cut into several documents
of uneven length, once as uint16 tokens (dtype code 8) and once as int32
(code 4). With --tokenizer-type NullTokenizer --vocab-size 255 the
vocabulary is 256 ids, as the byte tokenizer's, so the model is the same,
and since the sequences' tokens concatenated in index order are the
stream, each run must print exactly the plain file's losses. Megatron's
one-file blend (--data-path 1.0 PREFIX) must too, and so must
--train-data-path PREFIX, whose --valid-data-path evaluation reports an
evaluation loss.

  /usr/bin/python3 indexed_check.py MEGAW WORKDIR
"""
import json
import os
import struct
import subprocess
import sys

DTYPES = {"uint16": (8, "<H"), "int32": (4, "<i")}


def write_mmidx(prefix, docs, dtype):
    """Megatron's MMIDIDX: .bin holds the tokens; .idx the magic, version 1,
    the dtype code, the sequence and document counts, the sequence lengths
    (int32), pointers (int64 byte offsets) and document indices (int64)."""
    code, fmt = DTYPES[dtype]
    size = struct.calcsize(fmt)
    lengths, pointers, offset = [], [], 0
    with open(prefix + ".bin", "wb") as f:
        for d in docs:
            f.write(b"".join(struct.pack(fmt, t) for t in d))
            lengths.append(len(d))
            pointers.append(offset)
            offset += len(d) * size
    doc_idx = list(range(len(docs) + 1))
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(docs)))
        f.write(struct.pack("<Q", len(doc_idx)))
        f.write(struct.pack("<%di" % len(lengths), *lengths))
        f.write(struct.pack("<%dq" % len(pointers), *pointers))
        f.write(struct.pack("<%dq" % len(doc_idx), *doc_idx))


def steps(cmd):
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE).stdout.decode()
    return [json.loads(line) for line in out.strip().splitlines()]


def losses(cmd):
    return [s["loss"] for s in steps(cmd)]


def main():
    megaw, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    text = (b"It was the best of times, it was the worst of times; " * 40 + bytes(range(256)))
    plain = os.path.join(work, "plain.txt")
    with open(plain, "wb") as f:
        f.write(text)
    # documents of uneven length, so windows cross their borders
    docs, at, k = [], 0, 0
    while at < len(text):
        n = 37 + (k * 53) % 211
        docs.append(list(text[at:at + n]))
        at, k = at + n, k + 1
    flags = [megaw, "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
             "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "4",
             "--train-iters", "4", "--lr", "1e-2", "--json"]
    want = losses(flags + ["--data-path", plain])
    ok = True
    for dtype in DTYPES:
        prefix = os.path.join(work, "text_" + dtype)
        write_mmidx(prefix, docs, dtype)
        null = ["--tokenizer-type", "NullTokenizer", "--vocab-size", "255"]
        for data in (["--data-path", prefix], ["--data-path", "1.0", prefix]):
            got = losses(flags + null + data)
            same = got == want
            ok &= same
            print(f"{dtype} {len(docs)} documents, {' '.join(data[1:-1]) or 'prefix'}: "
                  f"{'same losses' if same else 'DIFFERENT'} {got} vs {want}")
    prefix = os.path.join(work, "text_uint16")
    got = steps(flags + null + ["--train-data-path", prefix, "--valid-data-path", prefix,
                                "--eval-interval", "2", "--eval-iters", "1"])
    same = [s["loss"] for s in got] == want
    evals = [s["iteration"] for s in got if "eval_loss" in s]
    ok &= same and evals == [2, 4]
    print(f"--train-data-path, --valid-data-path: {'same losses' if same else 'DIFFERENT'}, "
          f"evaluation losses at iterations {evals}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
