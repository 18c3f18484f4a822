#!/usr/bin/python3
"""pipeline_check.py's checkpoint modes: a run saved under one layout and
resumed under another (checkpoint), and the distributed optimizer's
whole-tensor checkpoints (distckpt)."""
import itertools
import os
import time

from ranks import (CKPT_ITERS, CKPT_SAVE_AT, ITERS, MODEL, RTOL, check_manifest, launch,
                   losses_of, losses_range, read_checkpoint, write_data)

CKPT_LAYOUTS = {
    # name: (world, flags)
    "single": (1, []),
    "dp2": (2, []),
    "pp2-1f1b": (2, ["--pipeline-model-parallel-size", "2", "--schedule", "1f1b"]),
    "pp2-vp2": (2, ["--pipeline-model-parallel-size", "2",
                    "--virtual-pipeline-model-parallel-size", "2"]),
    "pp2xdp2": (4, ["--pipeline-model-parallel-size", "2"]),
    "pp4": (4, ["--pipeline-model-parallel-size", "4"]),
    "pp2-vp2xdp2": (4, ["--pipeline-model-parallel-size", "2",
                        "--virtual-pipeline-model-parallel-size", "2"]),
    "pp2xdp2-dist": (4, ["--pipeline-model-parallel-size", "2", "--overlap-grad-reduce",
                         "--bucket-size", "3000", "--use-distributed-optimizer"]),
}
# (saved under, resumed under, --async-save)
CKPT_SAMPLE = [("pp2-1f1b", "pp2-1f1b", True), ("pp2-1f1b", "single", False),
               ("pp2-vp2", "pp2xdp2", False), ("pp2xdp2", "pp2-vp2", True),
               ("pp2xdp2-dist", "pp2xdp2-dist", True), ("pp2xdp2-dist", "dp2", False)]


