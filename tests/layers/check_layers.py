#!/usr/bin/python3
"""Every #include against the layer table (layers.txt, beside this file).

    check_layers.py ROOT             check the tree at ROOT (the default suite)
    check_layers.py --self-test      show that the check catches each kind of
                                     mistake, on small trees made for it

It fails, naming the file and line, on:
  - an include of a header in a layer the including file's layer may not
    include (one above it, or a sibling the table does not allow);
  - a source file (.c .h .cc .hh .cu) that no layer of the table claims;
  - a file at the top of the tree other than the few that belong there
    (a stray dump or log committed by mistake);
  - a table whose layer allows a layer written after it (the table is
    bottom up, so a circle cannot be written down) or one that does not exist.

Includes in quotes are resolved beside the including file first, then from
ROOT; headers that the build generates (proto/mega.pb-c.h, ...) belong to
the layer of their folder. Includes in <> are the system's and not checked.
"""
import fnmatch
import os
import re
import subprocess
import sys
import tempfile

SOURCES = (".c", ".h", ".cc", ".hh", ".cu")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
# The files that belong at the top (besides any the table claims); everything
# else lives in a folder.
TOP_FILES = {".gitignore", "CONTRIBUTING.md", "README.md", "meson.build", "meson_options.txt"}


class Table:
    """layers.txt: LAYER PATTERN... : ALLOWED..., bottom up (an indented line
    goes on with the allowed list of the line before). A pattern ending
    in / is a folder (everything under it); otherwise a glob of paths. A file
    belongs to the layer whose pattern matches it most specifically. ALLOWED
    names layers written above the line, specific headers, or * (anything:
    only for programs nothing includes, like the tests)."""

    def __init__(self, text):
        self.order, self.patterns, self.allowed, self.errors = [], [], {}, []
        lines = []  # (number, text), continuation lines joined to their layer's
        for n, raw in enumerate(text.splitlines(), 1):
            line = raw.split("#", 1)[0].rstrip()
            if not line.strip():
                continue
            if raw[0].isspace() and lines and ":" not in line:
                lines[-1] = (lines[-1][0], lines[-1][1] + " " + line.strip())
            else:
                lines.append((n, line.strip()))
        for n, line in lines:
            if ":" not in line:
                self.errors.append("layers.txt:%d: no ':' between the paths and what the layer "
                                   "may include" % n)
                continue
            left, right = line.split(":", 1)
            words = left.split()
            if len(words) < 2:
                self.errors.append("layers.txt:%d: a layer needs a name and a path" % n)
                continue
            name, pats, allow = words[0], words[1:], right.split()
            if name in self.allowed:
                self.errors.append("layers.txt:%d: layer %s twice" % (n, name))
            for a in allow:
                if a != "*" and "/" in a and a.endswith(SOURCES):
                    continue  # one header of another layer
                if a != "*" and a not in self.allowed:
                    self.errors.append("layers.txt:%d: %s may include %s, which is not a layer "
                                       "written above it (the table is bottom up)" % (n, name, a))
            self.order.append(name)
            self.allowed[name] = set(allow)
            self.patterns += [(p, name) for p in pats]

    def layer_of(self, path):
        best, score = None, -1
        for pat, name in self.patterns:
            if pat.endswith("/"):
                hit = path.startswith(pat)
                s = len(pat) if hit else -1
            else:
                # a * stays within one folder
                hit = fnmatch.fnmatchcase(path, pat) and path.count("/") == pat.count("/")
                s = len(pat) + 1000 if hit else -1  # a file pattern beats a folder
            if hit and s > score:
                best, score = name, s
        return best

    def may(self, layer, other, header):
        a = self.allowed[layer]
        return layer == other or "*" in a or other in a or header in a


