#!/usr/bin/python3
"""Data-parallel gradient benchmarks (seeds 002 and 003); figures, never a
pass/fail. Each section runs its configurations side by side, --runs
rounds over (interleaved, so the machine's load falls on all alike), and
reports the median over rounds.

  overlap  DP=2 with --simulate-compute and real-sized gradients (hidden 512,
           4 layers, 12.8M parameters): exposed grad sync without and with
           --overlap-grad-reduce at a few bucket sizes, and the fraction of
           the reduction hidden behind backward, 1 - exposed(overlap) /
           exposed(no overlap)
  bubble   PP=4 x DP=2 with --simulate-compute: exposed grad sync (mean over
           ranks, and per pipeline rank) with the reduction after each
           rank's schedule against launched in the cooldown (1F1B, and
           interleaved VP=2 with and without --align-grad-reduce), beside
           core/sim's prediction (megactl plan: --t-grad-sync is PP rank 0's
           floats at bench_comm's rate for one all-reduce alone, measured
           in the same round over 64 buffers in turn, so that each call's
           floats come from memory as the engine's buckets do under
           --simulate-compute, --grad-bucket-sizes the buckets of its last
           chunk, --grad-sync-slowdown bench_comm lanes' slowdowns of 1, 2
           and 4 pairs reducing at once, 3 between; and the same with
           equal buckets, "x eq", and with the engine's own rate, that of
           its bucket reductions with no other stage's beside them in the
           round's runs, "x own"); the same runs counted from the latest
           pipeline end of either replica, as core/sim counts exposed time,
           against both pricings and a third, "x cpu": the engine's own rate
           with its reductions sharing the cores as they use them (a DP=2
           run alone each round: a pair keeps u cores busy, so
           --grad-sync-lanes cores/u); then where the exposed time went (the
           replicas' skew, the embedding sum, the comm threads waiting for a
           core, the reductions themselves) and the comm threads' CPU
  bubble4  the same at PP=2 x DP=2: four processes on the cores instead of
           eight, the same stages, against the same model
  memory   --use-distributed-optimizer: optimizer_state_bytes per rank at
           DP=1, 2 and 4 against the unsharded figure
  compute  a real model at DP=2: tokens/s without and with overlap (and the
           distributed optimizer) on this machine

  overlap8 the same as overlap with 8 layers (twice the gradients, the same tail)
  timeline PP=2 x DP=2, 1F1B with the sync in the cooldown, one run: every
           rank's reductions in one iteration (size, launched, started,
           done, waited, run-queue wait) against the pipeline's end, to see
           which of them the exposed time is

usage: bench_dp.py MEGAW MEGACTL [--runs N] [--max-load L] [--lanes L]
                   [overlap|overlap8|bubble|bubble4|memory|compute|timeline ...]
  --runs N      rounds of the overlap and bubble sections (5)
  --max-load L  before each run wait (up to 10 minutes) until the 1-minute
                load average is at most L; the loads are printed either way
  --lanes L     core/sim's --grad-sync-lanes L instead of bench_comm's
                slowdowns (0: each stage's data-parallel group on links of
                its own)
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "engine"))
from ranks import launch, write_data  # noqa: E402

WIDE = ["--hidden-size", "512", "--num-attention-heads", "8", "--seq-length", "64",
        "--micro-batch-size", "1", "--lr", "1e-3"]


OPTS = {"runs": 5, "max_load": None, "lanes": None}
COLD_BUFFERS = 64
LOADS = []  # the 1-minute load average before each run of the current section


def wait_quiet():
    """The load average now, after waiting (with --max-load) for it to drop."""
    deadline = time.time() + 600
    while True:
        load = os.getloadavg()[0]
        if OPTS["max_load"] is None or load <= OPTS["max_load"] or time.time() > deadline:
            return load
        time.sleep(10)


def run(megaw, world, args, tmp):
    LOADS.append(wait_quiet())
    res = launch(megaw, world, args, tmp, timeout=900)
    for rc, _, err in res:
        if rc != 0:
            raise SystemExit("a rank failed: " + err.strip()[-400:])
    return [lines for _, lines, _ in res]


def print_loads():
    if LOADS:
        print("(1-minute load average before the runs: min %.2f, median %.2f, max %.2f over %d "
              "runs%s)" % (min(LOADS), statistics.median(LOADS), max(LOADS), len(LOADS),
                           "" if OPTS["max_load"] is None else
                           ", each waited for <= %.2f" % OPTS["max_load"]))
    del LOADS[:]


def after(ranks, key, skip):
    """Per rank, the values of key in the iterations after the first skip."""
    return [[l[key] for l in lines if l["iteration"] > skip] for lines in ranks]


def plan(megactl, args):
    out = subprocess.run([megactl, "plan", "--format", "json"] + args, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def med(values):
    return statistics.median(values) if values else float("nan")


def overlap(megaw, megactl, tmp, layers=4):
    data = os.path.join(tmp, "data.txt")
    write_data(data)
    iters, skip, f, b = 12, 2, 25 * layers, 50 * layers
    args = WIDE + ["--num-layers", str(layers), "--global-batch-size", "8", "--train-iters",
                   str(iters), "--data-path", data, "--simulate-compute", "%d:%d" % (f, b)]
    print("== DP overlap: DP=2, hidden 512, %d layers, M=4, --simulate-compute %d:%d (ms per "
          "microbatch), real-sized gradient buffers, iterations %d..%d, %d rounds" %
          (layers, f, b, skip + 1, iters, OPTS["runs"]))
    print("%-34s %8s %20s %9s %16s" % ("configuration", "buckets", "exposed ms mean/med",
                                       "step ms", "hidden (range)"))
    rows = (("no overlap (one bucket)", [], 1),
            ("--overlap-grad-reduce, default 40M", ["--overlap-grad-reduce"], None),
            ("--overlap-grad-reduce, 4M", ["--overlap-grad-reduce", "--bucket-size", "4000000"],
             None),
            ("--overlap-grad-reduce, 2M", ["--overlap-grad-reduce", "--bucket-size", "2000000"],
             None),
            ("--overlap-grad-reduce, 1M", ["--overlap-grad-reduce", "--bucket-size", "1000000"],
             None))
    got = {name: [] for name, _, _ in rows}  # per round: (mean, median, step, hidden)
    grad = 0
    for _ in range(OPTS["runs"]):
        base = None
        for name, extra, _ in rows:
            ranks = run(megaw, 2, args + extra, tmp)
            values = sum(after(ranks, "grad_sync_exposed_s", skip), [])
            exposed = statistics.mean(values)
            step = statistics.median(sum(after(ranks, "step_time_s", skip), []))
            grad = ranks[0][-1]["grad_bytes"] / 4
            base = exposed if base is None else base
            got[name].append((exposed, statistics.median(values), step,
                              1 - exposed / base if base > 0 else float("nan")))
    for name, extra, buckets in rows:
        if buckets is None:
            size = float(extra[-1]) if extra[-1].isdigit() else 40e6
            buckets = "~%d" % max(1, round(grad / size))
        g = got[name]
        hidden = [x[3] for x in g]
        print("%-34s %8s %12.1f / %5.1f %9.1f %7.1f%% (%.0f..%.0f)" %
              (name, buckets, 1e3 * med([x[0] for x in g]), 1e3 * med([x[1] for x in g]),
               1e3 * med([x[2] for x in g]), 100 * med(hidden), 100 * min(hidden),
               100 * max(hidden)))
    print("(exposed: over both ranks and the iterations, median over rounds; hidden: of the "
          "mean,\n against the round's no-overlap run; %.1fM gradient floats per rank)" %
          (grad / 1e6))
    print_loads()


def overlap8(megaw, megactl, tmp):
    overlap(megaw, megactl, tmp, layers=8)


# ---- bubble hiding (seed 003) ----

def comm_figures(megaw):
    """The machine's collectives, for core/sim: the seconds per float of a
    1M-float all-reduce between two ranks alone, bench_comm lanes' figure
    (or --lanes), its slowdowns for 1..4 pairs at once (--grad-sync-slowdown;
    None with --lanes) and --grad-sync-latency (the seconds of a 1,024-float
    all-reduce alone), with a note of where they came from."""
    exe = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(megaw))), "bench",
                       "bench_comm")
    load = wait_quiet()
    # Over 64 buffers (256 MB a rank): --simulate-compute leaves the engine's
    # gradients untouched between reductions, so each bucket comes from
    # memory; one buffer stays in the caches and ran 1.15-1.5x faster.
    out = subprocess.run([exe, "lanes", "1000000", str(COLD_BUFFERS)], capture_output=True,
                         text=True, timeout=900)
    alone = lanes = latency = None
    slow = {}  # pairs at once -> how much slower each runs than one alone
    for line in out.stdout.splitlines():
        if line.startswith("pairs=1 "):
            alone = float(line.split()[1]) * 1e-3 / 1e6
        if line.startswith("pairs="):
            slow[int(line.split()[0][6:])] = float(line.split("(")[1].split("x")[0])
        if line.startswith("lanes="):
            lanes = float(line[6:])
    # a collective's latency: one small all-reduce alone (1,024 floats), the
    # median of five runs: one run's mean moved 0.25-1.96 ms between rounds
    # (two cores idle between calls, then wake), and core/sim's prediction
    # for many small collectives (align) 15x with it
    samples, errs = [], ""
    for _ in range(5):
        small = subprocess.run([exe, "lanes", "1024"], capture_output=True, text=True,
                               timeout=900)
        errs += small.stderr[-200:]
        for line in small.stdout.splitlines():
            if line.startswith("pairs=1 "):
                samples.append(float(line.split()[1]) * 1e-3)
    latency = statistics.median(samples) if samples else None
    if alone is None or lanes is None or latency is None:
        raise SystemExit("bench_comm lanes failed: " + out.stderr[-400:] + errs)
    pairs = "; ".join(l.split("  ")[0] + " " + l.split("(")[1].split(")")[0]
                      for l in out.stdout.splitlines() if l.startswith("pairs="))
    note = ("bench_comm lanes (%d buffers) at load %.2f: %.2f ms per 1M-float all-reduce alone, "
            "%s; %.2f ms per 1,024-float one (the latency: median of %s)" %
            (COLD_BUFFERS, load, alone * 1e9, pairs, latency * 1e3,
             " ".join("%.2f" % (1e3 * x) for x in samples)))
    if OPTS["lanes"] is not None:
        lanes, note = OPTS["lanes"], note + "; lanes given with --lanes"
        return alone, lanes, None, latency, note
    # the slowdowns for k = 1..4 pairs at once, 3 between 2 and 4 by total speed
    if sorted(slow) != [1, 2, 4]:
        raise SystemExit("bench_comm lanes printed pairs %s, not 1, 2 and 4" % sorted(slow))
    speed3 = (2 / slow[2] + 4 / slow[4]) / 2
    table = [1.0, max(1.0, slow[2]), max(1.0, 3 / speed3), max(1.0, slow[4])]
    return alone, lanes, table, latency, note


def engine_rate(runs, skip, DP=2):
    """The engine's own collectives: the seconds per float of its bucket
    reductions of over 0.5M floats that ran with no other stage's beside
    them (from both replicas having started to the first done), the median
    over every iteration of runs, or None."""
    rates = []
    for ranks in runs:
        for rk in by_iteration(ranks, skip).values():
            pairs = []
            for (pp, dp), l in rk.items():
                if dp != 0 or any((pp, d) not in rk for d in range(DP)):
                    continue
                reds = [{x["bucket"]: x for x in rk[(pp, d)].get("grad_reductions", [])
                         if x["bucket"] >= 0} for d in range(DP)]
                for k, x in reds[0].items():
                    if any(k not in r for r in reds):
                        continue
                    both = [at(rk[(pp, d)], "started_s", reds[d][k]) for d in range(DP)]
                    done = [at(rk[(pp, d)], "done_s", reds[d][k]) for d in range(DP)]
                    if None in both or None in done:
                        continue
                    pairs.append((pp, x["floats"], max(both), min(done)))
            for pp, n, a, e in pairs:
                if n > 500000 and e > a and not any(q[0] != pp and q[2] < e and q[3] > a
                                                    for q in pairs):
                    rates.append((e - a) / n)
    return statistics.median(rates) if rates else None


def engine_cores(megaw, tmp, data):
    """How many cores one pair's bucket reduction keeps busy in the engine:
    DP=2 alone (--simulate-compute: the training thread sleeps, nothing but
    the reductions runs beside it), 1M-float buckets, each rank's CPU but
    its training thread's over the time its reductions ran, summed over the
    pair; the median over iterations, or None."""
    args = WIDE + ["--num-layers", "4", "--global-batch-size", "8", "--train-iters", "6",
                   "--data-path", data, "--simulate-compute", "20:40",
                   "--overlap-grad-reduce", "--bucket-size", "1000000"]
    per_it = []
    for rk in by_iteration(run(megaw, 2, args, tmp), 2).values():
        used = []
        for l in rk.values():
            wall = sum(x["done_s"] - x["started_s"] for x in l.get("grad_reductions", [])
                       if x["bucket"] >= 0 and x["done_s"] >= 0 and x["started_s"] >= 0)
            if wall > 0:
                used.append((l["process_cpu_s"] - l["thread_cpu_s"]) / wall)
        if len(used) == 2:
            per_it.append(sum(used))
    return statistics.median(per_it) if per_it else None


def by_iteration(ranks, skip):
    rows = {}
    for lines in ranks:
        for l in lines:
            if l["iteration"] > skip:
                rows.setdefault(l["iteration"], {})[(l["pp_rank"], l["dp_rank"])] = l
    return rows


def at(l, key, x=None):
    """A time of line l (or of its reduction x) on the shared wall clock, seconds."""
    v = (x or l)[key]
    return l["step_start_unix_us"] / 1e6 + v if v >= 0 else None


def split_exposed(l, peers):
    """Rank line l's exposed grad sync, split: waiting for a data-parallel
    peer whose pipeline ended later (skew), the tied embedding's exchange
    past the rank's own reductions (embd: since the loss stage's copy joins
    stage 0's wte bucket before its reduction, it ends before them and
    counts nothing; kept to show it), its comm thread waiting for a core
    while the rest ran (runq), and the rest (moving bytes, CPU, latency)."""
    e = l["grad_sync_exposed_s"]
    w0, w1 = at(l, "drained_s"), at(l, "reduced_s")
    skew = min(e, max([0.0] + [at(p, "drained_s") - w0 for p in peers]))
    dp = [x for x in l.get("grad_reductions", []) if x["bucket"] >= 0]
    ends = [at(l, "done_s", x) or at(l, "waited_s", x) for x in dp]
    dp_end = max([t for t in ends if t is not None] or [w0])
    embd = 0.0
    for x in l.get("grad_reductions", []):
        done = at(l, "done_s", x) or at(l, "waited_s", x)
        if x["bucket"] < 0 and done is not None and done <= w1 + 1e-6:
            embd = max(0.0, done - max(w0, dp_end))
    embd = min(e - skew, embd)
    runq, lo = 0.0, w0 + skew
    for x in dp:
        a, b = at(l, "started_s", x), at(l, "done_s", x)
        if a is None or b is None or b <= a or x["runq_s"] < 0:
            continue
        part = max(0.0, min(b, w1) - max(a, lo)) / (b - a)
        runq += x["runq_s"] * part
    runq = min(e - skew - embd, runq)
    return e, skew, embd, runq, e - skew - embd - runq


def analyse(ranks, skip, P, DP):
    """Per round: the mean over ranks and iterations of the exposed time and
    its parts, each PP rank's exposed time, stage 0's replica skew, and the
    comm threads' CPU per step (all ranks) against the step."""
    parts, per_pp, skews, cpu, steps = [], {r: [] for r in range(P)}, [], [], []
    own, per_pp_job = {r: [] for r in range(P)}, {r: [] for r in range(P)}
    for it, rk in by_iteration(ranks, skip).items():
        for (pp, dp), l in rk.items():
            peers = [rk[(pp, d)] for d in range(DP) if d != dp and (pp, d) in rk]
            parts.append(split_exposed(l, peers))
            per_pp[pp].append(l["grad_sync_exposed_s"])
            per_pp_job[pp].append(parts[-1][0] - parts[-1][1])
            own[pp].append(max(0.0, l["reduced_s"] - l["work_end_s"]))
        ends = [at(rk[(0, d)], "drained_s") for d in range(DP) if (0, d) in rk]
        skews.append(max(ends) - min(ends))
        cpu.append(sum(l["process_cpu_s"] - l["thread_cpu_s"] for l in rk.values()))
        steps.append(max(l["step_time_s"] for l in rk.values()))
    mean = [statistics.mean(p[k] for p in parts) for k in range(5)]
    return {"parts": mean, "exposed": mean[0], "exposed_job": mean[0] - mean[1],
            "pp": [statistics.mean(per_pp[r]) for r in range(P)],
            "pp_job": [statistics.mean(per_pp_job[r]) for r in range(P)],
            "own": [statistics.mean(own[r]) for r in range(P)],
            "skew": statistics.mean(skews), "cpu": statistics.mean(cpu),
            "step": statistics.mean(steps)}