def checkpoint(megaw, tmp, full):
    data = os.path.join(tmp, "data.txt")
    write_data(data)
    base = MODEL + ["--lr-decay-iters", str(CKPT_ITERS), "--data-path", data]
    straight = {}

    def uninterrupted(name):
        if name not in straight:
            world, flags = CKPT_LAYOUTS[name]
            straight[name] = losses_range(
                launch(megaw, world, base + flags + ["--train-iters", str(CKPT_ITERS)], tmp),
                name, 1, CKPT_ITERS)
        return straight[name]

    ref = uninterrupted("single")
    names = list(CKPT_LAYOUTS)
    # --async-save on every other pair, and on every other same-layout pair
    cases = ([(a, b, (i + i // len(names)) % 2 == 1)
              for i, (a, b) in enumerate(itertools.product(names, names))]
             if full else CKPT_SAMPLE)
    failed = 0
    t0 = time.time()
    for k, (src, dst, async_save) in enumerate(cases):
        name = "%s -> %s%s" % (src, dst, " (--async-save)" if async_save else "")
        save = os.path.join(tmp, "ckpt-%d" % k)
        try:
            world, flags = CKPT_LAYOUTS[src]
            first = base + flags + ["--train-iters", str(CKPT_SAVE_AT), "--save", save]
            got = losses_range(launch(megaw, world, first + (["--async-save"] if async_save
                                                             else []), tmp),
                               name + " (saving)", 1, CKPT_SAVE_AT)
            files = check_manifest(os.path.join(save, "iter_%07d" % CKPT_SAVE_AT))
            world, flags = CKPT_LAYOUTS[dst]
            res = launch(megaw, world, base + flags + ["--train-iters", str(CKPT_ITERS),
                                                       "--load", save], tmp)
            got.update(losses_range(res, name + " (resumed)", CKPT_SAVE_AT + 1, CKPT_ITERS))
            if "resumed from" not in res[0][2]:
                raise RuntimeError("%s: rank 0 did not resume: %s" % (name, res[0][2][-300:]))
            if src == dst:
                want = uninterrupted(src)
                bad = [i for i in want if got[i] != want[i]]
                how = "exactly the uninterrupted %s run" % src
            else:
                bad = [i for i in ref if abs(got[i] - ref[i]) > RTOL * abs(ref[i])]
                how = "the single rank within %g" % RTOL
            if bad:
                raise RuntimeError("%s: iteration %d loss %.17g, want %s (%.17g)" %
                                   (name, bad[0], got[bad[0]], how, (uninterrupted(src)
                                    if src == dst else ref)[bad[0]]))
            shards = [f for f in files if f.startswith("model")]
            print("ok   %s: %s; saved %s" % (name, how, " ".join(shards)), flush=True)
        except RuntimeError as e:
            failed += 1
            print("FAIL %s" % e, flush=True)
    print("%d of %d save/resume pairs give the uninterrupted losses (%.0f s)" %
          (len(cases) - failed, len(cases), time.time() - t0))
    return failed == 0


def distckpt(megaw, tmp):
    data = os.path.join(tmp, "data.txt")
    write_data(data)
    base = MODEL + ["--data-path", data, "--lr-decay-iters", str(ITERS)]
    dist = ["--overlap-grad-reduce", "--bucket-size", "3000", "--use-distributed-optimizer"]
    pp2 = ["--pipeline-model-parallel-size", "2"]
    ok = True
    ref = losses_of(launch(megaw, 1, base + ["--train-iters", str(ITERS)], tmp), "single rank")
    # The same checkpoint, saved unsharded and with the moments sharded over
    # DP=2 (alone, and on two pipeline stages with --async-save).
    saves = {}
    for name, world, extra in (("unsharded", 1, []), ("distributed dp=2", 2, dist),
                               ("distributed pp=2 x dp=2 async", 4, dist + pp2 + ["--async-save"])):
        d = os.path.join(tmp, "ckpt-" + name.replace(" ", "-"))
        res = launch(megaw, world, base + extra + ["--train-iters", "1", "--save", d], tmp)
        if any(rc != 0 for rc, _, _ in res):
            print("FAIL save %s: %s" % (name, [e.strip()[-300:] for _, _, e in res]))
            return False
        it = os.path.join(d, "iter_0000001")
        saves[name] = (d, read_checkpoint(it, "model"), read_checkpoint(it, "optimizer"))
    _, model_a, opt_a = saves["unsharded"]
    for name in ("distributed dp=2", "distributed pp=2 x dp=2 async"):
        _, model_b, opt_b = saves[name]
        worst, shapes_ok = 0.0, True
        for a, b in ((model_a, model_b), (opt_a, opt_b)):
            shapes_ok &= sorted(a) == sorted(b)
            for k in a:
                shapes_ok &= k in b and a[k][0] == b[k][0]
                for x, y in zip(a[k][1], b.get(k, ([], []))[1]):
                    worst = max(worst, abs(x - y) / (abs(x) + 1e-6))
        wte = model_b.get("transformer.wte.weight", ([], None))[0]
        good = shapes_ok and worst < 1e-4 and wte == [256, 32] and \
            "transformer.wte.weight.exp_avg_sq" in opt_b
        print("%s %s checkpoint: %d tensors and %d moments under HF names, whole shapes "
              "(wte %s), largest relative difference to the unsharded one %.2g" %
              ("ok  " if good else "FAIL", name, len(model_b), len(opt_b), wte, worst))
        ok &= good
    d = saves["distributed dp=2"][0]
    d_pp = saves["distributed pp=2 x dp=2 async"][0]
    for name, world, extra, src in (("dp=1", 1, [], d), ("dp=4 distributed", 4, dist, d),
                                    ("dp=2 distributed, from pp=2", 2, dist, d_pp)):
        res = launch(megaw, world, base + extra + ["--train-iters", str(ITERS), "--load", src],
                     tmp)
        try:
            got = {}
            for rc, lines, err in res:
                if rc != 0:
                    raise RuntimeError("exit %d: %s" % (rc, err.strip()[-300:]))
                for l in lines:
                    if "loss" in l:
                        got[l["iteration"]] = l["loss"]
            good = sorted(got) == list(range(2, ITERS + 1)) and all(
                abs(got[i] - ref[i]) <= RTOL * abs(ref[i]) for i in got)
            print("%s resumed at %s: losses %s, uninterrupted %s" %
                  ("ok  " if good else "FAIL", name,
                   " ".join("%.6f" % got[i] for i in sorted(got)),
                   " ".join("%.6f" % ref[i] for i in sorted(got))))
        except RuntimeError as e:
            good = False
            print("FAIL resumed at %s: %s" % (name, e))
        ok &= good
    return ok
