#!/usr/bin/python3
"""systemd/megad.service with systemd/megad.conf.example, without systemd:

  - systemd-analyze verify accepts the unit (pointed at the built megad and
    a copy of the example configuration); skipped without systemd-analyze;
  - the unit's ExecStart, expanded as systemd expands it (${VAR} one word,
    even empty; $VAR split on whitespace; %S the state root, %d the
    credentials directory) with the example's values, starts the built
    megad: every flag the unit and the example pass exists and parses. Only
    what cannot work on a test machine is changed: loopback ports of the
    kernel's choice, the roots made under a temporary directory, megaw's
    path. SIGTERM (systemctl stop) then stops it with status 0.

  /usr/bin/python3 test_systemd.py SOURCE_ROOT MEGAD MEGAW
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

src, megad, megaw = (os.path.abspath(a) for a in sys.argv[1:4])
unit_path = os.path.join(src, "systemd", "megad.service")
conf_path = os.path.join(src, "systemd", "megad.conf.example")
fails = []


def check(what, ok, detail=""):
    print("%s: %s" % ("ok" if ok else "FAIL", what))
    if not ok:
        print("  " + detail.replace("\n", "\n  "))
        fails.append(what)


def unit_value(text, key):
    """A [Service] setting, its continuation lines joined."""
    m = re.search(r"^%s=((?:.*\\\n)*.*)$" % key, text, re.M)
    return re.sub(r"\\\n\s*", " ", m.group(1)) if m else None


def read_conf(path):
    env = {}
    for line in open(path):
        line = line.strip()
        if line and not line.startswith("#"):
            k, _, v = line.partition("=")
            env[k] = v
    return env


def expand(cmdline, env, specifiers):
    """systemd.service(5), "Command lines": ${VAR} is one word (an empty one
    too), a word that is $VAR alone splits on whitespace (none if empty)."""
    words = []
    for w in cmdline.split():
        for k, v in specifiers.items():
            w = w.replace(k, v)
        m = re.fullmatch(r"\$(\w+)", w)
        if m:
            words += env.get(m.group(1), "").split()
            continue
        words.append(re.sub(r"\$\{(\w+)\}", lambda g: env.get(g.group(1), ""), w))
    return words


tmp = tempfile.mkdtemp(prefix="mega-systemd-")
try:
    unit = open(unit_path).read()
    exec_start = unit_value(unit, "ExecStart")
    check("the unit has an ExecStart", exec_start is not None)

    # the example, made runnable here
    env = read_conf(conf_path)
    roots = env["MEGAD_ROOTS"].split()
    for i in range(1, len(roots), 2):
        roots[i] = os.path.join(tmp, roots[i].lstrip("/"))
        os.makedirs(roots[i])
    env["MEGAD_ROOTS"] = " ".join(roots)
    env["MEGAD_LISTEN"] = "127.0.0.1:0"
    env["MEGAD_OPTS"] = re.sub(r"--metrics-listen \S+", "--metrics-listen 127.0.0.1:0",
                               env["MEGAD_OPTS"])
    conf = os.path.join(tmp, "megad.conf")
    with open(conf, "w") as f:
        f.write("".join("%s=%s\n" % kv for kv in env.items()))

    analyze = shutil.which("systemd-analyze")
    if analyze:
        copy = os.path.join(tmp, "megad.service")
        with open(copy, "w") as f:
            f.write(unit.replace("/usr/bin/megad", megad)
                    .replace("EnvironmentFile=/etc/mega/megad.conf", "EnvironmentFile=" + conf))
        p = subprocess.run([analyze, "verify", copy], capture_output=True, text=True,
                           timeout=60)
        check("systemd-analyze verify accepts the unit", p.returncode == 0,
              p.stdout + p.stderr)
    else:
        print("skipped: systemd-analyze verify (no systemd-analyze)")

    cred = os.path.join(tmp, "credentials")
    os.makedirs(cred)
    for name, tok in (("token", "c3lzdGVtZC11bml0LXRlc3QtdG9rZW4="),
                      ("peer-token", "c3lzdGVtZC11bml0LXBlZXItdG9rZW4=")):
        with open(os.path.join(cred, name), "w") as f:
            f.write(tok + "\n")
        os.chmod(os.path.join(cred, name), 0o400)  # as LoadCredential= hands it over
    loaded = re.findall(r"^LoadCredential=([\w-]+):", unit, re.M)
    check("the unit loads the token and the peer token", loaded == ["token", "peer-token"],
          "LoadCredential= names %s" % loaded)
    argv = expand(exec_start, env, {"%S": os.path.join(tmp, "state"), "%d": cred})
    argv[0] = megad
    argv += ["--worker", megaw]
    log = open(os.path.join(tmp, "megad.log"), "w+")
    p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    up = False
    for _ in range(200):
        log.seek(0)
        text = log.read()
        if "listening on" in text or p.poll() is not None:
            up = "listening on" in text
            break
        time.sleep(0.05)
    check("the unit's ExecStart with the example's values starts megad", up,
          "argv: %s\n%s" % (argv, text))
    p.terminate()  # systemctl stop (KillMode=mixed: SIGTERM to megad first)
    try:
        rc = p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = p.wait()
    log.seek(0)
    text = log.read()
    check("SIGTERM stops it with status 0", up and rc == 0, "status %s\n%s" % (rc, text[-2000:]))
    # with both tokens, a client's token cannot act as a node, and megad does not warn so
    check("megad has the peer token", "serves clients and nodes alike" not in text, text[-2000:])
finally:
    shutil.rmtree(tmp, ignore_errors=True)

if fails:
    print("%d check(s) failed" % len(fails))
    sys.exit(1)
print("PASS")