def bubble_section(megaw, megactl, tmp, P, layers):
    data = os.path.join(tmp, "data.txt")
    write_data(data)
    DP, M, iters, skip, f, b = 2, 8, 10, 2, 20, 40
    bucket = 1000000
    cores = os.cpu_count()
    args = WIDE + ["--num-layers", str(layers), "--global-batch-size", str(M * DP),
                   "--train-iters", str(iters), "--data-path", data,
                   "--pipeline-model-parallel-size", str(P), "--simulate-compute",
                   "%d:%d" % (f, b)]
    print("== bubble hiding: PP=%d x DP=%d (%d processes, %d cores), hidden 512, %d layers, "
          "M=%d, --simulate-compute %d:%d, buckets of %d, iterations %d..%d, %d rounds" %
          (P, DP, P * DP, cores, layers, M, f, b, bucket, skip + 1, iters, OPTS["runs"]))
    ov = ["--overlap-grad-reduce", "--bucket-size", str(bucket)]
    rows = (("1f1b, sync after the schedule", 1, [], []),
            ("1f1b, sync in the cooldown", 1, ov, ["--overlap-grad-reduce"]),
            ("interleaved V=2, after the schedule", 2, [], []),
            ("interleaved V=2, in the cooldown", 2, ov, ["--overlap-grad-reduce"]),
            ("interleaved V=2, cooldown + align", 2, ov + ["--align-grad-reduce"],
             ["--overlap-grad-reduce", "--align-grad-reduce"]))
    got = {name: [] for name, _, _, _ in rows}
    notes, own_rates, own_cores = [], [], []
    for _ in range(OPTS["runs"]):
        # the machine's collectives, again each round: they move with its load
        alone, lanes, slowdown, latency, comm_note = comm_figures(megaw)
        notes.append(comm_note)
        # the engine's reductions share the cores: a pair keeps u of them
        # busy, so cores / u run at full speed at once (--grad-sync-lanes)
        u = engine_cores(megaw, tmp, data)
        own_cores.append(u)
        runs = []
        for name, vp, extra, plan_flags in rows:
            a = args + extra
            if vp > 1:
                a += ["--virtual-pipeline-model-parallel-size", str(vp)]
            runs.append(run(megaw, P * DP, a, tmp))
        own = engine_rate(runs, skip, DP)
        own_rates.append(own)
        base, base_own = {}, {}
        for (name, vp, extra, plan_flags), ranks in zip(rows, runs):
            res = analyse(ranks, skip, P, DP)
            if not plan_flags:
                base[vp], base_own[vp] = res["exposed"], res["own"]
            # the "mean over ranks": each rank's own reduction (its
            # time from its schedule's end to its reductions' end with the
            # sync after the schedule), the share of it not exposed
            for key, pp in (("hidden_rank", "pp"), ("hidden_rank_job", "pp_job")):
                res[key] = statistics.mean(1 - min(1.0, e / o) if o > 0 else 1.0
                                           for e, o in zip(res[pp], base_own[vp]))
            # T_grad_sync: PP rank 0's reductions (its buckets: the tied
            # embedding's exchange, bucket -1, is a receive before its wte
            # bucket, not a reduction) at the rate of one all-reduce alone
            stage0 = [x for lines in ranks for l in lines[-1:] if l["pp_rank"] == 0
                      for x in l.get("grad_reductions", []) if x["bucket"] >= 0]
            floats0 = sum(x["floats"] for x in stage0) / DP
            # its collectives per chunk, small ones too (each costs the
            # latency), at their sizes: those of the chunk it launches last,
            # whose reductions end the pipeline
            one = next(l for lines in ranks for l in lines[-1:] if l["pp_rank"] == 0)
            mine = sorted((x for x in one.get("grad_reductions", []) if x["bucket"] >= 0),
                          key=lambda x: x["launched_s"])
            sizes = [x["floats"] for x in mine[len(mine) - max(1, round(len(mine) / vp)):]]

            def predict(rate, buckets, lanes_at=None):
                flags = ["--pipeline-model-parallel-size", str(P), "--num-microbatches", str(M),
                         "--t-forward", str(f), "--t-backward", str(b),
                         "--t-grad-sync", "%.3f" % (1e3 * rate * floats0),
                         "--grad-sync-latency", "%.3f" % (1e3 * latency)]
                flags += (["--grad-bucket-sizes", ",".join(str(n) for n in sizes)] if buckets
                          else ["--grad-buckets", str(len(sizes))])
                if vp > 1:
                    flags += ["--virtual-pipeline-model-parallel-size", str(vp)]
                if lanes_at:
                    flags += ["--grad-sync-lanes", "%.3f" % lanes_at]
                elif slowdown:
                    flags += ["--grad-sync-slowdown", ",".join("%.3f" % x for x in slowdown)]
                elif lanes >= 1:
                    flags += ["--grad-sync-lanes", "%.3f" % lanes]
                return plan(megactl, flags + plan_flags)["grad_sync_exposed"] / 1e3

            res["sim"] = predict(alone, True)
            # the model before it knew bucket sizes: equal ones, as many
            res["sim_equal"] = predict(alone, False)
            # the engine's own collectives for T_grad_sync
            res["sim_own"] = predict(own, True) if own else float("nan")
            # and sharing the cores as its own reductions use them
            res["sim_cpu"] = (predict(own, True, max(1.0, cores / u)) if own and u
                              else float("nan"))
            res["sizes"] = sizes
            res["t_gs"] = alone * floats0
            res["t_gs_own"] = (own or float("nan")) * floats0
            res["hidden"] = 1 - res["exposed"] / base[vp] if base[vp] > 0 else float("nan")
            res["ratio"] = res["exposed"] / res["sim"] if res["sim"] > 0 else float("nan")
            got[name].append(res)
    for k, note in enumerate(notes):
        own = own_rates[k]
        print("core/sim, round %d: %s; the engine's own: %s" %
              (k + 1, note, "%.2f ms per 1M floats" % (own * 1e9) if own else "none alone"))
    print("%-36s %8s %7s %7s %8s %6s %6s %6s  %-24s" % ("configuration", "exposed", "hidden",
                                                          "h/rank", "sim", "x sim", "x eq",
                                                          "x own", "per PP rank (ms)"))

    def ratio(x, key):
        return x["exposed"] / x[key] if x[key] > 0 else float("nan")

    def ratio_job(x, key):
        return x["exposed_job"] / x[key] if x[key] > 0 else float("nan")

    for name, _, _, _ in rows:
        g = got[name]
        print("%-36s %5.1f ms %6.1f%% %6.1f%% %5.1f ms %5.2fx %5.2fx %5.2fx  %s" %
              (name, 1e3 * med([x["exposed"] for x in g]), 100 * med([x["hidden"] for x in g]),
               100 * med([x["hidden_rank"] for x in g]),
               1e3 * med([x["sim"] for x in g]), med([ratio(x, "sim") for x in g]),
               med([ratio(x, "sim_equal") for x in g]), med([ratio(x, "sim_own") for x in g]),
               " ".join("%.1f" % (1e3 * med([x["pp"][r] for x in g])) for r in range(P))))
    print("(medians over rounds. exposed: mean over ranks and iterations; hidden: of that mean,"
          "\n against the same schedule with the sync after it, in the same round; h/rank: the "
          "mean over\n PP ranks of each one's share hidden, against its own reduction time with "
          "the sync after\n the schedule (from its schedule's end), where a later stage already "
          "hides in the drain;\n sim: megactl plan's mean exposed grad sync, T_grad_sync %.1f ms:"
          " PP rank 0's floats at\n the rate of one all-reduce alone (bench_comm), with that "
          "round's figures, in the buckets\n of the chunk it launches last, at their sizes; x sim: "
          "exposed / sim; x eq: exposed / the\n same model with equal buckets; x own: exposed / "
          "the same model with T_grad_sync at\n the engine's own rate, %.1f ms: the median of its "
          "buckets over 0.5M floats that reduced\n with no other stage's beside them, in that "
          "round's runs)" %
          (1e3 * med([x["t_gs"] for x in got[rows[0][0]]]),
           1e3 * med([x["t_gs_own"] for x in got[rows[0][0]]])))
    print()
    print("%-36s %8s %7s %6s %6s %6s  %-24s" % ("past the job's drain", "exposed", "h/rank",
                                                 "x sim", "x own", "x cpu", "per PP rank (ms)"))
    for name, _, _, _ in rows:
        g = got[name]
        print("%-36s %5.1f ms %6.1f%% %5.2fx %5.2fx %5.2fx  %s" %
              (name, 1e3 * med([x["exposed_job"] for x in g]),
               100 * med([x["hidden_rank_job"] for x in g]),
               med([ratio_job(x, "sim") for x in g]), med([ratio_job(x, "sim_own") for x in g]),
               med([ratio_job(x, "sim_cpu") for x in g]),
               " ".join("%.1f" % (1e3 * med([x["pp_job"][r] for x in g])) for r in range(P))))
    us = [u for u in own_cores if u]
    print("(the same runs, each rank's exposed time counted from the latest pipeline end of "
          "either\n replica, as core/sim counts it: waiting while any other rank still computes "
          "is bubble,\n and its replicas are alike; the difference is the skew below, which the "
          "rows with the\n sync after the schedule show too, with no reduction beside the "
          "pipeline. x cpu: against\n the model at the engine's own rate, its reductions "
          "sharing the %d cores as they use them:\n a pair's 1M-float bucket kept %s cores busy "
          "at DP=2 alone (the rounds' medians), so\n --grad-sync-lanes %s)" %
          (cores, "/".join("%.2f" % u for u in us) or "-",
           "/".join("%.2f" % max(1.0, cores / u) for u in us) or "-"))
    for name, _, _, _ in rows:
        sizes = got[name][-1]["sizes"]
        print(" %s: buckets of %s floats" % (name, ", ".join("%.2fM" % (n / 1e6) for n in sizes)))
    print()
    print("%-36s %7s %6s %6s %6s %6s %9s %14s" % ("where the exposed ms went (mean/rank)",
                                                  "exposed", "skew", "embd", "runq", "rest",
                                                  "dp skew", "comm CPU/step"))
    for name, _, _, _ in rows:
        g = got[name]
        p = [med([x["parts"][k] for x in g]) for k in range(5)]
        cpu, step = med([x["cpu"] for x in g]), med([x["step"] for x in g])
        print("%-36s %7.1f %6.1f %6.1f %6.1f %6.1f %6.1f ms %5.0f ms %3.0f%%" %
              (name, 1e3 * p[0], 1e3 * p[1], 1e3 * p[2], 1e3 * p[3], 1e3 * p[4],
               1e3 * med([x["skew"] for x in g]), 1e3 * cpu, 100 * cpu / (cores * step)))
    print("(skew: waiting for the other replica's pipeline to end; embd: the tied embedding's "
          "exchange\n past the rank's own reductions, now 0: it ends before stage 0's wte "
          "bucket; runq: its comm\n thread runnable without a core while the reductions ran; "
          "rest: the reductions themselves.\n dp skew: stage 0's replicas' pipeline ends apart. "
          "comm CPU: every rank's threads but the\n "
          "training thread, per step, and as a share of the cores over the step)")
    print_loads()


