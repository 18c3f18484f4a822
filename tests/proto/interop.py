#!/usr/bin/python3
"""Python grpcio against the C test server (rpc_test_server): the wire as
another implementation sees it.

usage: interop.py RPC_TEST_SERVER PROTO_FILE OUT_DIR

Generates Python stubs from mega.proto into OUT_DIR at test time, checks the
C method table's stream flags against protoc's descriptors, then drives the
server: unary calls, status codes with details, streams, client cancel,
deadline, unknown methods, parallel calls, and a clean SIGTERM shutdown."""
import concurrent.futures
import os
import signal
import subprocess
import sys
import time


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def generate(proto, out):
    os.makedirs(out, exist_ok=True)
    cmd = ["protoc", "-I", os.path.dirname(proto), "--python_out=" + out,
           "--grpc_python_out=" + out,
           "--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin",
           "--descriptor_set_out=" + os.path.join(out, "mega.desc"),
           os.path.basename(proto)]
    subprocess.run(cmd, check=True)
    sys.path.insert(0, out)


def check_method_table(server, out):
    from google.protobuf import descriptor_pb2
    fds = descriptor_pb2.FileDescriptorSet()
    with open(os.path.join(out, "mega.desc"), "rb") as f:
        fds.ParseFromString(f.read())
    want = {}
    for fd in fds.file:
        for svc in fd.service:
            for m in svc.method:
                check(not m.client_streaming, m.name + " streams from the client")
                kind = "server_stream" if m.server_streaming else "unary"
                want["/%s.%s/%s" % (fd.package, svc.name, m.name)] = kind
    listed = subprocess.run([server, "--methods"], check=True, capture_output=True,
                            text=True).stdout.split("\n")
    got = dict(line.split(" ") for line in listed if line)
    check(got == want, "C method table %r differs from mega.proto %r" % (got, want))


def main():
    server, proto, out = sys.argv[1:4]
    generate(proto, out)
    check_method_table(server, out)
    import grpc
    import mega_pb2 as pb
    import mega_pb2_grpc as pbg

    proc = subprocess.Popen([server, "127.0.0.1:0"], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().split()
        check(len(line) == 2 and line[0] == "PORT", "server said %r" % line)
        target = "127.0.0.1:" + line[1]
        with grpc.insecure_channel(target) as ch:
            run_calls(grpc, pb, pbg, ch)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=10)
        check(rc == 0, "server exited with %d after SIGTERM" % rc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    print("interop: ok")


def expect_error(grpc, fn, code, details=None):
    try:
        fn()
    except grpc.RpcError as e:
        check(e.code() == code, "expected %s, got %s (%s)" % (code, e.code(), e.details()))
        if details is not None:
            check(e.details() == details, "details %r, want %r" % (e.details(), details))
        return e
    fail("expected %s, the call succeeded" % code)


def run_calls(grpc, pb, pbg, ch):
    ctl = pbg.ControlStub(ch)
    spec = pb.JobSpec(name="py", args=["--train-iters", "1000", "--num-layers", "4"])
    job = ctl.SubmitJob(pb.SubmitJobRequest(spec=spec), timeout=5).job
    check(job.id.startswith("j-") and job.state == pb.JOB_STATE_PENDING, "submit: %r" % job)
    got = ctl.GetJob(pb.GetJobRequest(job_id=job.id), timeout=5).job
    check(got.spec.args == spec.args and got.train_iters == 1000, "get: %r" % got)

    # Status codes with the server's sentence as details.
    expect_error(grpc, lambda: ctl.GetJob(pb.GetJobRequest(job_id="j-404"), timeout=5),
                 grpc.StatusCode.NOT_FOUND, "job j-404 not found")
    expect_error(grpc, lambda: ctl.SubmitJob(pb.SubmitJobRequest(spec=pb.JobSpec()), timeout=5),
                 grpc.StatusCode.INVALID_ARGUMENT, "the job spec has no name: give --name")

    # A server stream, read in full.
    steps, kinds = 0, []
    for item in ctl.WatchJob(pb.WatchJobRequest(job_id=job.id), timeout=20):
        kind = item.WhichOneof("item")
        if kind == "step":
            steps += 1
            check(item.step.iteration == steps, "step %d out of order" % item.step.iteration)
            check(len(item.step.ranks) == 2, "ranks %r" % item.step.ranks)
        else:
            kinds.append(kind)
    check(steps == 1000 and kinds == ["event", "final_state"], "stream %d %r" % (steps, kinds))

    total = 0
    for chunk in ctl.GetTrace(pb.GetTraceRequest(job_id=job.id), timeout=20):
        data = chunk.data
        check(data[0] == (total * 7 + 3) % 251, "trace byte at %d" % total)
        total += len(data)
    check(total == 3 << 20, "trace of %d bytes" % total)

    # Client cancel, seen by the server (it marks the job CANCELLED).
    forever = ctl.SubmitJob(pb.SubmitJobRequest(spec=pb.JobSpec(name="forever")), timeout=5).job
    call = ctl.WatchJob(pb.WatchJobRequest(job_id=forever.id))
    for _ in range(3):
        next(call)
    call.cancel()
    deadline = time.time() + 5
    while ctl.GetJob(pb.GetJobRequest(job_id=forever.id), timeout=5).job.state != \
            pb.JOB_STATE_CANCELLED:
        check(time.time() < deadline, "the server never saw the cancel")
        time.sleep(0.02)

    # Deadline.
    t0 = time.time()
    expect_error(grpc, lambda: ctl.GetJob(pb.GetJobRequest(job_id="j-slow"), timeout=0.2),
                 grpc.StatusCode.DEADLINE_EXCEEDED)
    check(time.time() - t0 < 3, "deadline took %.1f s" % (time.time() - t0))

    # Unknown methods: promptly UNIMPLEMENTED.
    t0 = time.time()
    nope = ch.unary_unary("/mega.v1.Control/Nope")
    e = expect_error(grpc, lambda: nope(b"", timeout=10), grpc.StatusCode.UNIMPLEMENTED)
    check("unknown method /mega.v1.Control/Nope" in e.details(), "details %r" % e.details())
    peer = pbg.PeerStub(ch)
    expect_error(grpc, lambda: peer.KvGet(pb.KvGetRequest(key="k"), timeout=10),
                 grpc.StatusCode.UNIMPLEMENTED)
    check(time.time() - t0 < 2, "UNIMPLEMENTED took %.1f s" % (time.time() - t0))

    # Garbage in a request: INVALID_ARGUMENT, not a crash.
    raw = ch.unary_unary("/mega.v1.Control/GetJob")
    expect_error(grpc, lambda: raw(b"\xff\xff\xff\xff", timeout=5),
                 grpc.StatusCode.INVALID_ARGUMENT)

    # 40 parallel calls.
    with concurrent.futures.ThreadPoolExecutor(max_workers=40) as ex:
        futs = [ex.submit(ctl.ListNodes, pb.ListNodesRequest(), timeout=10) for _ in range(40)]
        for f in futs:
            check(f.result().self_node_id == "test-node", "ListNodes")

    # CancelJob answers 20 ms later, from a timer.
    c = ctl.CancelJob(pb.CancelJobRequest(job_id=job.id), timeout=5).job
    check(c.state == pb.JOB_STATE_CANCELLED, "cancel: %r" % c)


if __name__ == "__main__":
    main()
