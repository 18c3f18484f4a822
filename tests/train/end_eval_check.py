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

  /usr/bin/python3 end_eval_check.py MEGAW WORKDIR
"""
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
    megaw, work = sys.argv[1], sys.argv[2]
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

    def run(world, flags):
        res = ranks.launch(megaw, world, model + flags, work, timeout=120)
        if any(rc != 0 for rc, _, _ in res):
            raise SystemExit("megaw failed: %s" % [e for _, _, e in res])
        return [s for _, lines, _ in res for s in lines]

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

    text = subprocess.run([megaw] + model + split, stdout=subprocess.PIPE, text=True,
                          check=True).stdout
    check("megaw prints Megatron's blocks",
          " validation loss at iteration 4 on validation set | lm loss value: " in text and
          " validation loss at iteration 4 on test set | lm loss value: " in text and
          "lm loss PPL: " in text, text[-600:])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
