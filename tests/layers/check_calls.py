#!/usr/bin/python3
"""No files call each other in a circle, read from the compiled objects.

    check_calls.py BUILD ROOT        the objects of the build at BUILD (its
                                     compile_commands.json) of the tree at ROOT
    check_calls.py --self-test       compiles small trees and shows that each
                                     kind of mistake is caught

A file calls another when its object refers to a function that the other's
object defines (nm: U in one, T in the other): a call, or a function taken
as a callback. The calls of the whole tree make one graph; it fails on:
  - files that reach each other through calls (a cycle, through any number
    of files, in one folder or across), named with the functions of each
    call, unless the pair is one level in two files: a line of
    calls_allowed.txt (beside this file), which says why;
  - a line of calls_allowed.txt without a reason, naming a file that is not
    in the tree, or a pair that no longer calls each other both ways;
  - an object that is missing or older than its source (the check would
    read an old graph): the build did not make it.

The files of layers that may include anything (tests, benchmarks: programs
that nothing calls) are left out, and so are objects built only for them.
"""
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_layers import Table  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEFINED = "T"  # a function defined in the object's text, global


def objects(build, root, table):
    """{source: [object...]} for the tree's own sources (not generated ones,
    not the programs' over everything), and the problems of the objects."""
    path = os.path.join(build, "compile_commands.json")
    try:
        with open(path) as f:
            entries = json.load(f)
    except (OSError, ValueError) as e:
        return {}, ["%s: %s (BUILD must be a meson build directory)" % (path, e)]
    root, build = os.path.realpath(root), os.path.realpath(build)
    out, stale = collections.defaultdict(list), collections.defaultdict(list)
    for e in entries:
        src = os.path.realpath(os.path.join(e["directory"], e["file"]))
        obj = os.path.realpath(os.path.join(e["directory"], e["output"]))
        rel = os.path.relpath(src, root)
        if rel.startswith("..") or src.startswith(build + os.sep):
            continue  # outside the tree, or generated
        target = os.path.relpath(obj, build).split(".p/")[0]
        if over_everything(table, rel) or over_everything(table, target):
            continue
        if not os.path.exists(obj) or os.path.getmtime(obj) < os.path.getmtime(src):
            stale[target].append(rel)
            continue
        out[rel].append(obj)
    problems = ["%s: %d object(s) missing or older than their source (%s%s): build it "
                "(meson compile), and if meson test did not, add that target to depends in "
                "tests/layers/meson.build" % (t, len(s), ", ".join(s[:3]),
                                              ", ..." if len(s) > 3 else "")
                for t, s in sorted(stale.items())]
    if not out and not problems:
        problems.append("%s lists no object of the tree's sources" % path)
    return out, problems


def over_everything(table, path):
    layer = table.layer_of(path)
    return layer is not None and "*" in table.allowed[layer]


