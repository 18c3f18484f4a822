#!/usr/bin/python3
"""Web view figures for megad (printed, never a pass/fail):

  size     the page's bytes (page.html + page.js), and the JSON a job page
           first loads for a 10,000-iteration job
  paint    headless chromium over the DevTools protocol: when the job page of
           a 10,000-iteration job drew its first full view (performance.now()
           at the first render, the page's data-first-render-ms), three runs
  pollers  megad's CPU over 30 s on a live job, without pages and with 20
           clients making the fallback's requests (steps?since=next every
           second, the job every other second)
  sse      the same with 20 clients holding the page's live stream
           (/api/jobs/ID/stream, Server-Sent Events) open and reading it,
           what they got, and how soon a point reached them
  Plain HTTP clients stand in for 20 browsers, which this 2-core machine
  cannot hold beside megad.

usage: bench_web.py MEGAD MEGACTL [size|paint|pollers|sse ...]
"""
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import http.client
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_control import start_megad  # noqa: E402


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def get(url):
    with urllib.request.urlopen(url) as r:
        return r.read()


# A 1-layer, 16-wide model steps in about 0.1 ms: 10,000 iterations in
# seconds. The live job of `pollers` is 4 layers, 64 wide (tens of ms a step),
# so megad's own share of a step is steady and the pollers' share shows.
TINY = ["--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "1",
        "--seq-length", "8", "--micro-batch-size", "1", "--global-batch-size", "1"]
SMALL = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
         "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "8"]


