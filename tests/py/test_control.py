#!/usr/bin/python3
"""The Control API from a client we did not write: Python grpcio against a
real megad (with real megaw workers on the cpu backend).

usage: test_control.py MEGAD PROTO_FILE OUT_DIR

Generates Python stubs from mega.proto into OUT_DIR at test time, starts
megad on a free port with two slots, and drives Control: SubmitJob, GetJob,
ListJobs (with a state filter), WatchJob streamed to the end, CancelJob,
ListNodes, ForgetNode's refusals, GetTrace, NOT_FOUND for an unknown id and
INVALID_ARGUMENT with core/jobspec's sentence for a bad spec. Exits 77 (skipped)
without grpcio."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

SKIP = 77


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def generate(proto, out):
    os.makedirs(out, exist_ok=True)
    subprocess.run(["protoc", "-I", os.path.dirname(os.path.abspath(proto)),
                    "--python_out=" + out, "--grpc_python_out=" + out,
                    "--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin",
                    os.path.basename(proto)], check=True)
    sys.path.insert(0, out)


class Megad:
    """megad serve on 127.0.0.1:0 in a private state directory; the port is
    read from the line it prints when it listens."""

    def __init__(self, exe, work):
        self.log = open(os.path.join(work, "megad.log"), "a+")
        self.proc = subprocess.Popen(
            [exe, "serve", "--listen", "127.0.0.1:0", "--state-dir", os.path.join(work, "state"),
             "--slots", "2", "--node-name", "py-node"],
            stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.port = None
        lines = []
        deadline = time.time() + 30
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            m = re.search(r"listening on \S*:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        if self.port is None:
            self.stop()
            fail("megad did not say its port; it said %r; log: %s" % (lines, self.tail()))
        # Keep draining stdout so megad never blocks on a full pipe.
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def tail(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-3000:]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                fail("megad did not exit within 20 s of SIGTERM; log: %s" % self.tail())
        return self.proc.returncode


def expect_error(grpc, fn, code, details=None):
    try:
        fn()
    except grpc.RpcError as e:
        check(e.code() == code, "expected %s, got %s (%s)" % (code, e.code(), e.details()))
        if details is not None:
            check(e.details() == details, "details %r, want %r" % (e.details(), details))
        return e
    fail("expected %s, the call succeeded" % code)


def tiny_args(data, iters, extra=()):
    return ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2",
            "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
            "--train-iters", str(iters), "--lr", "0.001", "--data-path", data] + list(extra)


def watch_all(ctl, pb, job_id, timeout):
    steps, events, final = [], [], None
    for item in ctl.WatchJob(pb.WatchJobRequest(job_id=job_id, replay=True), timeout=timeout):
        kind = item.WhichOneof("item")
        check(final is None, "WatchJob sent %s after final_state" % kind)
        if kind == "step":
            steps.append(item.step)
        elif kind == "event":
            events.append(item.event)
        else:
            final = item.final_state
    check(final is not None, "WatchJob ended without final_state")
    return steps, events, final


def run(grpc, pb, pbg, ch, work):
    ctl = pbg.ControlStub(ch)
    data = os.path.join(work, "data.txt")
    with open(data, "w") as f:
        f.write("The quick brown fox jumps over the lazy dog. " * 40)

    # ---- a tiny 2-stage pipeline job, watched to the end ----
    spec = pb.JobSpec(name="py-tiny", args=tiny_args(data, 3, ["--pipeline-model-parallel-size", "2"]),
                      nnodes_min=1, nproc_per_node=2)
    job = ctl.SubmitJob(pb.SubmitJobRequest(spec=spec), timeout=30).job
    check(job.id != "", "SubmitJob gave no id: %r" % job)
    check(job.name == "py-tiny", "name %r" % job.name)
    check(job.state in (pb.JOB_STATE_PENDING, pb.JOB_STATE_RUNNING), "state %r" % job.state)
    check(job.train_iters == 3, "train_iters %d" % job.train_iters)

    got = ctl.GetJob(pb.GetJobRequest(job_id=job.id), timeout=10).job
    check(got.id == job.id and list(got.spec.args)[:2] == ["--num-layers", "2"],
          "GetJob: %r" % got)

    listed = ctl.ListJobs(pb.ListJobsRequest(), timeout=10).jobs
    check(job.id in [j.id for j in listed], "ListJobs lacks %s: %r" % (job.id, listed))

    steps, events, final = watch_all(ctl, pb, job.id, 120)
    check(final.state == pb.JOB_STATE_SUCCEEDED,
          "final state %s (%s)" % (pb.JobState.Name(final.state), final.error))
    check([s.iteration for s in steps] == [1, 2, 3],
          "iterations %r" % [s.iteration for s in steps])
    for s in steps:
        check(len(s.ranks) == 2, "step %d has %d ranks" % (s.iteration, len(s.ranks)))
        check(sorted(r.pp_rank for r in s.ranks) == [0, 1], "pp ranks %r" % s.ranks)
        check(s.loss > 0 and s.step_time_s > 0 and s.tokens_per_s > 0, "step %r" % s)
    kinds = [pb.JobEventKind.Name(e.kind) for e in events]
    check("JOB_EVENT_KIND_STARTED" in kinds and kinds[-1] == "JOB_EVENT_KIND_SUCCEEDED",
          "events %r" % kinds)
    check(final.world_size == 2 and final.pp == 2 and final.dp == 1 and final.last_iteration == 3,
          "final job %r" % final)
    print("watched %s: %d steps, losses %s, events %s" % (
        job.id, len(steps), [round(s.loss, 4) for s in steps], kinds))

    done = ctl.ListJobs(pb.ListJobsRequest(states=[pb.JOB_STATE_SUCCEEDED]), timeout=10).jobs
    check(job.id in [j.id for j in done], "ListJobs(SUCCEEDED) lacks %s" % job.id)
    running = ctl.ListJobs(pb.ListJobsRequest(states=[pb.JOB_STATE_RUNNING]), timeout=10).jobs
    check(job.id not in [j.id for j in running], "ListJobs(RUNNING) has %s" % job.id)

    # ---- cancel a long job ----
    spec = pb.JobSpec(name="py-long", args=tiny_args(data, 100000), nproc_per_node=1)
    long_job = ctl.SubmitJob(pb.SubmitJobRequest(spec=spec), timeout=30).job
    cancelled = ctl.CancelJob(pb.CancelJobRequest(job_id=long_job.id, reason="py says stop"),
                              timeout=30).job
    check(cancelled.id == long_job.id, "CancelJob answered about %s" % cancelled.id)
    _, events, final = watch_all(ctl, pb, long_job.id, 60)
    check(final.state == pb.JOB_STATE_CANCELLED, "after cancel: %s" % pb.JobState.Name(final.state))
    check(any("py says stop" in e.message for e in events),
          "no event carries the reason: %r" % [e.message for e in events])

    # ---- nodes ----
    nodes = ctl.ListNodes(pb.ListNodesRequest(), timeout=10)
    check(nodes.self_node_id == "py-node", "self %r" % nodes.self_node_id)
    me = [n for n in nodes.nodes if n.id == "py-node"]
    check(len(me) == 1 and me[0].state == pb.NODE_STATE_ALIVE and me[0].slots == 2,
          "nodes %r" % nodes)
    # ForgetNode takes only a dead node: not this one, not one nobody lists, not no name
    e = expect_error(grpc, lambda: ctl.ForgetNode(pb.ForgetNodeRequest(node_id="py-node"),
                                                  timeout=10),
                     grpc.StatusCode.FAILED_PRECONDITION)
    check("cannot forget itself" in e.details(), "details %r" % e.details())
    expect_error(grpc, lambda: ctl.ForgetNode(pb.ForgetNodeRequest(node_id="py-gone"), timeout=10),
                 grpc.StatusCode.NOT_FOUND)
    expect_error(grpc, lambda: ctl.ForgetNode(pb.ForgetNodeRequest(), timeout=10),
                 grpc.StatusCode.INVALID_ARGUMENT)

    # ---- a trace ----
    spec = pb.JobSpec(name="py-trace", args=tiny_args(data, 2, ["--trace-iteration", "2"]),
                      nproc_per_node=1)
    tj = ctl.SubmitJob(pb.SubmitJobRequest(spec=spec), timeout=30).job
    _, _, final = watch_all(ctl, pb, tj.id, 120)
    check(final.state == pb.JOB_STATE_SUCCEEDED, "trace job: %s" % final.error)
    chunks = list(ctl.GetTrace(pb.GetTraceRequest(job_id=tj.id), timeout=30))
    blob = b"".join(c.data for c in chunks)
    check(chunks and all(c.total_bytes == len(blob) for c in chunks), "trace sizes")
    trace = json.loads(blob)
    evs = trace["traceEvents"] if isinstance(trace, dict) else trace
    check(any(e.get("ph") == "X" for e in evs), "the trace has no spans")
    print("trace of %s: %d bytes in %d chunks, %d events" % (tj.id, len(blob), len(chunks), len(evs)))

    # ---- errors ----
    for call, req in ((ctl.GetJob, pb.GetJobRequest(job_id="j-nope")),
                      (ctl.CancelJob, pb.CancelJobRequest(job_id="j-nope")),
                      (ctl.GetTrace, pb.GetTraceRequest(job_id="j-nope")),
                      (ctl.WatchJob, pb.WatchJobRequest(job_id="j-nope"))):
        expect_error(grpc, lambda: list(call(req, timeout=10)) if call in (ctl.GetTrace, ctl.WatchJob)
                     else call(req, timeout=10), grpc.StatusCode.NOT_FOUND)

    bad = pb.JobSpec(name="py-bad", nnodes_min=1, nproc_per_node=6,
                     args=tiny_args(data, 3, ["--tensor-model-parallel-size", "2",
                                              "--pipeline-model-parallel-size", "2"]))
    expect_error(grpc, lambda: ctl.SubmitJob(pb.SubmitJobRequest(spec=bad), timeout=30),
                 grpc.StatusCode.INVALID_ARGUMENT,
                 "invalid job: world size 6 is not divisible by TP·PP = 4 (TP 2 × PP 2); "
                 "use a world size that is a multiple of 4")
    bad = pb.JobSpec(name="py-bad", args=tiny_args(data, 3, ["--hidden-size", "abc"]))
    e = expect_error(grpc, lambda: ctl.SubmitJob(pb.SubmitJobRequest(spec=bad), timeout=30),
                     grpc.StatusCode.INVALID_ARGUMENT)
    check("--hidden-size" in e.details(), "details %r" % e.details())
    print("INVALID_ARGUMENT: %s" % e.details())


def main():
    megad, proto, out = sys.argv[1:4]
    try:
        import grpc  # noqa: F401
    except ImportError:
        print("grpcio is missing: skipped")
        sys.exit(SKIP)
    if not shutil.which("protoc") or not os.path.exists("/usr/bin/grpc_python_plugin"):
        print("protoc or /usr/bin/grpc_python_plugin is missing: skipped")
        sys.exit(SKIP)
    generate(proto, out)
    import grpc
    import mega_pb2 as pb
    import mega_pb2_grpc as pbg

    work = tempfile.mkdtemp(prefix="mega-py-")
    d = Megad(megad, work)
    try:
        with grpc.insecure_channel("127.0.0.1:%d" % d.port) as ch:
            run(grpc, pb, pbg, ch, work)
        rc = d.stop()
        check(rc == 0, "megad exited with %s after SIGTERM; log: %s" % (rc, d.tail()))
    except SystemExit:
        print("megad log:\n" + d.tail())
        raise
    finally:
        d.stop()
        shutil.rmtree(work, ignore_errors=True)
    print("test_control: ok")


if __name__ == "__main__":
    main()
