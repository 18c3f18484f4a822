#!/usr/bin/python3
"""The pipeline engine across real processes (megaw ranks launched by hand,
meeting through a Gloo FileStore), checked against a single rank.

  equivalence  per-iteration losses of every (PP, VP, schedule, P2P options,
               layout, DP) equal the single-rank run's (--full: all of them;
               default: a sample that covers every option)
  memory       peak in-flight activations match the schedule's bound, and
               --deallocate-pipeline-outputs lowers the measured peak
  kill         a rank killed mid-schedule makes every other rank fail within
               seconds, with a cause that names the lost peer
  daemon       the same through megad run (the daemon's job machinery, its
               key-value store for rendezvous and its merged metrics):
               DP=2, DP=4, PP=2 x DP=2 and TP=2 x PP=2 equal the single rank
  checkpoint   a run saved mid-way under one layout (PP=2 1F1B, interleaved
               VP=2, PP=2 x DP=2, ...; sync or --async-save) and resumed
               under another gives the uninterrupted run's losses: exactly
               when the layout is the same, within RTOL of the single rank
               otherwise; every saved file matches its manifest (Python's
               zlib.crc32) (--full: every pair of layouts)

  dataparallel gradient buckets (seeds 002, 003): DP 2 and 4 x {plain,
               --overlap-grad-reduce, + --use-distributed-optimizer} x several
               buckets, alone, with PP=2 and with interleaved VP=2, with and
               without --align-grad-reduce: losses and clipped grad norms
               equal the single rank (--full: all of them; default: a sample
               that covers every option); stage 0 zeroes its gradients in its
               warmup wait (the trace), not at the iteration's start; under
               --variable-seq-lengths replicas holding different numbers of
               tokens report the single rank's loss
  distckpt     a distributed-optimizer checkpoint (DP=2, and PP=2 x DP=2 with
               --async-save) holds whole tensors under HF names, equal to the
               unsharded run's, and resumes at DP 1, 2 and 4 on the
               uninterrupted loss curve
  llama        a Llama (RoPE, RMSNorm, SwiGLU, 4 heads over 2 query groups),
               untied and tied: TP 2 (groups split), TP 2 x PP 2 with sequence
               parallelism, interleaved VP 2, zero-bubble, DP 2 with the
               distributed optimizer and overlap, recomputation, each equal to
               the single rank; a checkpoint saved at TP 2 x PP 2 resumes on
               one rank, and one rank's at TP 2 (--full: every combination of
               TP, PP schedule, DP, option and head)


usage: pipeline_check.py MEGAW {equivalence [--full] | memory | kill | daemon MEGAD |
                                checkpoint [--full] | dataparallel [--full] | distckpt |
                                llama [--full]}
"""
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import pipeline_ckpt
from ranks import (CKPT_ITERS, CKPT_SAVE_AT, ITERS, MODEL, RTOL, check_manifest, launch,
                   losses_of, losses_range, write_data)

LAYOUTS = {
    # name: {(pp, vp): args}
    "uniform": None,
    "string": {(2, 1): "Ettt|tttttL", (4, 1): "Et|tttt|t|ttL", (2, 2): "Et|ttt|tt|ttL",
               (4, 2): "Et|t|t|t|t|t|t|tL"},
    "first-last": {(2, 1): ["--decoder-first-pipeline-num-layers", "3"],
                   (4, 1): ["--decoder-first-pipeline-num-layers", "1",
                            "--decoder-last-pipeline-num-layers", "3"],
                   (2, 2): ["--decoder-first-pipeline-num-layers", "2"],
                   (4, 2): ["--decoder-first-pipeline-num-layers", "2",
                            "--decoder-last-pipeline-num-layers", "2"]},
}

P2P = {
    "even-odd": [],
    "batched": ["--batch-p2p-comm"],
    "overlap": ["--overlap-p2p-comm"],
    "overlap-warmup-flush": ["--overlap-p2p-comm", "--overlap-p2p-comm-warmup-flush"],
    "deallocate": ["--deallocate-pipeline-outputs"],
    "variable-seq": ["--variable-seq-lengths"],
}


def layout_args(name, pp, vp):
    spec = LAYOUTS[name]
    if spec is None:
        return ["--virtual-pipeline-model-parallel-size", str(vp)] if vp > 1 else []
    v = spec[(pp, vp)]
    if isinstance(v, str):
        return ["--pipeline-model-parallel-layout", v]
    return v + (["--virtual-pipeline-model-parallel-size", str(vp)] if vp > 1 else [])