def symbols(objs):
    """{source: defined}, {source: undefined}, {source: targets} from nm."""
    defined, undefined = collections.defaultdict(set), collections.defaultdict(set)
    src_of = {o: s for s, os_ in objs.items() for o in os_}
    names = sorted(src_of)
    nm = os.environ.get("NM", "nm")
    for i in range(0, len(names), 200):
        r = subprocess.run([nm, "-A", "-P"] + names[i:i + 200], capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit("%s failed: %s" % (nm, r.stderr.strip()))
        for line in r.stdout.splitlines():
            obj, _, rest = line.partition(": ")
            words = rest.split()
            if len(words) < 2 or obj not in src_of:
                continue
            if words[1] == DEFINED:
                defined[src_of[obj]].add(words[0])
            elif words[1] == "U":
                undefined[src_of[obj]].add(words[0])
    return defined, undefined


def graph(objs):
    """{caller: {callee: {function...}}}. A function defined by several
    sources is taken from those built into the same target as the caller."""
    defined, undefined = symbols(objs)
    definers = collections.defaultdict(set)
    for s, names in defined.items():
        for n in names:
            definers[n].add(s)
    targets = {s: {os.path.dirname(o) for o in obs} for s, obs in objs.items()}
    edges = collections.defaultdict(lambda: collections.defaultdict(set))
    for s, names in undefined.items():
        for n in names:
            ds = definers.get(n, set()) - {s}
            near = {d for d in ds if targets[d] & targets[s]}
            for d in near or ds:
                edges[s][d].add(n)
    return edges


def read_allowed(text, sources, root, edges):
    """The pairs of calls_allowed.txt, and its problems."""
    pairs, problems = [], []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        left, _, why = line.partition(":")
        files = left.split()
        if len(files) != 2 or not why.strip():
            problems.append("calls_allowed.txt:%d: expected FILE FILE : why they are one level "
                            "in two files" % n)
            continue
        missing = [f for f in files if not os.path.isfile(os.path.join(root, f))]
        if missing:
            problems.append("calls_allowed.txt:%d: %s is not in the tree" % (n, missing[0]))
            continue
        a, b = files
        if a not in sources or b not in sources:
            continue  # not built in this configuration
        if not (edges[a].get(b) and edges[b].get(a)):
            problems.append("calls_allowed.txt:%d: %s and %s no longer call each other both "
                            "ways; remove the line" % (n, a, b))
            continue
        pairs.append((a, b))
    return pairs, problems


def cycles(edges, sources, pairs):
    """The cycles left once each allowed pair counts as one file."""
    group = {s: s for s in sources}

    def find(s):
        while group[s] != s:
            s = group[s]
        return s
    for a, b in pairs:
        group[find(a)] = find(b)
    members = collections.defaultdict(list)
    for s in sources:
        members[find(s)].append(s)
    g = collections.defaultdict(lambda: collections.defaultdict(set))
    for a, outs in edges.items():
        for b, names in outs.items():
            if find(a) != find(b):
                g[find(a)][find(b)] |= {(a, b, n) for n in names}
    found = []
    for comp in components(g, sorted(members)):
        if len(comp) > 1:
            found.append(describe(g, comp, members))
    return found


def components(g, nodes):
    """Tarjan's strongly connected components, without recursion."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(g[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(sorted(comp))
    return out


def describe(g, comp, members):
    """One shortest cycle of the component, each call with its functions."""
    inside, start = set(comp), comp[0]
    prev, frontier = {start: None}, [start]
    while frontier:  # breadth first from start: the shortest way back to it
        v = frontier.pop(0)
        for w in sorted(g[v]):
            if w in inside and w not in prev:
                prev[w] = v
                frontier.append(w)
    last = min((v for v in prev if start in g[v]), key=lambda v: (depth(prev, v), v))
    path = [last]
    while prev[path[-1]] is not None:
        path.append(prev[path[-1]])
    path.reverse()
    steps = []
    for a, b in zip(path, path[1:] + [start]):
        calls = collections.defaultdict(set)
        for caller, callee, n in g[a][b]:
            calls[(caller, callee)].add(n)
        steps += ["%s calls %s%s of %s" % (caller, ", ".join(demangle(sorted(ns)[:4])),
                                            ", ..." if len(ns) > 4 else "", callee)
                  for (caller, callee), ns in sorted(calls.items())]
    names = ["+".join(sorted(members[c])) for c in comp]
    return ("files that call each other in a circle: %s.\n    %s\n    Move what the lower one "
            "needs down into it, or let the higher one register a callback the lower one "
            "calls; if they are one level in two files, list them in "
            "tests/layers/calls_allowed.txt with why"
            % (", ".join(names), ";\n    ".join(steps)))


def depth(prev, v):
    n = 0
    while prev[v] is not None:
        v, n = prev[v], n + 1
    return n


def demangle(names):
    tool = shutil.which("c++filt")
    if not tool or not any(n.startswith("_Z") for n in names):
        return names
    r = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True)
    out = r.stdout.splitlines()
    return [o.split("(")[0] for o in out] if r.returncode == 0 and len(out) == len(names) \
        else names


def check(build, root, table_text, allowed_text):
    table = Table(table_text)
    if table.errors:
        return table.errors, 0
    objs, problems = objects(build, root, table)
    if not objs:
        return problems, 0
    edges = graph(objs)
    pairs, bad = read_allowed(allowed_text, set(objs), root, edges)
    return problems + bad + cycles(edges, set(objs), pairs), len(objs)


def self_test():
    """Each kind of mistake in a small tree, compiled here, and a clean one."""
    table = "low low/ :\nmid mid/ : low\ntests tests/ : *\n"
    clean = {"low/a.c": "void a(void) {}\n",
             "low/b.c": "void a(void); void b(void) { a(); }\n",
             "mid/c.c": "void b(void); static void (*keep)(void) = b; void c(void) { keep(); }\n",
             "tests/t.c": "void c(void); void u(void); void t(void) { c(); u(); }\n",
             "tests/u.c": "void t(void); void u(void) {} int main(void) { t(); return 0; }\n"}
    pair = dict(clean, **{"low/a.c": "void b(void); void a(void) { b(); }\n"})
    up = dict(clean, **{"low/a.c": "void c(void); void a(void) { c(); }\n"})
    around = dict(clean, **{"low/a.c": "void b(void); void c(void); void a(void) { b(); c(); }\n"})
    cases = {
        "clean (the tests' circle is theirs)": (clean, "", 0),
        "a pair": (pair, "", 1),
        "a pair, allowed": (pair, "low/a.c low/b.c : one level\n", 0),
        "a pair allowed, no reason": (pair, "low/a.c low/b.c :\n", 2),
        "allowed, but no cycle": (clean, "low/a.c low/b.c : one level\n", 1),
        "allowed, not in the tree": (clean, "low/a.c low/z.c : one level\n", 1),
        "three files, across folders": (up, "", 1),
        "around an allowed pair": (around, "low/a.c low/b.c : one level\n", 1),
        "a stale object": (clean, "", 1),
    }
    cc = os.environ.get("CC", "cc").split()
    failed, built, cache = 0, {}, tempfile.mkdtemp()
    for name, (tree, allowed, want) in cases.items():
        with tempfile.TemporaryDirectory() as d:
            build, entries = os.path.join(d, "build"), []
            for p, text in tree.items():
                os.makedirs(os.path.dirname(os.path.join(d, p)), exist_ok=True)
                with open(os.path.join(d, p), "w") as f:
                    f.write(text)
                out = "%s/lib.a.p/%s.o" % (os.path.dirname(p), os.path.basename(p))
                os.makedirs(os.path.dirname(os.path.join(build, out)), exist_ok=True)
                if text not in built:  # each text compiled once
                    built[text] = os.path.join(cache, "%d.o" % len(built))
                    subprocess.run(cc + ["-c", "-O2", "-x", "c", "-", "-o", built[text]],
                                   input=text, text=True, check=True)
                shutil.copyfile(built[text], os.path.join(build, out))
                entries.append({"directory": build, "file": "../" + p, "output": out})
            with open(os.path.join(build, "compile_commands.json"), "w") as f:
                json.dump(entries, f)
            if name == "a stale object":
                os.utime(os.path.join(build, entries[0]["output"]), (1, 1))
            got, _ = check(build, d, table, allowed)
        ok = len(got) == want
        failed += not ok
        print("%s %-36s %d problem(s)%s" % ("ok  " if ok else "FAIL", name, len(got),
                                           "" if not got else ": " + got[0]))
    shutil.rmtree(cache)
    return 1 if failed else 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    build, root = sys.argv[1:]
    with open(os.path.join(HERE, "layers.txt")) as f:
        table_text = f.read()
    with open(os.path.join(HERE, "calls_allowed.txt")) as f:
        allowed_text = f.read()
    problems, n = check(build, root, table_text, allowed_text)
    for p in problems:
        print(p)
    print("%d source files, %d problems" % (n, len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