def submit(megactl, port, work, iters, model=TINY):
    data = os.path.join(work, "data.txt")
    with open(data, "w") as f:
        f.write("The quick brown fox jumps over the lazy dog. " * 40)
    out = subprocess.run([megactl, "submit"] + model + ["--lr", "1e-3",
                          "--data-path", data, "--train-iters", str(iters), "--log-interval",
                          "1", "--nproc-per-node", "1", "--name", "bench"],
                         env=dict(os.environ, MEGA_SERVER="127.0.0.1:%d" % port),
                         capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def job(web, jid):
    return json.loads(get("%s/api/jobs/%s" % (web, jid)))


def cpu_s(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_size(web, jid):
    html, js = len(get(web + "/")), len(get(web + "/page.js"))
    print("page: %d bytes (page.html %d + page.js %d), uncompressed" % (html + js, html, js))
    t0 = time.perf_counter()
    steps = get("%s/api/jobs/%s/steps?since=0" % (web, jid))
    dt = time.perf_counter() - t0
    doc = json.loads(steps)
    print("10,000-iteration job: steps?since=0 %d bytes, %d points kept (%d thinned), %.1f ms"
          % (len(steps), len(doc["points"]), doc["thinned"], dt * 1000))
    one = get("%s/api/jobs/%s" % (web, jid))
    print("10,000-iteration job: /api/jobs/ID %d bytes" % len(one))


class Chromium:
    """Headless chromium driven over the DevTools protocol on a pipe
    (--remote-debugging-pipe: commands on its fd 3, answers on its fd 4, each
    JSON message ending in a NUL), so the page runs in real time."""

    def __init__(self, profile):
        cmd_r, self.cmd_w = os.pipe()
        self.ans_r, ans_w = os.pipe()
        self.proc = subprocess.Popen(
            ["chromium", "--headless", "--no-sandbox", "--disable-gpu",
             "--user-data-dir=" + profile, "--remote-debugging-pipe", "about:blank"],
            close_fds=False,  # subprocess would close 3 and 4 after preexec_fn placed them
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=lambda: self._place(cmd_r, ans_w))
        os.close(cmd_r)
        os.close(ans_w)
        self.buf, self.id = b"", 0

    @staticmethod
    def _place(cmd_r, ans_w):
        # through fresh copies: dup2 onto the same number would keep close-on-exec
        a, b = os.dup(cmd_r), os.dup(ans_w)
        os.dup2(a, 3)
        os.dup2(b, 4)

    def call(self, method, session=None, **params):
        self.id += 1
        msg = {"id": self.id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self.cmd_w, json.dumps(msg).encode() + b"\0")
        while True:
            while b"\0" not in self.buf:
                chunk = os.read(self.ans_r, 1 << 16)
                if not chunk:
                    raise RuntimeError("chromium went away")
                self.buf += chunk
            line, self.buf = self.buf.split(b"\0", 1)
            ans = json.loads(line)
            if ans.get("id") == self.id:
                if "error" in ans:
                    raise RuntimeError("%s: %s" % (method, ans["error"]))
                return ans["result"]

    def close(self):
        self.proc.kill()
        self.proc.wait()


def bench_paint(web, jid, work):
    if not shutil.which("chromium"):
        print("paint: skipped, chromium is not installed")
        return
    firsts = []
    for i in range(3):
        c = Chromium(os.path.join(work, "chromium%d" % i))
        try:
            target = c.call("Target.createTarget", url="about:blank")["targetId"]
            sess = c.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            c.call("Page.navigate", sess, url="%s/jobs/%s" % (web, jid))
            first = None
            for _ in range(200):
                r = c.call("Runtime.evaluate", sess, returnByValue=True,
                           expression="[document.body && document.body.dataset.firstRenderMs,"
                                      " document.querySelector('#loss-curve')?.dataset.n,"
                                      " performance.getEntriesByName('first-contentful-paint')"
                                      "[0]?.startTime]")
                first, n, fcp = r["result"]["value"]
                if first:
                    break
                time.sleep(0.05)
        finally:
            c.close()
        print("  run %d: first contentful paint %s ms, first full render (the curves drawn) %s ms"
              " after navigation start, %s loss points" % (i + 1, fcp and round(fcp), first, n))
        if first:
            firsts.append(int(first))
    if firsts:
        print("paint: 10,000-iteration job page, first full render median %d ms after navigation"
              " start (real time, headless chromium)" % statistics.median(firsts))


def live_job(megactl, port, web, work, megad_pid):
    """A long job, stepping: (its id, megad's CPU share over 30 s with no
    client, iterations a second meanwhile)."""
    jid = submit(megactl, port, work, 1000000, SMALL)
    for _ in range(600):
        if job(web, jid)["last_iteration"] >= 5:
            break
        time.sleep(0.1)
    c0 = cpu_s(megad_pid)
    it0 = job(web, jid)["last_iteration"]
    time.sleep(30)
    return (jid, (cpu_s(megad_pid) - c0) / 30, (job(web, jid)["last_iteration"] - it0) / 30)


def client(web, i, timeout):
    """Client i's connection: megad allows 16 connections per address, so 5
    clients on each of 127.0.0.2, .3, ..."""
    host, port = web.split("//")[1].split(":")
    return http.client.HTTPConnection(host, int(port), timeout=timeout,
                                      source_address=("127.0.0.%d" % (2 + i // 5), 0))


def bench_pollers(megad_pid, megactl, port, web, work):
    jid, idle, rate0 = live_job(megactl, port, web, work, megad_pid)
    stop = threading.Event()
    reqs = [0]

    def get_from(i, path):
        c = client(web, i, 30)
        c.request("GET", path)
        body = c.getresponse().read()
        c.close()
        return body

    def poller(i):
        nxt, tick = 0, 0
        while not stop.is_set():
            doc = json.loads(get_from(i, "/api/jobs/%s/steps?since=%d" % (jid, nxt)))
            nxt = doc["next"]
            if tick % 2 == 0:
                get_from(i, "/api/jobs/%s" % jid)
            reqs[0] += 1 + (tick % 2 == 0)
            tick += 1
            stop.wait(1.0)

    threads = [threading.Thread(target=poller, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    c0 = cpu_s(megad_pid)
    it0 = job(web, jid)["last_iteration"]
    time.sleep(30)
    busy = (cpu_s(megad_pid) - c0) / 30
    it1 = job(web, jid)["last_iteration"]
    stop.set()
    for t in threads:
        t.join()
    subprocess.run([megactl, "cancel", jid], env=dict(os.environ, MEGA_SERVER="127.0.0.1:%d" % port),
                   capture_output=True)
    print("pollers: megad CPU on a live job: %.1f%% of a core without pages (%.0f iterations/s),"
          " %.1f%% with 20 pollers (%.0f iterations/s, %d requests in 30 s)"
          % (100 * idle, rate0, 100 * busy, (it1 - it0) / 30, reqs[0]))


def bench_sse(megad_pid, megactl, port, web, work):
    jid, idle, rate0 = live_job(megactl, port, web, work, megad_pid)
    stop = threading.Event()
    stats = {"events": 0, "bytes": 0, "points": 0, "lag": []}
    lock = threading.Lock()

    def reader(i):
        c = client(web, i, 60)
        c.request("GET", "/api/jobs/%s/stream" % jid)
        r = c.getresponse()
        assert r.status == 200, r.status
        name, first = None, True
        while not stop.is_set():
            ln = r.readline()
            if not ln:
                break
            with lock:
                stats["bytes"] += len(ln)
            ln = ln.decode()
            if ln.startswith("event: "):
                name = ln[7:].strip()
            elif ln.startswith("data: ") and name == "steps":
                doc = json.loads(ln[6:])
                with lock:
                    stats["events"] += 1
                    if not first and doc["points"]:
                        stats["points"] += len(doc["points"])
                        # the newest point's age on arrival: the merge time to here
                        stats["lag"].append(time.time() * 1000 - doc["points"][-1]["t"])
                first = False
        r.close()
        c.close()

    threads = [threading.Thread(target=reader, args=(i,), daemon=True) for i in range(20)]
    for t in threads:
        t.start()
    time.sleep(2)  # the first batch (the whole curve) is not the steady state
    with lock:
        for k in ("events", "bytes", "points"):
            stats[k] = 0
        stats["lag"] = []
    c0 = cpu_s(megad_pid)
    it0 = job(web, jid)["last_iteration"]
    time.sleep(30)
    busy = (cpu_s(megad_pid) - c0) / 30
    it1 = job(web, jid)["last_iteration"]
    with lock:
        ev, nb, npts, lag = stats["events"], stats["bytes"], stats["points"], sorted(stats["lag"])
    stop.set()
    subprocess.run([megactl, "cancel", jid], env=dict(os.environ, MEGA_SERVER="127.0.0.1:%d" % port),
                   capture_output=True)
    for t in threads:
        t.join(10)
    p50 = lag[len(lag) // 2] if lag else float("nan")
    p99 = lag[min(len(lag) - 1, len(lag) * 99 // 100)] if lag else float("nan")
    print("sse: megad CPU on a live job: %.1f%% of a core without pages (%.0f iterations/s),"
          " %.1f%% with 20 SSE clients (%.0f iterations/s); in 30 s they got %d steps events,"
          " %d points, %.0f KB; the newest point's age on arrival p50 %.0f ms, p99 %.0f ms"
          % (100 * idle, rate0, 100 * busy, (it1 - it0) / 30, ev, npts, nb / 1024, p50, p99))


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    megad, megactl = sys.argv[1], sys.argv[2]
    what = sys.argv[3:] or ["size", "paint", "pollers", "sse"]
    work = tempfile.mkdtemp(prefix="bench_web.")
    web_port = free_port()
    proc, port = start_megad(megad, work, "--metrics-listen", "127.0.0.1:%d" % web_port)
    web = "http://127.0.0.1:%d" % web_port
    try:
        if "size" in what or "paint" in what:
            t0 = time.perf_counter()
            jid = submit(megactl, port, work, 10000)
            while not job(web, jid)["state"] in ("succeeded", "failed", "cancelled"):
                time.sleep(0.5)
            print("a 10,000-iteration job ran in %.0f s" % (time.perf_counter() - t0))
            if "size" in what:
                bench_size(web, jid)
            if "paint" in what:
                bench_paint(web, jid, work)
        if "pollers" in what:
            bench_pollers(proc.pid, megactl, port, web, work)
        if "sse" in what:
            bench_sse(proc.pid, megactl, port, web, work)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
