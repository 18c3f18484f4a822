#!/usr/bin/python3
"""The cuda module's fatbinary holds what the build promises: sm_90 and
sm_80 machine code (cubin ELF entries) and compute_90 PTX, which newer GPUs
JIT, every one of them compressed (-Xfatbin=-compress-all: the driver
inflates them on load; uncompressed, the SASS alone took 6 MB of the device
kit's 60 MiB). There is no cuobjdump here, so the .nv_fatbin section is
extracted with objcopy and its entries read from the fatbinary's own headers:

  file header   u32 magic 0xBA55ED50, u16 version, u16 header size,
                u64 size of the entries that follow
  entry header  u16 kind (1 PTX, 2 ELF), u16 version, u32 header size,
                u64 padded payload size, ... u32 architecture at byte 28,
                u64 flags at byte 40 (0x8000: compressed), u64 size
                inflated at byte 56

usage: check_fatbin.py OBJCOPY LIBMEGA_CUDA_SO
"""
import os
import struct
import subprocess
import sys
import tempfile


COMPRESSED = 0x8000


def entries(blob):
    """[(kind, arch, compressed, stored bytes, inflated bytes)]"""
    off, out = 0, []
    while off + 16 <= len(blob):
        magic, _, hsize, fsize = struct.unpack_from("<IHHQ", blob, off)
        if magic != 0xBA55ED50:
            raise SystemExit("no fatbinary header at byte %d (magic %#x)" % (off, magic))
        p, end = off + hsize, off + hsize + fsize
        while p < end:
            kind, _, ehsize, padded = struct.unpack_from("<HHIQ", blob, p)
            arch = struct.unpack_from("<I", blob, p + 28)[0]
            flags = struct.unpack_from("<Q", blob, p + 40)[0]
            inflated = struct.unpack_from("<Q", blob, p + 56)[0]
            packed = bool(flags & COMPRESSED)
            out.append(({1: "PTX", 2: "ELF"}.get(kind, "kind %d" % kind), arch, packed, padded,
                        inflated if packed else padded))
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
    for kind, arch, packed, stored, inflated in found:
        print("%s sm_%d: %d bytes%s" % (kind, arch, stored,
                                         " (%d inflated)" % inflated if packed else ""))
    want = [("ELF", 90), ("PTX", 90), ("ELF", 80)]
    missing = [w for w in want if w not in [e[:2] for e in found]]
    if missing:
        print("missing:", ", ".join("%s sm_%d" % m for m in missing))
        return 1
    # ours only: a 1.5 KB sm_75 entry that names no source file of ours
    # comes uncompressed whatever the flags
    loose = [e for e in found if e[:2] in want and not e[2]]
    if loose:
        print("not compressed (build with -Xfatbin=-compress-all):",
              ", ".join("%s sm_%d" % e[:2] for e in loose))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
