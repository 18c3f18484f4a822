#!/usr/bin/python3
"""Activation recomputation across real megaw ranks (pipeline_check.py's
launcher and model), with the pipeline engine:

  every (PP, VP, schedule, DP) layout with --recompute-granularity full
  (uniform and block) and selective gives exactly (bit for bit) the losses
  and gradient norms of the same layout without recomputation, and the
  single rank's within pipeline_check's RTOL; and the recomputing run's
  peak activation bytes are lower: summed over ranks, and on rank 0, which
  holds the most microbatches in flight (a rank with one microbatch in
  flight pays the shared scratch and may save nothing).

  default: PP 2 with 1F1B and zb-h1 (its split backward), interleaved
  PP 2 x VP 2, PP 4 zb-h1, PP 2 x DP 2, and TP 2 x PP 2 (zb-h1, and 1F1B
  with --sequence-parallel: the rerun forward issues the TP collectives
  again); --full: PP 2 and 4 x VP 1 and 2 x every schedule x DP 1 and 2,
  and TP 2 x PP 2 with and without sequence parallelism, with more layer
  counts.

usage: recompute_check.py MEGAW [--full]
"""
import itertools
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ranks import MODEL, ITERS, RTOL, launch, losses_of, write_data  # noqa: E402

LAYERS = 8  # MODEL's --num-layers


def modes(per_chunk, full):
    """name -> flags, for chunks of per_chunk decoder layers."""
    n = [1, 2, per_chunk] if full else [min(2, per_chunk)]
    out = {}
    for k in sorted(set(x for x in n if 1 <= x <= per_chunk)):
        out["full uniform %d" % k] = ["--recompute-granularity", "full",
                                      "--recompute-method", "uniform",
                                      "--recompute-num-layers", str(k)]
    for k in sorted(set(x for x in ([1, per_chunk] if full else [1]) if 1 <= x <= per_chunk)):
        out["full block %d" % k] = ["--recompute-granularity", "full",
                                    "--recompute-method", "block",
                                    "--recompute-num-layers", str(k)]
    out["selective"] = ["--recompute-granularity", "selective"]
    return out


def layouts(full):
    """(tp, sequence parallel, pp, vp, dp, schedule)"""
    if not full:
        return [(1, False, 2, 1, 1, "1f1b"), (1, False, 2, 1, 1, "zb-h1"),
                (1, False, 2, 2, 1, "interleaved"), (1, False, 4, 1, 1, "zb-h1"),
                (1, False, 2, 1, 2, "1f1b"), (2, False, 2, 1, 1, "zb-h1"),
                (2, True, 2, 1, 1, "1f1b")]
    out = []
    for pp, vp, dp in itertools.product((2, 4), (1, 2), (1, 2)):
        for sched in (["interleaved"] if vp > 1 else ["gpipe", "1f1b", "zb-h1"]):
            out.append((1, False, pp, vp, dp, sched))
    for sp, (vp, sched) in itertools.product((False, True), ((1, "1f1b"), (1, "zb-h1"),
                                                              (2, "interleaved"))):
        out.append((2, sp, 2, vp, 1, sched))
    return out


def run(megaw, tmp, world, args, what):
    """iteration -> (loss, grad_norm), and each rank's peak activation bytes."""
    res = launch(megaw, world, args, tmp)
    losses_of(res, what)  # every rank exited 0 and agrees
    seen, peaks = {}, []
    for _, lines, _ in res:
        peaks.append(max(l.get("peak_activation_bytes", 0) for l in lines))
        for l in lines:
            if "loss" in l:
                seen[l["iteration"]] = (l["loss"], l.get("grad_norm"))
    return seen, peaks


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    megaw, full = sys.argv[1], "--full" in sys.argv[2:]
    failed = total = 0
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="mega-recompute-") as tmp:
        data = os.path.join(tmp, "data.txt")
        write_data(data)
        base = MODEL + ["--train-iters", str(ITERS), "--data-path", data]
        single, _ = run(megaw, tmp, 1, base, "single rank")
        for tp, sp, pp, vp, dp, sched in layouts(full):
            name = "tp=%d%s pp=%d vp=%d dp=%d %s" % (tp, " sp" if sp else "", pp, vp, dp, sched)
            args = base + ["--pipeline-model-parallel-size", str(pp), "--schedule", sched,
                           "--tensor-model-parallel-size", str(tp)]
            if vp > 1:
                args += ["--virtual-pipeline-model-parallel-size", str(vp)]
            if sp:
                args += ["--sequence-parallel"]
            world = tp * pp * dp
            try:
                ref, ref_peaks = run(megaw, tmp, world, args, name)
            except RuntimeError as e:
                failed += 1
                total += 1
                print("FAIL %s" % e, flush=True)
                continue
            for mode, flags in modes(LAYERS // (pp * vp), full).items():
                total += 1
                what = "%s, %s" % (name, mode)
                try:
                    got, peaks = run(megaw, tmp, world, args + flags, what)
                    for it, want in ref.items():
                        if got.get(it) != want:
                            raise RuntimeError("%s: iteration %d (loss, grad norm) %r, without "
                                               "recomputation %r" % (what, it, got.get(it), want))
                        if abs(want[0] - single[it][0]) > RTOL * abs(single[it][0]):
                            raise RuntimeError("%s: iteration %d loss %.9f, single rank %.9f" %
                                               (what, it, want[0], single[it][0]))
                    if not (sum(peaks) < sum(ref_peaks) and peaks[0] < ref_peaks[0]):
                        raise RuntimeError("%s: peak activation bytes per rank %s, without "
                                           "recomputation %s" % (what, peaks, ref_peaks))
                    print("ok   %s: losses and grad norms bit-identical; peak activation bytes "
                          "per rank %s (without: %s)" % (what, peaks, ref_peaks), flush=True)
                except RuntimeError as e:
                    failed += 1
                    print("FAIL %s" % e, flush=True)
    print("%d of %d recomputing runs match (%.0f s)" % (total - failed, total, time.time() - t0))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
