#!/usr/bin/python3
"""GPT-2's byte-level BPE in tools/preprocess and megaw generate, against
OpenAI's algorithm (encoder.py) restated here.

No vocabulary ships with mega, so this test learns a tiny one: GPT-2's
byte-to-unicode table, the 256 byte tokens, 80 merges learned from a small
corpus, and <|endoftext|>, written as vocab.json and merges.txt. Then:
tools/preprocess turns JSON lines (and plain text) into an MMIDIDX pair,
read back here from the format, and every document's ids must equal the
reference encoding (plus <|endoftext|> with --append-eod). Finally a model
trained on those ids continues a prompt with megaw generate through the
same tokenizer.

  /usr/bin/python3 bpe_check.py PREPROCESS MEGAW WORKDIR
"""
import collections
import json
import os
import re
import struct
import subprocess
import sys

# GPT-2's pattern with Python's re: letters as [^\W\d_], numbers ASCII
PAT = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?[0-9]+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+""")


def bytes_to_unicode():
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


B2U = bytes_to_unicode()
U2B = {u: b for b, u in B2U.items()}


def spell(text):
    return ["".join(B2U[b] for b in m.encode()) for m in PAT.findall(text)]


def learn(corpus, merges):
    words = collections.Counter(w for t in corpus for w in spell(t))
    words = {tuple(w): c for w, c in words.items()}
    out = []
    for _ in range(merges):
        pairs = collections.Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        out.append(best)
        new = {}
        for w, c in words.items():
            i, nw = 0, []
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    nw.append(w[i] + w[i + 1])
                    i += 2
                else:
                    nw.append(w[i])
                    i += 1
            new[tuple(nw)] = new.get(tuple(nw), 0) + c
        words = new
    return out


def bpe(token, ranks):
    """OpenAI's encoder.py Encoder.bpe."""
    word = tuple(token)
    pairs = set(zip(word, word[1:]))
    while pairs:
        bigram = min(pairs, key=lambda p: ranks.get(p, float("inf")))
        if bigram not in ranks:
            break
        first, second = bigram
        new, i = [], 0
        while i < len(word):
            try:
                j = word.index(first, i)
            except ValueError:
                new.extend(word[i:])
                break
            new.extend(word[i:j])
            i = j
            if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                new.append(first + second)
                i += 2
            else:
                new.append(word[i])
                i += 1
        word = tuple(new)
        if len(word) == 1:
            break
        pairs = set(zip(word, word[1:]))
    return word


def encode(text, vocab, ranks):
    return [vocab[p] for tok in spell(text) for p in bpe(tok, ranks)]


def read_mmidx(prefix, docs_out=None):
    """The dtype code and every sequence's ids; Megatron's document indices
    into docs_out (a list) when given, else they must be one a sequence."""
    idx = open(prefix + ".idx", "rb").read()
    assert idx[:9] == b"MMIDIDX\x00\x00", idx[:9]
    version, code, nseq, ndoc = struct.unpack("<QBQQ", idx[9:34])
    assert version == 1
    fmt = {8: "H", 4: "i"}[code]
    lengths = struct.unpack("<%di" % nseq, idx[34:34 + 4 * nseq])
    ptrs = struct.unpack("<%dq" % nseq, idx[34 + 4 * nseq:34 + 12 * nseq])
    docs = struct.unpack("<%dq" % ndoc, idx[34 + 12 * nseq:34 + 12 * nseq + 8 * ndoc])
    if docs_out is None:
        assert list(docs) == list(range(nseq + 1)), docs
    else:
        docs_out[:] = docs
    binary = open(prefix + ".bin", "rb").read()
    size = struct.calcsize(fmt)
    return code, [list(struct.unpack("<%d%s" % (n, fmt), binary[p:p + n * size]))
                  for n, p in zip(lengths, ptrs)]