def bubble(megaw, megactl, tmp):
    bubble_section(megaw, megactl, tmp, 4, 8)


def bubble4(megaw, megactl, tmp):
    bubble_section(megaw, megactl, tmp, 2, 4)


def timeline(megaw, megactl, tmp):
    data = os.path.join(tmp, "data.txt")
    write_data(data)
    P, DP, M, it = 2, 2, 8, 5
    args = WIDE + ["--num-layers", "4", "--global-batch-size", str(M * DP), "--train-iters",
                   str(it + 1), "--data-path", data, "--pipeline-model-parallel-size", str(P),
                   "--simulate-compute", "20:40", "--overlap-grad-reduce", "--bucket-size",
                   "1000000"]
    ranks = run(megaw, P * DP, args, tmp)
    lines = sorted((l for ls in ranks for l in ls if l["iteration"] == it),
                   key=lambda l: (l["pp_rank"], l["dp_rank"]))
    end = min(at(l, "drained_s") for l in lines)
    print("== reductions of iteration %d: PP=%d x DP=%d, 1F1B, sync in the cooldown, buckets "
          "of 1M floats,\n   --simulate-compute 20:40; ms from the first rank to see the "
          "pipeline drained" % (it, P, DP))

    def ms(v):
        return "%7.1f" % (1e3 * (v - end)) if v is not None else "      -"
    for l in lines:
        print("pp %d dp %d: drained %s, reduced %s, exposed %.1f ms" %
              (l["pp_rank"], l["dp_rank"], ms(at(l, "drained_s")), ms(at(l, "reduced_s")),
               1e3 * l["grad_sync_exposed_s"]))
        print("  %-7s %9s %8s %8s %8s %8s %6s" % ("bucket", "floats", "launched", "started",
                                                  "done", "waited", "runq"))
        for x in l.get("grad_reductions", []):
            runq = "%6.1f" % (1e3 * x["runq_s"]) if x["runq_s"] >= 0 else "     -"
            print("  %-7s %9d %8s %8s %8s %8s %s" %
                  ("tied" if x["bucket"] < 0 else x["bucket"], x["floats"],
                   ms(at(l, "launched_s", x)), ms(at(l, "started_s", x)),
                   ms(at(l, "done_s", x)), ms(at(l, "waited_s", x)), runq))
    print("(tied: the tied embedding's exchange over the embedding group, P2P. pp 0: the last "
          "stage's\n copy's receive, posted at the start (launched), needed as its wte bucket "
          "launches (started),\n there (done); the bucket then reduces the total. Last stage: "
          "its copy sent (launched),\n the total back (done), waited before its optimizer)")
    print_loads()