def all_combos():
    for pp, vp, dp in itertools.product((2, 4), (1, 2), (1, 2)):
        scheds = ["interleaved"] if vp > 1 else ["gpipe", "1f1b", "zb-h1"]
        for sched, p2p, layout in itertools.product(scheds, P2P, LAYOUTS):
            yield pp, vp, dp, sched, p2p, layout


def sample_combos():
    """Every schedule at PP 2 and 4, every P2P option set with and without
    VP and at PP 2 and 4, every layout at every (PP, VP), and DP 1 and 2 with
    every schedule and option set."""
    combos = list(all_combos())
    picked, need = [], {}
    for c in combos:
        keys = [("sched-pp", c[3], c[0]), ("p2p-vp", c[4], c[1]), ("p2p-pp", c[4], c[0]),
                ("layout-pp-vp", c[5], c[0], c[1]), ("dp-sched", c[2], c[3]),
                ("dp-p2p", c[2], c[4])]
        if any(k not in need for k in keys):
            picked.append(c)
            for k in keys:
                need[k] = True
    return picked


def equivalence(megaw, tmp, full):
    data = os.path.join(tmp, "data.txt")
    write_data(data)
    base = MODEL + ["--train-iters", str(ITERS), "--data-path", data]
    ref = losses_of(launch(megaw, 1, base, tmp), "single rank")
    variable_ref = losses_of(launch(megaw, 1, base + ["--variable-seq-lengths"], tmp),
                             "single rank, variable lengths")
    combos = list(all_combos()) if full else sample_combos()
    failed = 0
    t0 = time.time()
    for pp, vp, dp, sched, p2p, layout in combos:
        name = "pp=%d vp=%d dp=%d %s %s layout=%s" % (pp, vp, dp, sched, p2p, layout)
        args = base + ["--pipeline-model-parallel-size", str(pp), "--schedule", sched]
        args += layout_args(layout, pp, vp) + P2P[p2p]
        want = variable_ref if p2p == "variable-seq" else ref
        try:
            got = losses_of(launch(megaw, pp * dp, args, tmp), name)
            for it, loss in want.items():
                if abs(got[it] - loss) > RTOL * abs(loss):
                    raise RuntimeError("%s: iteration %d loss %.9f, single rank %.9f" %
                                       (name, it, got[it], loss))
            print("ok   %s" % name, flush=True)
        except RuntimeError as e:
            failed += 1
            print("FAIL %s" % e, flush=True)
    print("%d of %d layouts match the single rank (%.0f s); reference losses %s" %
          (len(combos) - failed, len(combos), time.time() - t0,
           " ".join("%.6f" % ref[i] for i in sorted(ref))))
    return failed == 0


def memory(megaw, tmp):
    data = os.path.join(tmp, "data.txt")
    write_data(data)
    base = MODEL + ["--train-iters", "2", "--data-path", data,
                    "--pipeline-model-parallel-size", "4"]
    ok = True
    M, P = 8, 4

    def peaks(extra):
        res = launch(megaw, P, base + extra, tmp)
        losses_of_ok = all(rc == 0 for rc, _, _ in res)
        if not losses_of_ok:
            raise RuntimeError("memory run failed: %s" % [e for _, _, e in res])
        return [(r[1][0]["peak_inflight"], r[1][0]["peak_activation_bytes"]) for r in res]

    for sched, bound in (("1f1b", lambda r: min(P - r, M)), ("gpipe", lambda r: M)):
        got = peaks(["--schedule", sched])
        want = [bound(r) for r in range(P)]
        line = "%s peak in-flight per rank %s, bound %s" % (sched, [g[0] for g in got], want)
        if [g[0] for g in got] != want:
            ok = False
            print("FAIL " + line)
        else:
            print("ok   " + line)
    kept = peaks(["--schedule", "1f1b"])
    freed = peaks(["--schedule", "1f1b", "--deallocate-pipeline-outputs"])
    line = "peak activation bytes per rank: kept %s, deallocated %s" % (
        [k[1] for k in kept], [f[1] for f in freed])
    # The last stage sends nothing forward; every other stage must save memory.
    if all(f[1] < k[1] for k, f in zip(kept[:-1], freed[:-1])) and freed[-1][1] <= kept[-1][1]:
        print("ok   " + line)
    else:
        ok = False
        print("FAIL " + line)
    return ok


