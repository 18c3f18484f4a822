#!/usr/bin/python3
"""Control-plane figures for megad and megactl (printed, never a pass/fail):

  unary    GetJob and ListJobs round trips from Python grpcio (p50, p99)
  megactl  wall time of one `megactl status` process (start, connect, call)
  watch    WatchJob: the lag from the coordinator's merge of a step
           (StepMetrics.time_unix_ms) to a live watcher, and the rate of a
           replay of a finished job

usage: bench_control.py MEGAD MEGACTL PROTO_FILE [unary|megactl|watch ...]
"""
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def start_megad(megad, work, *extra):
    """megad on a free port (extra: more flags of megad serve): (process, port)."""
    log = open(os.path.join(work, "megad.log"), "a+")
    proc = subprocess.Popen([megad, "serve", "--listen", "127.0.0.1:0", "--state-dir",
                             os.path.join(work, "state"), "--slots", "2", "--node-name", "bench"]
                            + list(extra), stdout=subprocess.DEVNULL, stderr=log)
    for _ in range(300):
        log.seek(0)
        m = re.search(r"listening on \S*:(\d+)", log.read())
        if m:
            return proc, int(m.group(1))
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("megad did not say its port")


def tiny(data, iters):
    return ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2",
            "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
            "--train-iters", str(iters), "--lr", "0.001", "--data-path", data]


def submit_and_wait(ctl, pb, data, iters, nproc=1):
    job = ctl.SubmitJob(pb.SubmitJobRequest(spec=pb.JobSpec(
        name="bench", args=tiny(data, iters), nproc_per_node=nproc)), timeout=30).job
    for _ in ctl.WatchJob(pb.WatchJobRequest(job_id=job.id), timeout=600):
        pass
    return job.id


def bench_unary(ctl, pb, job_id, n=2000):
    for name, call in (("GetJob", lambda: ctl.GetJob(pb.GetJobRequest(job_id=job_id), timeout=5)),
                       ("ListJobs", lambda: ctl.ListJobs(pb.ListJobsRequest(), timeout=5))):
        for _ in range(50):
            call()
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            call()
            ts.append((time.perf_counter() - t0) * 1e3)
        print("unary  %-8s  %d calls  p50 %.3f ms  p99 %.3f ms  (%.0f calls/s)" %
              (name, n, pct(ts, 50), pct(ts, 99), n / (sum(ts) / 1e3)))


def bench_megactl(megactl, port, job_id, n=50):
    env = dict(os.environ, MEGA_SERVER="127.0.0.1:%d" % port)
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run([megactl, "status", job_id], env=env, check=True, stdout=subprocess.DEVNULL)
        ts.append((time.perf_counter() - t0) * 1e3)
    print("megactl status     %d runs   median %.1f ms  p90 %.1f ms" %
          (n, statistics.median(ts), pct(ts, 90)))


def bench_watch(ctl, pb, data, iters=300):
    job = ctl.SubmitJob(pb.SubmitJobRequest(spec=pb.JobSpec(
        name="bench-watch", args=tiny(data, iters), nproc_per_node=2)), timeout=30).job
    lags, steps = [], 0
    for item in ctl.WatchJob(pb.WatchJobRequest(job_id=job.id), timeout=600):
        if item.WhichOneof("item") == "step":
            lags.append(time.time() * 1e3 - item.step.time_unix_ms)
            steps += 1
    print("watch  live lag    %d steps  p50 %.2f ms  p99 %.2f ms  (merge to watcher)" %
          (steps, pct(lags, 50), pct(lags, 99)))
    t0 = time.perf_counter()
    n = 0
    for item in ctl.WatchJob(pb.WatchJobRequest(job_id=job.id, replay=True), timeout=600):
        n += 1
    dt = time.perf_counter() - t0
    print("watch  replay      %d items in %.1f ms  (%.0f items/s)" % (n, dt * 1e3, n / dt))


def main():
    if len(sys.argv) < 4:
        raise SystemExit(__doc__)
    megad, megactl, proto = sys.argv[1:4]
    which = sys.argv[4:] or ["unary", "megactl", "watch"]
    work = tempfile.mkdtemp(prefix="mega-bench-")
    stubs = os.path.join(work, "stubs")
    os.makedirs(stubs)
    subprocess.run(["protoc", "-I", os.path.dirname(os.path.abspath(proto)),
                    "--python_out=" + stubs, "--grpc_python_out=" + stubs,
                    "--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin",
                    os.path.basename(proto)], check=True)
    sys.path.insert(0, stubs)
    import grpc
    import mega_pb2 as pb
    import mega_pb2_grpc as pbg

    data = os.path.join(work, "data.txt")
    with open(data, "w") as f:
        f.write("The quick brown fox jumps over the lazy dog. " * 40)
    proc, port = start_megad(megad, work)
    try:
        with grpc.insecure_channel("127.0.0.1:%d" % port) as ch:
            ctl = pbg.ControlStub(ch)
            job_id = submit_and_wait(ctl, pb, data, 1)
            for _ in range(9):
                submit_and_wait(ctl, pb, data, 1)
            print("megad with %d jobs, one node, 2 cpu slots" % len(
                ctl.ListJobs(pb.ListJobsRequest(), timeout=5).jobs))
            if "unary" in which:
                bench_unary(ctl, pb, job_id)
            if "megactl" in which:
                bench_megactl(megactl, port, job_id)
            if "watch" in which:
                bench_watch(ctl, pb, data)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
