#!/usr/bin/python3
"""tools/preprocess makes its output durable before naming it: each of
PREFIX.bin.tmp and PREFIX.idx.tmp is fsynced before its rename to the final
name, and the directory after both renames, so a crash or power loss never
leaves an empty or partial .bin/.idx under the final name. Watched with
strace -y (each fd shown with its path); skipped (77) without strace or
where ptrace is refused.

  /usr/bin/python3 preprocess_sync.py PREPROCESS WORKDIR
"""
import json
import os
import re
import shutil
import subprocess
import sys

from bpe_check import B2U


def main():
    preprocess, work = sys.argv[1:3]
    strace = shutil.which("strace")
    if not strace or subprocess.run([strace, "-o", os.devnull, "true"]).returncode:
        print("skipped: no working strace")
        return 77
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    work = os.path.realpath(work)
    vocab = {c: i for i, c in enumerate(B2U.values())}  # the 256 byte tokens, no merges
    vf, mf = os.path.join(work, "vocab.json"), os.path.join(work, "merges.txt")
    json.dump(vocab, open(vf, "w", encoding="utf-8"), ensure_ascii=False)
    open(mf, "w").write("#version: 0.2\n")
    text = os.path.join(work, "docs.txt")
    open(text, "w").write("one document\n\nanother\n")
    prefix = os.path.join(work, "out")
    log = os.path.join(work, "strace.txt")
    subprocess.run([strace, "-f", "-y", "-o", log, "-e", "trace=fsync,fdatasync,rename,renameat,"
                    "renameat2", preprocess, "--input", text, "--output-prefix", prefix,
                    "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vf,
                    "--merge-file", mf], check=True, stdout=subprocess.DEVNULL)
    calls = []
    for line in open(log):
        m = re.search(r"(fsync|fdatasync)\(\d+<([^>]*)>\) = 0", line)
        if m:
            calls.append(("sync", m.group(2)))
        m = re.search(r"rename(?:at2?)?\(.*?\"([^\"]*)\".*?\"([^\"]*)\"", line)
        if m and " = 0" in line:
            calls.append(("rename", os.path.basename(m.group(2))))
    print("\n".join(f"  {c} {p}" for c, p in calls))
    ok = True
    base = os.path.basename(prefix) + "_text_document"
    for ext in (".bin", ".idx"):
        tmp = os.path.join(work, base + ext + ".tmp")
        r = calls.index(("rename", base + ext)) if ("rename", base + ext) in calls else -1
        s = calls.index(("sync", tmp)) if ("sync", tmp) in calls else -1
        if r < 0 or s < 0 or s > r:
            print(f"FAIL: {tmp} is not fsynced before its rename to {base + ext}")
            ok = False
    last = max((i for i, c in enumerate(calls) if c[0] == "rename"), default=-1)
    if not any(c == ("sync", work) for c in calls[last + 1:]):
        print(f"FAIL: {work} (the directory) is not fsynced after the renames")
        ok = False
    print("ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