def kill(megaw, tmp):
    data = os.path.join(tmp, "data.txt")
    write_data(data)
    rdv = tempfile.mkdtemp(dir=tmp, prefix="rdv-")
    args = MODEL + ["--train-iters", "1000", "--data-path", data,
                    "--pipeline-model-parallel-size", "4", "--simulate-compute", "10:20",
                    "--world-size", "4", "--rendezvous-dir", rdv, "--json"]
    procs = [subprocess.Popen([megaw] + args + ["--rank", str(r)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(4)]
    # Wait until the pipeline is running: rank 3 has printed an iteration.
    first = procs[3].stdout.readline()
    if not first.startswith("{"):
        for p in procs:
            p.kill()
        print("FAIL the pipeline never ran: %r" % first)
        return False
    procs[1].send_signal(signal.SIGKILL)
    t0 = time.time()
    ok = True
    for r in (0, 2, 3):
        try:
            _, err = procs[r].communicate(timeout=10)
        except subprocess.TimeoutExpired:
            procs[r].kill()
            print("FAIL rank %d still running 10 s after rank 1 was killed" % r)
            ok = False
            continue
        dt = time.time() - t0
        cause = err.strip().splitlines()[-1] if err.strip() else ""
        good = procs[r].returncode != 0 and "failed or closed its connection" in cause
        print("%s rank %d exited %d after %.2f s: %s" %
              ("ok  " if good else "FAIL", r, procs[r].returncode, dt, cause))
        ok &= good and dt < 10
    procs[1].wait()
    return ok


def mismatch(megaw, tmp):
    """Ranks started by hand with different jobs stop at once, every one of
    them naming the flag (they would join other groups and hang, or swap
    buffers of other sizes); a reused --rendezvous-dir and a missing --rank
    are refused in words."""
    data = os.path.join(tmp, "data.txt")
    write_data(data)
    args = MODEL + ["--train-iters", "2", "--data-path", data]
    ok = True
    for extra, flag in ((["--pipeline-model-parallel-size", "2"], "--pipeline-model-parallel-size"),
                        (["--hidden-size", "64"], "--hidden-size"), (["--lr", "1e-3"], "--lr")):
        rdv = tempfile.mkdtemp(dir=tmp, prefix="rdv-")
        base = [megaw] + args + ["--world-size", "2", "--rendezvous-dir", rdv]
        t0 = time.time()
        procs = [subprocess.Popen(base + ["--rank", "0"], stderr=subprocess.PIPE, text=True,
                                  stdout=subprocess.DEVNULL),
                 subprocess.Popen(base + ["--rank", "1"] + extra, stderr=subprocess.PIPE,
                                  text=True, stdout=subprocess.DEVNULL)]
        for r, p in enumerate(procs):
            _, err = p.communicate(timeout=60)
            last = err.strip().splitlines()[-1] if err.strip() else ""
            good = p.returncode == 1 and "another job than rank 0" in last and flag in last
            print("%s rank %d, rank 1 with %s: exit %d after %.1f s: %s" %
                  ("ok  " if good else "FAIL", r, " ".join(extra), p.returncode,
                   time.time() - t0, last))
            ok &= good
    # the same directory again: the earlier launch's keys are there
    rdv = tempfile.mkdtemp(dir=tmp, prefix="rdv-")
    base = [megaw] + args + ["--world-size", "2", "--rendezvous-dir", rdv]
    for attempt in range(2):
        procs = [subprocess.Popen(base + ["--rank", str(r)], stderr=subprocess.PIPE, text=True,
                                  stdout=subprocess.DEVNULL) for r in range(2)]
        errs = [p.communicate(timeout=60)[1] for p in procs]
        rcs = [p.returncode for p in procs]
        want = [0, 0] if attempt == 0 else [1, 1]
        good = rcs == want and (attempt == 0 or all("fresh, empty directory" in e for e in errs))
        print("%s launch %d in one --rendezvous-dir: exits %s" %
              ("ok  " if good else "FAIL", attempt + 1, rcs))
        ok &= good
    res = subprocess.run([megaw] + args + ["--world-size", "2", "--rendezvous-dir", rdv],
                         capture_output=True, text=True, timeout=30)
    good = res.returncode == 2 and "needs --rank" in res.stderr
    print("%s --world-size without --rank: exit %d: %s" %
          ("ok  " if good else "FAIL", res.returncode, res.stderr.strip()))
    for shm in ("1", "0"):
        good &= other_vocab(megaw, tmp, args, shm)
    return ok and good


def write_gpt2_vocab(path, extra):
    """GPT-2's 256 byte tokens, `extra` more, and <|endoftext|>."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1))
          + list(range(ord("\u00ae"), ord("\u00ff") + 1)))
    cs = bs[:]
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + len(cs) - 188)
    vocab = {chr(c): i for i, c in enumerate(c for _, c in sorted(zip(bs, cs)))}
    for k in range(extra):
        vocab["x%d" % k] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)


def other_vocab(megaw, tmp, args, shm):
    """The same flags, but the --vocab-file each rank reads differs (as one
    path on two nodes may): the padded vocabularies, and with them the
    gradient buckets, differ. Both ranks stop naming the all-reduce and
    both sizes; through TCP (MEGA_COMM_SHM=0) Gloo used to end one with
    std::terminate, through shared memory both trained on wrong sums."""
    vf, mf = os.path.join(tmp, "vocab.json"), os.path.join(tmp, "merges.txt")
    with open(mf, "w") as f:
        f.write("#version: 0.2\n")
    write_gpt2_vocab(vf, 0)
    rdv = tempfile.mkdtemp(dir=tmp, prefix="rdv-")
    base = ([megaw] + args + ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vf,
                              "--merge-file", mf, "--world-size", "2", "--rendezvous-dir", rdv])
    env = dict(os.environ, MEGA_COMM_SHM=shm)
    procs = [subprocess.Popen(base + ["--rank", "0"], stderr=subprocess.PIPE, text=True,
                              stdout=subprocess.DEVNULL, env=env)]
    # rank 0 publishes its job once it has read its vocabulary
    deadline = time.time() + 60
    while not os.listdir(rdv) and time.time() < deadline and procs[0].poll() is None:
        time.sleep(0.01)
    write_gpt2_vocab(vf, 200)  # 257 tokens pad to 384, 457 to 512
    procs.append(subprocess.Popen(base + ["--rank", "1"], stderr=subprocess.PIPE, text=True,
                                  stdout=subprocess.DEVNULL, env=env))
    ok = True
    for r, p in enumerate(procs):
        _, err = p.communicate(timeout=60)
        last = err.strip().splitlines()[-1] if err.strip() else ""
        good = (p.returncode == 1 and "all_reduce of" in last and "rank %d called" % (1 - r) in last
                and "--vocab-file" in last and "terminate" not in err)
        print("%s rank %d with another vocabulary, MEGA_COMM_SHM=%s: exit %d: %s" %
              ("ok  " if good else "FAIL", r, shm, p.returncode, last or err.strip()[-300:]))
        ok &= good
    return ok


def daemon(megaw, megad, tmp):
    data = os.path.join(tmp, "data.txt")
    write_data(data)
    base = MODEL + ["--train-iters", str(ITERS), "--data-path", data]
    ref = losses_of(launch(megaw, 1, base, tmp), "single rank")
    ok = True
    for name, slots, extra in (("DP=2", 2, []), ("DP=4", 4, []),
                               ("PP=2 x DP=2, interleaved", 4,
                                ["--pipeline-model-parallel-size", "2",
                                 "--virtual-pipeline-model-parallel-size", "2"]),
                               ("PP=2 x DP=2, overlap, distributed optimizer", 4,
                                ["--pipeline-model-parallel-size", "2",
                                 "--overlap-grad-reduce", "--bucket-size", "3000",
                                 "--use-distributed-optimizer"]),
                               ("TP=2 x PP=2, sequence parallel", 4,
                                ["--tensor-model-parallel-size", "2", "--sequence-parallel",
                                 "--pipeline-model-parallel-size", "2"])):
        p = subprocess.run([megad, "run", "--slots", str(slots), "--json"] + base + extra,
                           capture_output=True, text=True, timeout=300)
        lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
        got = {l["iteration"]: l["loss"] for l in lines}
        bad = p.returncode != 0 or sorted(got) != sorted(ref) or any(
            abs(got[i] - ref[i]) > RTOL * abs(ref[i]) for i in ref)
        ranks = {r["rank"] for l in lines for r in l.get("ranks", [])}
        bad |= ranks != set(range(slots))
        # every rank reports its memory; sharded optimizer state is smaller
        mem = [(r["param_bytes"], r["grad_bytes"], r["optimizer_state_bytes"])
               for l in lines for r in l.get("ranks", [])]
        bad |= not mem or any(min(m) <= 0 for m in mem)
        if "--use-distributed-optimizer" in extra:
            bad |= any(m[2] >= 2 * m[0] for m in mem)
        print("%s megad run %s: losses %s (single rank %s), ranks reporting %s%s" %
              ("FAIL" if bad else "ok  ", name, " ".join("%.6f" % got[i] for i in sorted(got)),
               " ".join("%.6f" % ref[i] for i in sorted(ref)), sorted(ranks),
               (": exit %d: %s" % (p.returncode, p.stderr.strip()[-300:])) if bad else ""))
        ok &= not bad
    return ok




# Clipping active (the norms are about 4), so the global norm over shards is
# checked too; buckets of 3000 elements give 3 to 10 buckets per chunk.
DP_CLIP = ["--clip-grad", "0.05"]
DP_MODES = {
    "plain": [],
    "overlap": ["--overlap-grad-reduce", "--bucket-size", "3000"],
    "distributed": ["--overlap-grad-reduce", "--bucket-size", "3000",
                    "--use-distributed-optimizer"],
}
DP_PIPES = {
    "pp1": [],
    "pp2": ["--pipeline-model-parallel-size", "2"],
    "pp2-vp2": ["--pipeline-model-parallel-size", "2",
                "--virtual-pipeline-model-parallel-size", "2"],
}


def dp_combos():
    for dp, mode, pipe in itertools.product((2, 4), DP_MODES, DP_PIPES):
        for align in ((False, True) if mode != "plain" and pipe != "pp1" else (False,)):
            yield dp, mode, pipe, align, []


def dp_sample():
    """Every mode at DP 2 and 4, every pipeline with and without alignment,
    plus the extras: zero-bubble (readiness from W), --overlap-param-gather,
    --average-in-collective, the distributed optimizer without overlap."""
    picked, need = [], set()
    for c in dp_combos():
        keys = [("mode-dp", c[1], c[0]), ("pipe-align", c[2], c[3]), ("mode-pipe", c[1], c[2])]
        if any(k not in need for k in keys):
            picked.append(c)
            need.update(keys)
    return [c for c in picked if c[0] * (2 if c[2] != "pp1" else 1) <= 4] + [
        (2, "distributed", "pp2", False, ["--schedule", "zb-h1"]),
        (4, "distributed", "pp1", False, ["--overlap-param-gather"]),
        (2, "overlap", "pp1", False, ["--average-in-collective"]),
        (2, "plain", "pp1", False, ["--use-distributed-optimizer"]),
    ]


def losses_and_norms(results, what):
    losses = losses_of(results, what)
    norms = {}
    for _, lines, _ in results:
        for l in lines:
            norms.setdefault(l["iteration"], l["grad_norm"])
    return losses, norms


def dataparallel(megaw, tmp, full):
    data = os.path.join(tmp, "data.txt")
    write_data(data)
    base = MODEL + ["--train-iters", str(ITERS), "--data-path", data] + DP_CLIP
    ref, ref_norm = losses_and_norms(launch(megaw, 1, base, tmp), "single rank")
    combos = list(dp_combos()) + dp_sample()[-4:] if full else dp_sample()
    failed = 0
    t0 = time.time()
    for dp, mode, pipe, align, extra in combos:
        pp = 2 if pipe != "pp1" else 1
        name = "dp=%d %s %s%s %s" % (dp, mode, pipe, " align" if align else "", " ".join(extra))
        args = base + DP_MODES[mode] + DP_PIPES[pipe] + extra
        args += ["--align-grad-reduce"] if align else []
        try:
            got, norm = losses_and_norms(launch(megaw, pp * dp, args, tmp), name)
            for it, loss in ref.items():
                if abs(got[it] - loss) > RTOL * abs(loss):
                    raise RuntimeError("%s: iteration %d loss %.9f, single rank %.9f" %
                                       (name, it, got[it], loss))
                if abs(norm[it] - ref_norm[it]) > 1e-4 * ref_norm[it]:
                    raise RuntimeError("%s: iteration %d grad norm %.7f, single rank %.7f" %
                                       (name, it, norm[it], ref_norm[it]))
            print("ok   %s" % name, flush=True)
        except RuntimeError as e:
            failed += 1
            print("FAIL %s" % e, flush=True)
    print("%d of %d data-parallel layouts match the single rank (%.0f s)" %
          (len(combos) - failed, len(combos), time.time() - t0))
    zeroed = zeroed_while_waiting(megaw, base, tmp)
    uneven = uneven_replicas(megaw, base, tmp)
    return taken_during_backward(megaw, base, tmp) and zeroed and uneven and failed == 0


def uneven_replicas(megaw, base, tmp):
    """--variable-seq-lengths with replicas of unequal token counts: 6
    microbatches of 2 samples, of lengths 16, 14, 12, 10, 16, 14, give DP
    rank 0 84 target tokens and rank 1 80 in iteration 1, so the loss is
    the sum over both divided by their total, on every rank, equal to the
    single rank's (each rank once divided by its own count times DP, and
    the two reported different losses)."""
    args = base[:base.index("--global-batch-size")] + base[base.index("--global-batch-size") + 2:]
    args += ["--global-batch-size", "12", "--variable-seq-lengths"]
    ref, ref_norm = losses_and_norms(launch(megaw, 1, args, tmp), "uneven: single rank")
    ok = True
    for name, world, extra in (("dp=2", 2, []), ("pp=2 dp=2", 4, DP_PIPES["pp2"])):
        try:
            got, norm = losses_and_norms(launch(megaw, world, args + extra, tmp), name)
            for it, loss in ref.items():
                if abs(got[it] - loss) > RTOL * abs(loss) or \
                        abs(norm[it] - ref_norm[it]) > 1e-4 * ref_norm[it]:
                    raise RuntimeError("%s: iteration %d loss %.9f norm %.7f, single rank %.9f "
                                       "%.7f" % (name, it, got[it], norm[it], loss, ref_norm[it]))
            print("ok   uneven replicas (--variable-seq-lengths, 3 microbatches each) %s" % name)
        except RuntimeError as e:
            print("FAIL uneven replicas %s" % e, flush=True)
            ok = False
    return ok


def taken_during_backward(megaw, base, tmp):
    """A bucket whose reduction is over is taken (1/DP, the norm's share) by
    the next unit of backward, not by the wait after the schedule: at DP=2
    with a 400 ms simulated backward, the first buckets are taken long
    before the rank's compute ends. And a simulated backward writes no
    gradient: zeroed once, they stay zero (the norm is 0), and iteration 2
    zeroes nothing (no compute competing for the cores)."""
    args = base + DP_MODES["overlap"] + ["--simulate-compute", "20:400", "--trace-iteration", "2"]
    res = launch(megaw, 2, args, tmp)
    ok = True
    for rc, lines, err in res:
        if rc != 0:
            print("FAIL taken during backward: a rank exited %d: %s" % (rc, err.strip()[-400:]))
            return False
        for l in lines:
            zero = [x for x in l.get("spans", []) if x["name"] == "zero-grads"]
            if l["grad_norm"] != 0 or zero:
                print("FAIL simulated gradients: dp %d iteration %d: norm %g, %d zeroing spans" %
                      (l["dp_rank"], l["iteration"], l["grad_norm"], len(zero)))
                ok = False
            dp = [x for x in l.get("grad_reductions", []) if x["bucket"] >= 0]
            early = [x for x in dp if x["waited_s"] < l["work_end_s"] - 0.05]
            if not early:
                print("FAIL taken during backward: dp %d iteration %d took all %d buckets after "
                      "its compute ended (%s)" % (l["dp_rank"], l["iteration"], len(dp),
                      ", ".join("%.3f" % x["waited_s"] for x in dp)))
                ok = False
    if ok:
        print("ok   reductions that were over were taken while backward ran")
    return ok


def zeroed_while_waiting(megaw, base, tmp):
    """Stage 0 zeroes its gradients in its warmup wait, after its first
    forward and before its first backward, not at the iteration's start
    (the trace of PP=2 x DP=2 with overlap)."""
    args = base + DP_MODES["overlap"] + DP_PIPES["pp2"] + ["--trace-iteration", "2"]
    res = launch(megaw, 4, args, tmp)
    for rc, _, err in res:
        if rc != 0:
            print("FAIL zeroing trace: a rank exited %d: %s" % (rc, err.strip()[-400:]))
            return False
    ok = True
    for _, lines, _ in res:
        for l in lines:
            if l["iteration"] != 2 or l["pp_rank"] != 0:
                continue
            spans = l.get("spans", [])
            zero = [x for x in spans if x["name"] == "zero-grads"]
            first_f = next((x for x in spans if x["name"].startswith("F")), None)
            first_b = next((x for x in spans if x["name"].startswith("B")), None)
            if not zero or not first_f or not first_b:
                print("FAIL zeroing trace: dp %d has no zero-grads, F or B span" % l["dp_rank"])
                ok = False
                continue
            start = min(x["start_us"] for x in zero)
            end = max(x["start_us"] + x["dur_us"] for x in zero)
            if start < first_f["start_us"] + first_f["dur_us"] or end > first_b["start_us"]:
                print("FAIL zeroing trace: dp %d zeroed over %.0f..%.0f us, its first F ended "
                      "at %.0f and its first B began at %.0f" %
                      (l["dp_rank"], start, end, first_f["start_us"] + first_f["dur_us"],
                       first_b["start_us"]))
                ok = False
    if ok:
        print("ok   stage 0 zeroed its gradients between its first F and its first B")
    return ok


# A small Llama: 4 query heads over 2 groups, SwiGLU, RMSNorm, RoPE.
LLAMA = ["--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
         "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
         "--ffn-hidden-size", "64", "--group-query-attention", "--num-query-groups", "2",
         "--disable-bias-linear", "--seq-length", "16", "--micro-batch-size", "2",
         "--global-batch-size", "16", "--lr", "3e-3", "--lr-warmup-iters", "1",
         "--clip-grad", "1.0", "--seed", "7"]
UNTIE = ["--untie-embeddings-and-output-weights"]
LLAMA_PIPES = {  # name: (PP, flags)
    "pp1": (1, []),
    "1f1b": (2, ["--pipeline-model-parallel-size", "2", "--schedule", "1f1b"]),
    "vp2": (2, ["--pipeline-model-parallel-size", "2",
                "--virtual-pipeline-model-parallel-size", "2"]),
    "zb-h1": (2, ["--pipeline-model-parallel-size", "2", "--schedule", "zb-h1"]),
}
LLAMA_EXTRAS = {  # name: (needs TP 2, needs DP 2, flags)
    "plain": (False, False, []),
    "sp": (True, False, ["--sequence-parallel"]),
    "dist-overlap": (False, True, ["--use-distributed-optimizer", "--overlap-grad-reduce",
                                   "--bucket-size", "3000", "--overlap-param-gather"]),
    "full-recompute": (False, False, ["--recompute-granularity", "full", "--recompute-method",
                                      "uniform", "--recompute-num-layers", "1"]),
    "selective": (False, False, ["--recompute-granularity", "selective"]),
}


def llama_combos():
    for tp, dp, pipe, extra, untied in itertools.product((1, 2), (1, 2), LLAMA_PIPES,
                                                         LLAMA_EXTRAS, (True, False)):
        pp = LLAMA_PIPES[pipe][0]
        need_tp, need_dp, _ = LLAMA_EXTRAS[extra]
        if tp * pp * dp > 4 or (need_tp and tp < 2) or (need_dp and dp < 2):
            continue
        yield tp, dp, pipe, extra, untied


# The cases: TP 2 (query groups split), TP 2 x PP 2 with sequence
# parallelism, interleaved VP 2, zero-bubble, DP 2 with the distributed
# optimizer and overlap, recomputation; and a tied head across PP 2 (the
# embedding group) and in TP.
LLAMA_SAMPLE = [(2, 1, "pp1", "plain", True), (2, 1, "1f1b", "sp", True),
                (1, 1, "vp2", "plain", True), (1, 1, "zb-h1", "plain", True),
                (1, 2, "pp1", "dist-overlap", True), (1, 2, "1f1b", "full-recompute", True),
                (2, 1, "pp1", "selective", True), (1, 1, "1f1b", "plain", False),
                (2, 1, "zb-h1", "full-recompute", False)]
# saved under (world, flags), resumed under (world, flags)
LLAMA_CKPT = [((4, ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                    "--sequence-parallel"]), (1, [])),
              ((1, []), (2, ["--tensor-model-parallel-size", "2"]))]


def llama(megaw, tmp, full):
    """A Llama's losses under every layout equal the single rank's, untied
    and tied; and a checkpoint saved under one layout resumes under another
    on the single rank's curve."""
    data = os.path.join(tmp, "data.txt")
    write_data(data)
    base = LLAMA + ["--train-iters", str(ITERS), "--data-path", data]
    refs = {u: losses_of(launch(megaw, 1, base + (UNTIE if u else []), tmp),
                         "single rank, %s" % ("untied" if u else "tied"))
            for u in (True, False)}
    combos = list(llama_combos()) if full else LLAMA_SAMPLE
    failed = 0
    t0 = time.time()
    for tp, dp, pipe, extra, untied in combos:
        pp, pflags = LLAMA_PIPES[pipe]
        name = "llama tp=%d pp=%d dp=%d %s %s %s" % (tp, pp, dp, pipe, extra,
                                                      "untied" if untied else "tied")
        args = base + pflags + LLAMA_EXTRAS[extra][2] + (UNTIE if untied else [])
        args += ["--tensor-model-parallel-size", str(tp)] if tp > 1 else []
        try:
            got = losses_of(launch(megaw, tp * pp * dp, args, tmp), name)
            for it, loss in refs[untied].items():
                if abs(got[it] - loss) > RTOL * abs(loss):
                    raise RuntimeError("%s: iteration %d loss %.9f, single rank %.9f" %
                                       (name, it, got[it], loss))
            print("ok   %s" % name, flush=True)
        except RuntimeError as e:
            failed += 1
            print("FAIL %s" % e, flush=True)
    ckpt = base[:-4] + ["--data-path", data, "--lr-decay-iters", str(CKPT_ITERS)] + UNTIE
    ref = losses_range(launch(megaw, 1, ckpt + ["--train-iters", str(CKPT_ITERS)], tmp),
                       "single rank", 1, CKPT_ITERS)
    for k, ((w1, f1), (w2, f2)) in enumerate(LLAMA_CKPT):
        name = "llama checkpoint saved at %s, resumed at %s" % (
            " ".join(f1) or "one rank", " ".join(f2) or "one rank")
        save = os.path.join(tmp, "llama-ckpt-%d" % k)
        try:
            got = losses_range(launch(megaw, w1, ckpt + f1 + ["--train-iters", str(CKPT_SAVE_AT),
                                                              "--save", save], tmp),
                               name, 1, CKPT_SAVE_AT)
            check_manifest(os.path.join(save, "iter_%07d" % CKPT_SAVE_AT))
            got.update(losses_range(launch(megaw, w2, ckpt + f2 + [
                "--train-iters", str(CKPT_ITERS), "--load", save], tmp), name,
                CKPT_SAVE_AT + 1, CKPT_ITERS))
            bad = [i for i in ref if abs(got[i] - ref[i]) > RTOL * abs(ref[i])]
            if bad:
                raise RuntimeError("%s: iteration %d loss %.9f, single rank %.9f" %
                                   (name, bad[0], got[bad[0]], ref[bad[0]]))
            print("ok   %s" % name, flush=True)
        except RuntimeError as e:
            failed += 1
            print("FAIL %s" % e, flush=True)
    n = len(combos) + len(LLAMA_CKPT)
    print("%d of %d Llama layouts and checkpoint pairs match the single rank (%.0f s)" %
          (n - failed, n, time.time() - t0))
    return failed == 0


def main():
    modes = ("equivalence", "memory", "kill", "daemon", "checkpoint", "dataparallel", "distckpt",
             "llama", "mismatch")
    if len(sys.argv) < 3 or sys.argv[2] not in modes:
        print(__doc__, file=sys.stderr)
        return 2
    megaw, mode = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory(prefix="mega-pipeline-") as tmp:
        if mode == "equivalence":
            ok = equivalence(megaw, tmp, "--full" in sys.argv[3:])
        elif mode == "memory":
            ok = memory(megaw, tmp)
        elif mode == "daemon":
            ok = daemon(megaw, sys.argv[3], tmp)
        elif mode == "checkpoint":
            ok = pipeline_ckpt.checkpoint(megaw, tmp, "--full" in sys.argv[3:])
        elif mode == "dataparallel":
            ok = dataparallel(megaw, tmp, "--full" in sys.argv[3:])
        elif mode == "distckpt":
            ok = pipeline_ckpt.distckpt(megaw, tmp)
        elif mode == "llama":
            ok = llama(megaw, tmp, "--full" in sys.argv[3:])
        elif mode == "mismatch":
            ok = mismatch(megaw, tmp)
        else:
            ok = kill(megaw, tmp)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
