#!/usr/bin/python3
"""The cuda module's fatbinary holds what the build promises: sm_90 and
sm_80 machine code (cubin ELF entries) and compute_90 PTX, which newer GPUs
JIT. There is no cuobjdump here, so the .nv_fatbin section is extracted with
objcopy and its entries read from the fatbinary's own headers:

  file header   u32 magic 0xBA55ED50, u16 version, u16 header size,
                u64 size of the entries that follow
  entry header  u16 kind (1 PTX, 2 ELF), u16 version, u32 header size,
                u64 padded payload size, ... u32 architecture at byte 28

usage: check_fatbin.py OBJCOPY LIBMEGA_CUDA_SO
"""
import os
import struct
import subprocess
import sys
import tempfile


def entries(blob):
    off, out = 0, []
    while off + 16 <= len(blob):
        magic, _, hsize, fsize = struct.unpack_from("<IHHQ", blob, off)
        if magic != 0xBA55ED50:
            raise SystemExit("no fatbinary header at byte %d (magic %#x)" % (off, magic))
        p, end = off + hsize, off + hsize + fsize
        while p < end:
            kind, _, ehsize, padded = struct.unpack_from("<HHIQ", blob, p)
            arch = struct.unpack_from("<I", blob, p + 28)[0]
            out.append(({1: "PTX", 2: "ELF"}.get(kind, "kind %d" % kind), arch))
            p += ehsize + padded
        off = end
    return out


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    objcopy, lib = sys.argv[1:]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "fatbin")
        subprocess.run([objcopy, "-O", "binary", "--only-section=.nv_fatbin", lib, out],
                       check=True)
        blob = open(out, "rb").read()
    found = entries(blob)
    print("entries:", ", ".join("%s sm_%d" % e for e in found))
    want = [("ELF", 90), ("PTX", 90), ("ELF", 80)]
    missing = [w for w in want if w not in found]
    if missing:
        print("missing:", ", ".join("%s sm_%d" % m for m in missing))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