def memory(megaw, megactl, tmp):
    data = os.path.join(tmp, "data.txt")
    write_data(data)
    args = WIDE + ["--num-layers", "4", "--global-batch-size", "8", "--train-iters", "1",
                   "--data-path", data, "--simulate-compute", "1:1"]
    print("== distributed optimizer memory: hidden 512, 4 layers, bytes per rank")
    print("%-38s %14s %14s %16s %9s" % ("configuration", "param_bytes", "grad_bytes",
                                        "optimizer_state", "of DP=1"))
    unsharded = None
    for name, world, extra in (("DP=1, unsharded", 1, []),
                               ("DP=1, --use-distributed-optimizer", 1,
                                ["--use-distributed-optimizer"]),
                               ("DP=2, --use-distributed-optimizer", 2,
                                ["--use-distributed-optimizer"]),
                               ("DP=4, --use-distributed-optimizer", 4,
                                ["--use-distributed-optimizer"]),
                               ("DP=4, + overlap, buckets of 1M", 4,
                                ["--use-distributed-optimizer", "--overlap-grad-reduce",
                                 "--bucket-size", "1000000"])):
        ranks = run(megaw, world, args + extra, tmp)
        last = [lines[-1] for lines in ranks]
        opt = max(l["optimizer_state_bytes"] for l in last)
        if unsharded is None:
            unsharded = opt
        print("%-38s %14d %14d %16d %8.3f" % (name, last[0]["param_bytes"], last[0]["grad_bytes"],
                                              opt, opt / unsharded))
    print("(optimizer state: Adam's two moments of the elements a rank owns; the model trains "
          "in fp32,\n so the parameters are the master weights and there is no second copy)")


