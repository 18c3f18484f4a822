#!/usr/bin/python3
"""The web view's login and live streams against a real megad with a cluster
token: the login form in place of every page, the session cookie (its
attributes, refusal without it, acceptance with it, a forged one refused,
logout), wrong tokens logged at most once a second; a job followed over
Server-Sent Events from submit to its end with every point exactly once, a
reconnect resuming from Last-Event-ID, the cap on streams, closed streams
freed, and megad stopping with streams open.

usage: test_web_live.py MEGACTL MEGAD
"""
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

megactl, megad = sys.argv[1], sys.argv[2]
work = tempfile.mkdtemp(prefix="test_web_live.")
fails = []


def check(cond, what):
    if not cond:
        fails.append(what)
        print("FAIL:", what, flush=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


token = "web-live-" + os.urandom(16).hex()
token_file = os.path.join(work, "token")
fd = os.open(token_file, os.O_WRONLY | os.O_CREAT, 0o600)
os.write(fd, token.encode() + b"\n")
os.close(fd)
web_port = free_port()
log = open(os.path.join(work, "megad.log"), "a+")
proc = subprocess.Popen([megad, "serve", "--listen", "127.0.0.1:0", "--state-dir",
                         os.path.join(work, "state"), "--slots", "2", "--node-name", "web-live",
                         "--token-file", token_file, "--metrics-listen",
                         "127.0.0.1:%d" % web_port], stdout=subprocess.DEVNULL, stderr=log)
port = None
for _ in range(300):
    log.seek(0)
    m = re.search(r"listening on \S*:(\d+)", log.read())
    if m:
        port = int(m.group(1))
        break
    time.sleep(0.1)
if not port:
    proc.kill()
    log.seek(0)
    sys.exit("megad did not say its port:\n" + log.read())
env = dict(os.environ, MEGA_SERVER="127.0.0.1:%d" % port, MEGA_TOKEN_FILE=token_file)
BEARER = {"Authorization": "Bearer " + token}


def req(method, path, headers=None, body=None, src="127.0.0.1"):
    c = http.client.HTTPConnection("127.0.0.1", web_port, timeout=30, source_address=(src, 0))
    c.request(method, path, body=body, headers=headers or {})
    r = c.getresponse()
    data = r.read().decode()
    c.close()
    return r.status, r, data


def submit(iters, model):
    data = os.path.join(work, "data.txt")
    with open(data, "w") as f:
        f.write("The quick brown fox jumps over the lazy dog. " * 40)
    out = subprocess.run([megactl, "submit"] + model + ["--lr", "1e-3", "--data-path", data,
                          "--train-iters", str(iters), "--nproc-per-node", "1", "--name", "live"],
                         env=env, capture_output=True, text=True)
    if out.returncode:
        sys.exit("submit: " + out.stderr)
    return out.stdout.strip().splitlines()[-1]


TINY = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2",
        "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "4"]
SMALL = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
         "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "8"]

# ---- login ----
st, r, body = req("GET", "/")
check(st == 401 and 'id="login"' in body and "page.js" not in body, "/ without a login: %d" % st)
st, r, body = req("GET", "/jobs/j-1-web-live")
check(st == 401 and 'name="next" value="/jobs/j-1-web-live"' in body, "a job page without a login")
for path in ["/page.js", "/api/jobs", "/api/cluster", "/api/jobs/x/stream", "/metrics"]:
    st, r, body = req("GET", path)
    check(st == 401 and token not in body, "%s without a login: %d" % (path, st))
st, r, body = req("GET", "/api/cluster", BEARER)
check(st == 200 and json.loads(body)["login"] is True, "the bearer token opens the API")

form = {"Content-Type": "application/x-www-form-urlencoded"}
t0 = time.monotonic()
retry = 0
for i in range(20):
    st, r, body = req("POST", "/login", form, "token=wrong%d&next=/" % i)
    if i < 5:  # MEGA_THROTTLE_FREE guesses, then this address is held off
        check(st == 401 and 'id="wrong"' in body and r.getheader("Set-Cookie") is None,
              "a wrong token: %d" % st)
    else:
        retry = int(r.getheader("Retry-After") or 0)
        check(st == 429 and 1 <= retry <= 60 and r.getheader("Set-Cookie") is None,
              "guess %d, held off: %d, Retry-After %s" % (i + 1, st, retry))
elapsed = time.monotonic() - t0
time.sleep(0.2)
log.seek(0)
lines = [ln for ln in log.read().splitlines() if "refused" in ln and "login" in ln]
check(1 <= len(lines) <= 2 + int(elapsed), "20 wrong logins in %.1f s logged %d lines" % (elapsed, len(lines)))
check(all(token not in ln for ln in lines), "the token is not logged")

enc = token.replace("-", "%2D")
st, r, body = req("POST", "/login", form, "token=%s&next=/jobs/j-9" % enc)
check(st == 429, "the right token while held off is not even looked at: %d" % st)
time.sleep(retry + 0.1)
st, r, body = req("POST", "/login", form, "token=%s&next=/jobs/j-9" % enc)
cookie = r.getheader("Set-Cookie") or ""
check(st == 303 and r.getheader("Location") == "/jobs/j-9", "login: %d %s" % (st, r.getheader("Location")))
attrs = [a.strip() for a in cookie.split(";")]
check("HttpOnly" in attrs and "SameSite=Strict" in attrs and "Path=/" in attrs,
      "the cookie's attributes: %s" % cookie)
check(token not in cookie and token[9:] not in cookie, "the cookie holds the token")
sess = attrs[0]
check(re.fullmatch(r"mega_session=[0-9a-f]{64}", sess) is not None, "the session id: %s" % sess)
C = {"Cookie": "theme=x; " + sess}
st, r, body = req("GET", "/", C)
check(st == 200 and "/page.js" in body, "/ with the cookie: %d" % st)
st, r, body = req("GET", "/api/jobs", C)
check(st == 200 and "jobs" in json.loads(body), "the API with the cookie: %d" % st)
st, r, body = req("GET", "/metrics", C)
check(st == 401, "/metrics wants the bearer token, not a cookie: %d" % st)
forged = sess[:-1] + ("0" if sess[-1] != "0" else "1")
st, r, body = req("GET", "/api/jobs", {"Cookie": forged})
check(st == 401, "a forged cookie: %d" % st)
st, r, body = req("GET", "/api/jobs", {"Cookie": "mega_session=" + token})
check(st == 401, "the token as a cookie: %d" % st)

# ---- methods: HEAD wherever GET, 405 with a true Allow elsewhere ----
for path, headers in [("/", C), ("/api/jobs", C), ("/api/cluster", BEARER), ("/metrics", BEARER),
                      ("/healthz", None), ("/readyz", None), ("/login", None)]:
    st, r, body = req("HEAD", path, headers)
    check(st == 200 and body == "", "HEAD %s: %d %r" % (path, st, body[:80]))
for method, path, headers, allow in [("POST", "/api/jobs", C, "GET, HEAD"),
                                     ("DELETE", "/", C, "GET, HEAD"),
                                     ("POST", "/healthz", None, "GET, HEAD"),
                                     ("PUT", "/readyz", None, "GET, HEAD"),
                                     ("POST", "/metrics", BEARER, "GET, HEAD"),
                                     ("GET", "/logout", C, "POST"),
                                     ("PUT", "/login", None, "GET, HEAD, POST")]:
    st, r, body = req(method, path, headers)
    check(st == 405 and r.getheader("Allow") == allow,
          "%s %s: %d, Allow %s" % (method, path, st, r.getheader("Allow")))

# ---- a stream from submit to the end: every point exactly once ----


class Stream:
    def __init__(self, path, headers, src="127.0.0.1"):
        self.c = http.client.HTTPConnection("127.0.0.1", web_port, timeout=60,
                                            source_address=(src, 0))
        self.c.request("GET", path, headers=headers)
        self.r = self.c.getresponse()
        self.status = self.r.status

    def event(self):
        """The next event as (name, id, data), ("ping", ..) for a comment,
        None at the end of the stream."""
        name, eid, data, comment = None, None, None, False
        while True:
            ln = self.r.readline()
            if not ln:
                return None
            ln = ln.decode().rstrip("\n")
            if not ln:
                if name or data is not None:
                    return name, eid, json.loads(data) if data else None
                if comment:
                    return "ping", None, None
                continue
            if ln.startswith(":"):
                comment = True
            elif ln.startswith("event: "):
                name = ln[7:]
            elif ln.startswith("id: "):
                eid = int(ln[4:])
            elif ln.startswith("data: "):
                data = ln[6:]

    def close(self):
        self.r.close()  # the response holds the socket open too
        self.c.close()


iters = 200
jid = submit(iters, TINY)
s = Stream("/api/jobs/%s/stream?since=0" % jid, C)
check(s.status == 200 and s.r.getheader("Content-Type").startswith("text/event-stream"),
      "the stream: %d" % s.status)
seqs, its, names, last_state, end, first_state = [], [], [], None, None, None
while True:
    ev = s.event()
    if ev is None:
        break
    name, eid, data = ev
    names.append(name)
    if name == "steps":
        check(eid == data["next"], "a steps event's id is its cursor")
        seqs += [p["seq"] for p in data["points"]]
        its += [p["it"] for p in data["points"]]
    elif name == "job":
        last_state = data["state"]
        first_state = first_state or last_state
    elif name == "end":
        end = data["state"]
s.close()
check(end == "succeeded" and last_state == "succeeded", "the end: %s %s" % (end, last_state))
base = seqs[0] - 1 if seqs else 0  # the curve's epoch: points are numbered after it
check(seqs == list(range(base + 1, base + iters + 1)) and its == list(range(1, iters + 1)),
      "every point exactly once: %d points, %d distinct" % (len(seqs), len(set(seqs))))
check("skipped" not in names, "a reader keeping up skips nothing")
if first_state in ("pending", "running"):  # not when the stream came after the job's end
    check(names.count("steps") > 1, "the points came live, in %d events" % names.count("steps"))

# a reconnect resumes from Last-Event-ID
s = Stream("/api/jobs/%s/stream?since=0" % jid, dict(C, **{"Last-Event-ID": str(base + 150)}))
ev = s.event()
check(ev[0] == "steps" and "reset" not in ev[2] and
      [p["seq"] for p in ev[2]["points"]] == list(range(base + 151, base + iters + 1)),
      "Last-Event-ID base+150: %s" % (ev[0],))
s.close()
# one of another curve (a plain 150: an older megad's) gets the whole curve, reset
s = Stream("/api/jobs/%s/stream?since=0" % jid, dict(C, **{"Last-Event-ID": "150"}))
ev = s.event()
check(ev[0] == "steps" and ev[2].get("reset") is True and len(ev[2]["points"]) == iters,
      "Last-Event-ID 150 of another curve: %s %s" % (ev[0], ev[2].get("reset")))
s.close()
for path in ["/jobs/" + jid, "/api/jobs/" + jid, "/api/jobs/%s/steps?since=0" % jid,
             "/api/jobs/%s/stream" % jid]:
    st, r, body = req("HEAD", path, C)
    check(st == 200 and body == "", "HEAD %s: %d" % (path, st))

# ---- the cap, and closed streams freed ----


def streams_open():
    st, r, body = req("GET", "/metrics", BEARER)
    m = re.search(r"^mega_web_streams (\d+)$", body, re.M)
    return int(m.group(1)) if m else -1


live = submit(1000000, SMALL)
for _ in range(600):
    st, r, body = req("GET", "/api/jobs/" + live, BEARER)
    if json.loads(body)["last_iteration"] >= 2:
        break
    time.sleep(0.1)
open_ = []
for i in range(32):  # 8 from each of 4 loopback addresses (8 per address at most)
    s = Stream("/api/jobs/%s/stream" % live, BEARER, src="127.0.0.%d" % (2 + i // 8))
    check(s.status == 200 and s.event()[0] == "steps", "stream %d" % i)
    open_.append(s)
    if i == 7:
        # one address (a proxy's) holds its 8: a 9th stream is told 503 (the page
        # then polls), and its probes, polls and /metrics still get in
        st, r, body = req("GET", "/api/jobs/%s/stream" % live, BEARER, src="127.0.0.2")
        check(st == 503 and "to one address" in body and "steps?since=" in body,
              "a 9th stream from one address: %d %s" % (st, body.strip()))
        for path, headers in [("/healthz", None), ("/readyz", None), ("/metrics", BEARER),
                              ("/api/jobs/%s/steps?since=0" % live, BEARER)]:
            st, r, body = req("GET", path, headers, src="127.0.0.2")
            check(st == 200, "%s from an address with 8 streams: %d" % (path, st))
check(streams_open() == 32, "32 streams open: %d" % streams_open())
st, r, body = req("GET", "/api/jobs/%s/stream" % live, BEARER, src="127.0.0.9")
check(st == 503 and "steps?since=" in body, "the 33rd stream: %d %s" % (st, body.strip()))
t0 = time.monotonic()
got = {"steps": 0, "job": 0}
while time.monotonic() - t0 < 2.5:  # a live job's news reaches its streams
    ev = open_[0].event()
    if ev and ev[0] in got:
        got[ev[0]] += 1
check(got["steps"] >= 2 and got["job"] >= 1, "news on a live job: %s" % got)
for s in open_:
    s.close()
for _ in range(150):  # the next ping finds them gone (every 5 s)
    if streams_open() == 0:
        break
    time.sleep(0.1)
check(streams_open() == 0, "closed streams freed: %d open" % streams_open())
s = Stream("/api/jobs/%s/stream" % live, BEARER)
check(s.status == 200, "a stream after the others closed: %d" % s.status)

# ---- logout; megad stops with a stream open ----
st, r, body = req("POST", "/logout", C)
check(st == 303 and "Max-Age=0" in (r.getheader("Set-Cookie") or ""), "logout: %d" % st)
st, r, body = req("GET", "/api/jobs", C)
check(st == 401, "the session after logout: %d" % st)
proc.terminate()
try:
    rc = proc.wait(timeout=30)
    check(rc == 0, "megad's exit with a stream open: %d" % rc)
except subprocess.TimeoutExpired:
    proc.kill()
    check(False, "megad did not stop with a stream open")
s.close()
if fails:
    log.seek(0)
    print("".join(log.read().splitlines(True)[-30:]))
    print("%d failure(s)" % len(fails))
    shutil.rmtree(work, ignore_errors=True)
    sys.exit(1)
shutil.rmtree(work, ignore_errors=True)
print("ok")