def check_failed_run(preprocess, tok, work, good):
    """A run that fails on a bad line writes no dataset of the lines before
    it: the prefix's earlier dataset stays as it was, and nothing else."""
    bad = os.path.join(work, "bad.jsonl")
    with open(bad, "w", encoding="utf-8") as f:
        f.write('{"text": "one"}\n{"text": "two"}\nnot json\n')
    out = os.path.join(work, "failed")
    before = {}
    for ext in (".bin", ".idx"):
        with open(good + ext, "rb") as src, open(out + "_text_document" + ext, "wb") as dst:
            before[ext] = src.read()
            dst.write(before[ext])
    r = subprocess.run([preprocess, "--input", bad, "--output-prefix", out] + tok,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    kept = all(open(out + "_text_document" + ext, "rb").read() == data
               for ext, data in before.items())
    left = sorted(n for n in os.listdir(work) if n.startswith("failed") and "tmp" in n)
    fine = r.returncode != 0 and b"line 3" in r.stderr and kept and not left
    print(f"a failed run: exit {r.returncode}, earlier dataset "
          f"{'kept' if kept else 'OVERWRITTEN'}, temporaries left: {left}")
    return fine


def check_unreadable(preprocess, tok, work):
    """An input that cannot be read (a directory) is an error, not an empty
    file's dataset of 0 documents."""
    out = os.path.join(work, "fromdir")
    r = subprocess.run([preprocess, "--input", work, "--output-prefix", out] + tok,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    written = os.path.exists(out + "_text_document.idx")
    print(f"a directory as --input: exit {r.returncode}, {r.stderr.decode().strip()!r}, "
          f"dataset {'WRITTEN' if written else 'not written'}")
    return r.returncode != 0 and b"Is a directory" in r.stderr and not written


def check_pipe(preprocess, tok, work, jsonl, want):
    """Input from a pipe, which cannot be rewound after the first line tells
    JSON lines from text, gives every document, the first one too."""
    out = os.path.join(work, "piped")
    with open(jsonl, "rb") as f:
        subprocess.run([preprocess, "--input", "/dev/stdin", "--output-prefix", out,
                        "--append-eod"] + tok, input=f.read(), check=True,
                       stdout=subprocess.DEVNULL)
    _, seqs = read_mmidx(out + "_text_document")
    print(f"JSON lines from a pipe: {len(seqs)} documents: "
          f"{'match' if seqs == want else 'DIFFERENT'}")
    return seqs == want


def check_bom(preprocess, tok, work, jsonl, want):
    """JSON lines saved with a UTF-8 byte order mark are JSON lines, not a
    plain text whose first document is the JSON's braces and quotes."""
    bom = os.path.join(work, "bom.jsonl")
    with open(jsonl, "rb") as f, open(bom, "wb") as g:
        g.write(b"\xef\xbb\xbf" + f.read())
    out = os.path.join(work, "bom")
    subprocess.run([preprocess, "--input", bom, "--output-prefix", out, "--append-eod"] + tok,
                   check=True, stdout=subprocess.DEVNULL)
    _, seqs = read_mmidx(out + "_text_document")
    print(f"JSON lines after a byte order mark: {len(seqs)} documents: "
          f"{'match' if seqs == want else 'DIFFERENT'}")
    return seqs == want


def check_missing_key(preprocess, tok, work):
    """A line without text under the key says which key it looked for, what
    the line has, and the flag that names another."""
    path = os.path.join(work, "keys.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        f.write('{"text": "a"}\n{"content": "b", "id": 2}\n')
    r = subprocess.run([preprocess, "--input", path, "--output-prefix",
                        os.path.join(work, "keys")] + tok,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    msg = r.stderr.decode()
    print(f"a line without the key: {msg.strip()!r}")
    return (r.returncode != 0 and "line 2" in msg and '"text"' in msg and '"content"' in msg
            and "--json-keys" in msg)


def check_empty_text(preprocess, tok, work, vocab, ranks, eod):
    """A document with no text is, as Megatron's preprocess_data.py writes
    it, a document of no sequence and no <|endoftext|>: Megatron's GPT
    dataset counts sequences, so an extra one would shift the data order."""
    src = os.path.join(work, "empty.jsonl")
    texts = ["first", "", "third", ""]
    with open(src, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": t}) + "\n" for t in texts)
    out = os.path.join(work, "empty")
    subprocess.run([preprocess, "--input", src, "--output-prefix", out, "--append-eod"] + tok,
                   check=True, stdout=subprocess.DEVNULL)
    docs = []
    _, seqs = read_mmidx(out + "_text_document", docs)
    want = [encode("first", vocab, ranks) + [eod], encode("third", vocab, ranks) + [eod]]
    ok = seqs == want and docs == [0, 1, 1, 2, 2]
    print(f"empty texts: {len(seqs)} sequences, document indices {docs}: "
          f"{'as Megatron writes them' if ok else 'DIFFERENT'}")
    return ok


def main():
    preprocess, megaw, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    corpus = [
        "The cat sat on the mat. The cat's hat is red, isn't it?",
        "Numbers: 1234 and 56, 7.89; symbols !!! ... and  two  spaces.\n\nNew paragraph\n",
        "Über café naïve straße — déjà vu, we'll see; they've gone, I'm here, you'd know.",
        "tabs\tand\nnewlines   \n  trailing spaces   ",
        "the the the cat cat mat hat sat on on the mat",
    ]
    merges = learn(corpus, 80)
    vocab = {B2U[b]: i for i, b in enumerate(sorted(B2U))}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    vocab["<|endoftext|>"] = len(vocab)
    ranks = {m: i for i, m in enumerate(merges)}
    vf, mf = os.path.join(work, "vocab.json"), os.path.join(work, "merges.txt")
    json.dump(vocab, open(vf, "w", encoding="utf-8"), ensure_ascii=False)
    with open(mf, "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    eod = vocab["<|endoftext|>"]
    ok = True

    jsonl = os.path.join(work, "docs.jsonl")
    with open(jsonl, "w", encoding="utf-8") as f:
        for t in corpus * 3:
            f.write(json.dumps({"text": t}) + "\n")
    out = os.path.join(work, "bpe")
    tok = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vf, "--merge-file", mf]
    subprocess.run([preprocess, "--input", jsonl, "--output-prefix", out, "--append-eod"] + tok,
                   check=True, stdout=subprocess.DEVNULL)
    code, seqs = read_mmidx(out + "_text_document")
    want = [encode(t, vocab, ranks) + [eod] for t in corpus * 3]
    ok &= code == 8 and seqs == want
    print(f"JSON lines: {len(seqs)} documents, uint16: "
          f"{'ids match the reference' if seqs == want else 'DIFFERENT'}")
    if seqs != want:
        for s, w, t in zip(seqs, want, corpus * 3):
            if s != w:
                print("  text", repr(t), "\n  got ", s, "\n  want", w)
                break

    text = os.path.join(work, "docs.txt")
    with open(text, "w", encoding="utf-8") as f:
        f.write("first document\nstill the first\n\n\nsecond one\n")
    subprocess.run([preprocess, "--input", text, "--output-prefix", out + "_plain"] + tok,
                   check=True, stdout=subprocess.DEVNULL)
    _, seqs = read_mmidx(out + "_plain_text_document")
    want = [encode("first document\nstill the first\n", vocab, ranks),
            encode("second one\n", vocab, ranks)]
    ok &= seqs == want
    print(f"plain text: {len(seqs)} documents: {'match' if seqs == want else 'DIFFERENT'}")

    ok &= check_failed_run(preprocess, tok, work, out + "_text_document")
    ok &= check_unreadable(preprocess, tok, work)
    ok &= check_pipe(preprocess, tok, work, jsonl,
                     [encode(t, vocab, ranks) + [eod] for t in corpus * 3])
    ok &= check_bom(preprocess, tok, work, jsonl,
                    [encode(t, vocab, ranks) + [eod] for t in corpus * 3])
    ok &= check_missing_key(preprocess, tok, work)
    ok &= check_empty_text(preprocess, tok, work, vocab, ranks, eod)
    # ids must be 0..n-1: one past the entries would be written (as uint16,
    # by the entry count) past the model's vocabulary
    sparse = os.path.join(work, "sparse.json")
    json.dump(dict(vocab, **{"<|endoftext|>": 70000}), open(sparse, "w", encoding="utf-8"),
              ensure_ascii=False)
    r = subprocess.run([preprocess, "--input", text, "--output-prefix", out + "_sparse",
                        "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", sparse,
                        "--merge-file", mf], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    said = r.stderr.decode("utf-8", "replace")
    refused = r.returncode != 0 and "needs an id from 0 to" in said
    ok &= refused
    print(f"a vocabulary with an id past its entries: {'refused' if refused else 'TAKEN'}: "
          f"{said.strip()}")

    # a model of these ids writes text through the same tokenizer
    save = os.path.join(work, "ckpt")
    subprocess.run(["rm", "-rf", save], check=True)
    subprocess.run([megaw, "--num-layers", "1", "--hidden-size", "16", "--num-attention-heads",
                    "2", "--seq-length", "16", "--micro-batch-size", "2",
                    "--global-batch-size", "2", "--train-iters", "2", "--lr", "1e-2",
                    "--tokenizer-type", "NullTokenizer", "--vocab-size", str(eod),
                    "--data-path", out + "_text_document", "--save", save],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    gen = subprocess.run([megaw, "generate", "--load", save, "--prompt", "The cat",
                          "--max-new-tokens", "6"] + tok, check=True,
                         stdout=subprocess.PIPE).stdout.decode("utf-8", "replace")
    ok &= gen.startswith("The cat") and gen.endswith("\n")
    print(f"megaw generate through the BPE: {gen!r}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