def compute(megaw, megactl, tmp):
    data = os.path.join(tmp, "data.txt")
    write_data(data)
    model = ["--num-layers", "4", "--hidden-size", "128", "--num-attention-heads", "4",
             "--seq-length", "128", "--micro-batch-size", "4", "--global-batch-size", "32",
             "--lr", "1e-3", "--train-iters", "8", "--data-path", data]
    print("== real compute at DP=2, 1 BLAS thread per rank: 4 layers, d=128, seq 128, micro 4, "
          "global 32 (median of iterations 3..8)")
    for name, world, extra in (("single rank", 1, []),
                               ("DP=2, no overlap", 2, []),
                               ("DP=2, --overlap-grad-reduce", 2,
                                ["--overlap-grad-reduce", "--bucket-size", "100000"]),
                               ("DP=2, overlap + distributed optimizer", 2,
                                ["--overlap-grad-reduce", "--bucket-size", "100000",
                                 "--use-distributed-optimizer"])):
        ranks = run(megaw, world, model + extra, tmp)
        steps = sum(after(ranks, "step_time_s", 2), [])
        exposed = sum(after(ranks, "grad_sync_exposed_s", 2), [])
        step = statistics.median(steps)
        print("%-40s %8.0f tokens/s  (%.3f s per iteration, exposed grad sync %.1f ms)" %
              (name, 32 * 128 / step, step, 1e3 * statistics.mean(exposed)))


def main():
    argv, which = sys.argv[1:], []
    opts = {"--runs": ("runs", int), "--max-load": ("max_load", float),
            "--lanes": ("lanes", float)}
    while argv:
        a = argv.pop(0)
        if a in opts:
            if not argv:
                raise SystemExit("%s needs a value" % a)
            key, conv = opts[a]
            OPTS[key] = conv(argv.pop(0))
        else:
            which.append(a)
    if len(which) < 2 or OPTS["runs"] < 1:
        print(__doc__, file=sys.stderr)
        return 2
    megaw, megactl = which[:2]
    which = which[2:] or ["overlap", "bubble", "memory", "compute"]
    sections = {"overlap": overlap, "overlap8": overlap8, "bubble": bubble,
                "bubble4": bubble4, "memory": memory, "compute": compute, "timeline": timeline}
    for w in which:
        if w not in sections:
            raise SystemExit("no section %r (%s)" % (w, ", ".join(sections)))
    with tempfile.TemporaryDirectory(prefix="mega-bench-dp-") as tmp:
        for w in which:
            sections[w](megaw, megactl, tmp)
            print(flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
