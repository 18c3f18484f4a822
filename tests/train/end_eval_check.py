#!/usr/bin/python3
"""The evaluation after training, as Megatron's pretrain does it.

A job that ends normally evaluates once more after its last iteration: on
the validation set (going on from the batches --eval-interval took, so on
other batches when the last iteration evaluated too), then on --split's
test share from its start. megaw reports them as final_eval_loss and
test_loss of the last iteration (--json) and prints Megatron's blocks
("validation loss at iteration N on validation set | ..."). A stop by
--exit-interval before the last iteration has none; a job that holds
nothing out and never asked for evaluation does none. The test loss is
the same at DP 2 and PP 2 as on one rank.

The edges, as Megatron's pretrain: an exit (--exit-interval) at the last
iteration comes before the evaluation, so there is none, and the run has
ended (exit 0, not stopped); --valid-data-path with no --eval-interval is
evaluated after training only. A test share shorter than one window gives
no test set: the start-up note promises the test evaluation only on that
condition, and rank 0 says, under megaw and megad run, that it skips it.

  /usr/bin/python3 end_eval_check.py MEGAW WORKDIR MEGAD
"""
import json
import os
import random
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "engine"))
from indexed_check import write_mmidx  # noqa: E402
import ranks  # noqa: E402


def main():
    megaw, work, megad = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(work, exist_ok=True)
    rng = random.Random(7)
    prefix = os.path.join(work, "docs")
    write_mmidx(prefix, [[rng.randrange(256) for _ in range(rng.randint(20, 80))]
                         for _ in range(60)], "uint16")
    model = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
             "--seq-length", "16", "--micro-batch-size", "1", "--global-batch-size", "4",
             "--train-iters", "4", "--lr", "1e-2", "--tokenizer-type", "NullTokenizer",
             "--vocab-size", "255", "--data-path", prefix]
    split = ["--split", "8,1,1", "--eval-iters", "2"]
    ok = True

    def check(what, good, detail=""):
        nonlocal ok
        ok &= bool(good)
        print("%s: %s %s" % (what, "ok" if good else "WRONG", detail))

    def run(world, flags, base=None, errs=None):
        res = ranks.launch(megaw, world, (base or model) + flags, work, timeout=120)
        if any(rc != 0 for rc, _, _ in res):
            raise SystemExit("megaw failed: %s" % [e for _, _, e in res])
        if errs is not None:
            errs.extend(e for _, _, e in res)
        return [s for _, lines, _ in res for s in lines]

    def megad_run(flags):
        p = subprocess.run([megad, "run", "--slots", "1", "--worker", megaw, "--json"] + model +
                           flags, capture_output=True, text=True, timeout=120)
        return p.returncode, [json.loads(l) for l in p.stdout.splitlines()
                              if l.startswith("{")], p.stderr

    def keyed(steps, key):
        return {s["iteration"]: s[key] for s in steps if key in s}

    one = run(1, split + ["--eval-interval", "2"])
    evals, final, test = keyed(one, "eval_loss"), keyed(one, "final_eval_loss"), \
        keyed(one, "test_loss")
    check("--eval-interval 2 evaluates at 2 and 4", sorted(evals) == [2, 4], evals)
    check("the end evaluates the validation set after iteration 4", list(final) == [4], final)
    check("...on other batches than iteration 4's evaluation",
          4 in final and 4 in evals and final[4] != evals[4], (final, evals))
    check("the test set after iteration 4", list(test) == [4], test)
    check("every iteration reported once", [s["iteration"] for s in one if "loss" in s]
          == [1, 2, 3, 4])

    for name, world, flags in (("DP 2", 2, []),
                               ("PP 2", 2, ["--pipeline-model-parallel-size", "2"])):
        got = keyed(run(world, split + ["--eval-interval", "2"] + flags), "test_loss")
        same = 4 in got and 4 in test and abs(got[4] - test[4]) <= ranks.RTOL * abs(test[4])
        check("%s's test loss is one rank's" % name, same, (got, test))
        got = keyed(run(world, split + ["--eval-interval", "2"] + flags), "final_eval_loss")
        same = 4 in got and 4 in final and abs(got[4] - final[4]) <= ranks.RTOL * abs(final[4])
        check("%s's final validation loss is one rank's" % name, same, (got, final))

    # without --eval-interval a held-out share is still evaluated at the end
    steps = run(1, split)
    check("no --eval-interval: only the end evaluates",
          not keyed(steps, "eval_loss") and list(keyed(steps, "final_eval_loss")) == [4] and
          keyed(steps, "test_loss") == test, steps[-1])

    steps = run(1, split + ["--eval-interval", "2", "--exit-interval", "3"])
    check("--exit-interval 3 stops with no evaluation after training",
          not keyed(steps, "final_eval_loss") and not keyed(steps, "test_loss") and
          steps[-1].get("iteration") == 3, steps[-1])

    steps = run(1, ["--split", "1,0,0"])
    check("nothing held out, no --eval-interval: no evaluation",
          not any(k in s for s in steps for k in ("eval_loss", "final_eval_loss", "test_loss")))

    # --exit-interval at the last iteration: Megatron's train() exits
    # (sys.exit) before pretrain's evaluation; nothing is left to train
    errs = []
    steps = run(1, split + ["--exit-interval", "4"], errs=errs)
    check("--exit-interval 4 of 4: no evaluation after training",
          not keyed(steps, "final_eval_loss") and not keyed(steps, "test_loss") and
          steps[-1].get("iteration") == 4, steps[-1])
    check("...and megaw says why, not that it stopped early",
          "no evaluation after training: --exit-interval 4" in errs[0] and
          "stopped after" not in errs[0], errs[0])
    rc, steps, err = megad_run(split + ["--exit-interval", "4"])
    check("megad run: --exit-interval 4 of 4 succeeds (exit 0) with no evaluation after it",
          rc == 0 and steps and steps[-1].get("iteration") == 4 and
          "final_eval_loss" not in steps[-1] and
          "no evaluation after training: --exit-interval 4" in err, (rc, err[-600:]))

    # --valid-data-path, no --eval-interval: evaluated after training only
    # (Megatron's do_valid), on the batches an interval past the end reads
    valid = os.path.join(work, "valid")
    write_mmidx(valid, [[rng.randrange(256) for _ in range(rng.randint(20, 80))]
                        for _ in range(20)], "uint16")
    paths = model[:-2] + ["--train-data-path", prefix, "--valid-data-path", valid,
                          "--eval-iters", "2"]
    errs = []
    steps = run(1, [], base=paths, errs=errs)
    far = keyed(run(1, ["--eval-interval", "100"], base=paths), "final_eval_loss")
    check("--valid-data-path alone: evaluated once, after training",
          not keyed(steps, "eval_loss") and list(keyed(steps, "final_eval_loss")) == [4] and
          keyed(steps, "final_eval_loss") == far, (steps[-1], far))
    check("...which the note says", "only the end of training evaluates" in errs[0] and
          "--valid-data-path" in errs[0], errs[0])

    # a test share of no whole window (1% of 60 documents rounds to none)
    short = ["--split", "98,1.5,0.5", "--eval-iters", "2"]
    errs = []
    steps = run(1, short, errs=errs)
    check("a test share shorter than a window: the validation set alone",
          list(keyed(steps, "final_eval_loss")) == [4] and not keyed(steps, "test_loss"),
          steps[-1])
    check("...the note promises the test set only if it holds a window",
          "and then on the test share of --split 98,1.5,0.5 unless it holds fewer than "
          "--seq-length 16 + 1 tokens" in errs[0], errs[0])
    check("...and megaw says it skips it, and why",
          "skips the test share" in errs[0] and "fewer than one window" in errs[0], errs[0])
    rc, steps, err = megad_run(short)
    check("...megad run says so too",
          rc == 0 and "skips the test share" in err and "fewer than one window" in err,
          (rc, err[-600:]))
    errs = []
    run(1, split, errs=errs)
    check("a test share of whole windows: no such words", "skips the test share" not in errs[0],
          errs[0])

    text = subprocess.run([megaw] + model + split, stdout=subprocess.PIPE, text=True,
                          check=True).stdout
    check("megaw prints Megatron's blocks",
          " validation loss at iteration 4 on validation set | lm loss value: " in text and
          " validation loss at iteration 4 on test set | lm loss value: " in text and
          "lm loss PPL: " in text, text[-600:])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