def tracked_files(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True,
                             check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: the files, less builds
        out = []
        for d, dirs, fs in os.walk(root):
            dirs[:] = [x for x in dirs if not x.startswith((".", "build"))]
            out += [os.path.relpath(os.path.join(d, f), root) for f in fs]
    return out


def sources(root):
    return sorted(p for p in tracked_files(root)
                  if p.endswith(SOURCES) and os.path.isfile(os.path.join(root, p)))


def check(root, table_text):
    t = Table(table_text)
    problems = list(t.errors)
    if problems:
        return problems
    problems += ["%s: a file at the top of the tree; move it into the folder it belongs to, "
                 "or delete it if it was committed by mistake" % f
                 for f in sorted(tracked_files(root))
                 if "/" not in f and f not in TOP_FILES and t.layer_of(f) is None]
    files = sources(root)
    tracked = set(files)
    for f in files:
        layer = t.layer_of(f)
        if layer is None:
            problems.append("%s: in no layer of tests/layers/layers.txt; add its folder there" % f)
            continue
        with open(os.path.join(root, f), errors="replace") as fh:
            for n, line in enumerate(fh, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                inc = m.group(1)
                beside = os.path.normpath(os.path.join(os.path.dirname(f), inc))
                target = beside if beside in tracked else inc
                other = t.layer_of(target)
                if other is None:
                    problems.append("%s:%d: includes \"%s\", which no layer claims" % (f, n, inc))
                elif not t.may(layer, other, target):
                    problems.append("%s:%d: %s includes \"%s\" of %s, which tests/layers/"
                                    "layers.txt does not allow %s" % (f, n, layer, inc, other,
                                                                      direction(t, layer, other)))
    return problems


def direction(t, layer, other):
    if depends(t, other, layer):
        return "(it is above: call down, or publish an event to a callback that layer registers)"
    if t.order.index(other) < t.order.index(layer):
        return "(it is below but not in the list: add it there if that direction is right)"
    return "(a sibling: add it to the table, above this layer, if that direction is right)"


def depends(t, a, b):
    """Whether layer a may reach layer b through the table's allowed lists."""
    seen, todo = set(), [a]
    while todo:
        x = todo.pop()
        if x == b:
            return True
        if x in seen or x not in t.allowed:
            continue
        seen.add(x)
        todo += [y for y in t.allowed[x] if y != "*"]
    return False


def self_test():
    """Each kind of mistake in a small tree, and a clean tree that passes."""
    table = ("low   low/ :\n"
             "mid   mid/ : low\n"
             "side  side/ : low\n"
             "top   top/ top.c : mid side low/one.h\n"
             "tests tests/ : *\n")
    cases = {
        "clean": ({"low/a.h": "", "mid/b.c": '#include "low/a.h"\n',
                   "top.c": '#include "mid/b.h"\n#include <stdio.h>\n', "mid/b.h": "",
                   "tests/t.c": '#include "top/x.h"\n#include "local.h"\n',
                   "tests/local.h": "", "top/x.h": ""}, table, 0),
        "up": ({"low/a.h": '#include "mid/b.h"\n', "mid/b.h": ""}, table, 1),
        "sibling": ({"mid/b.c": '#include "side/c.h"\n', "side/c.h": ""}, table, 1),
        "one header": ({"top/t.c": '#include "low/one.h"\n#include "low/two.h"\n',
                        "low/one.h": "", "low/two.h": ""}, table, 1),
        "unclaimed file": ({"elsewhere/z.c": ""}, table, 1),
        "a glob stays in its folder": ({"top.c": "", "top/x/y.c": "", "top2/z.c": ""},
                                       "top top.c top/*.c :\n", 2),
        "include into tests": ({"top/t.c": '#include "tests/h.h"\n', "tests/h.h": ""}, table, 1),
        "a stray file at the top": ({"README.md": "", "m0.txt": "", "low/a.h": ""}, table, 1),
        "table allows a layer above": ({"low/a.h": ""}, "low low/ : mid\nmid mid/ : low\n", 1),
    }
    failed = 0
    for name, (tree, tab, want) in cases.items():
        with tempfile.TemporaryDirectory() as d:
            for p, text in tree.items():
                os.makedirs(os.path.dirname(os.path.join(d, p)), exist_ok=True)
                with open(os.path.join(d, p), "w") as f:
                    f.write(text)
            got = check(d, tab)
        ok = (len(got) == want)
        failed += not ok
        print("%s %-28s %d problem(s)%s" % ("ok  " if ok else "FAIL", name, len(got),
                                           "" if not got else ": " + got[0]))
    return 1 if failed else 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    root = sys.argv[1]
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "layers.txt")) as f:
        problems = check(root, f.read())
    for p in problems:
        print(p)
    print("%d source files, %d problems" % (len(sources(root)), len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
