#!/usr/bin/python3
"""A Megatron user's first hour (issue 24): Megatron's two GPT example
scripts and its Llama 3 one through megaw and megad run, and one check for
each thing a launch script meets.

The scripts are Megatron-LM's examples/pretrain_gpt_distributed_with_mp.sh,
examples/gpt3/train_gpt3_175b_distributed.sh (the version with
--rampup-batch-size) and examples/llama/train_llama3_8b_h100_fp8.sh (its
real-data branch), flag by flag in their order. The model and the run's
length are scaled down (layers, widths, sequence, parallel sizes of the
175B model, iterations and intervals, the ramp's sample count); every other
flag is kept. The data is a small indexed dataset (MMIDIDX, uint16 GPT-2
ids) and a GPT-2-sized vocabulary (50,257 entries) written here; the Llama
script's is another, of ids as a 1,000-token tokenizer would give them.

Each script runs as written first. Every refusal must name the flag, say
why and say what to use instead; the test then applies that replacement
(the table REPLACE) and runs again, until the job trains. Then no flag may
be silently ignored: each is a job flag of mega's table or one of the
Megatron flags mega accepts because it restates what mega does (both from
megaw --help), and what the run shows is checked against the flags:
Megatron's log line at --log-interval, the validation block at
--eval-interval on the --split's valid share, checkpoints at
--save-interval, the vocabulary from --vocab-file, the global batch of
Megatron's rampup and the learning rate of Megatron's formulas.

The scripts and REPLACE are in megatron_example_scripts.py; launching,
the refusal loop and reading the log back in megatron_run.py.

  /usr/bin/python3 megatron_scripts.py MEGAW MEGAD WORKDIR
"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

from megatron_example_scripts import (LLAMA3_FSDP_REFUSED, LLAMA3_REFUSED, LLAMA_VOCAB,
                                      script_gpt3_175b, script_gpt3_175b_step, script_llama3_8b,
                                      script_llama3_8b_fsdp, script_with_mp)
from megatron_run import (EVAL, FAILS, MEGAD, MEGAW, VOCAB, check, checkpoints, flatten,
                          lines_of, megad_run, megatron_lr, megatron_rampup, megaw_launch,
                          no_flag_ignored, until_it_trains, write_mmidx, write_vocab)

WORK = sys.argv[3]


def with_mp(tmp, data, vocab, merges):
    """The 345M script: TP 2 x PP 2, four ranks."""
    results = {}
    for how in ("megaw", "megad run"):
        ckpt = os.path.join(tmp, "ckpt-mp-" + how.replace(" ", "-"))
        original = script_with_mp(data, vocab, merges, ckpt)
        run = ((lambda a: flatten(megaw_launch(a, 4, tmp))) if how == "megaw"
               else (lambda a: megad_run(a, 4)))
        name = "with_mp (%s)" % how
        argv, out, err, refused = until_it_trains(name, original, run)
        check("%s: refused exactly --checkpoint-activations and --fp16" % name,
              refused == ["--checkpoint-activations", "--fp16"], str(refused))
        if not check("%s: trains after the replacements" % name, "iteration" in out, err[-800:]):
            continue
        no_flag_ignored(name, argv, refused, original)
        lines = lines_of(out)
        check("%s: Megatron's line every --log-interval 2" % name,
              sorted({l[0] for l in lines}) == [2, 4, 6] and all(l[1] == 6 for l in lines),
              out[-1500:])
        check("%s: consumed samples and the global batch" % name,
              all(l[2] == 16 * l[0] and l[4] == 16 for l in lines), str(lines))
        evals = sorted({int(i) for i, _ in EVAL.findall(out)})
        check("%s: the validation block at --eval-interval 3" % name, evals == [3, 6], out[-1500:])
        check("%s: says evaluation reads the valid share of --split" % name,
              "reads the valid share of --split 949,50,1: 5% of each dataset's documents" in err,
              err)
        check("%s: checkpoints at --save-interval 3 and the end" % name,
              checkpoints(ckpt) == [3, 6], str(checkpoints(ckpt)))
        with open(os.path.join(ckpt, "iter_0000006", "config.json")) as f:
            # GPT-2's 50,257 ids padded to a multiple of 128 x TP 2
            check("%s: the vocabulary is --vocab-file's, padded" % name,
                  json.load(f)["vocab_size"] == 50432)
        # lr: warmup .01 of 5 x 16 decay samples, cosine to 1e-5 (Megatron's formula)
        for it, _, _, lr, _, _ in lines:
            want = megatron_lr(16 * (it - 1), 1.5e-4, 1e-5, 0.01 * 80, 80)
            check("%s: learning rate at iteration %d is Megatron's %.6E" % (name, it, want),
                  abs(lr - want) <= 1e-6 * want + 1e-12, "%.6E" % lr)
        results[how] = [l[5] for l in sorted(set(lines))]
    if len(results) == 2:
        check("with_mp: megaw and megad run print the same losses",
              results["megaw"] == results["megad run"], str(results))


def gpt3_175b(tmp, data, vocab, merges):
    """The 175B script: PP 2, two ranks, the rampup."""
    results = {}
    for how in ("megaw", "megad run"):
        ckpt = os.path.join(tmp, "ckpt-175b-" + how.replace(" ", "-"))
        original = script_gpt3_175b(data, vocab, merges, ckpt, os.path.join(tmp, "tb"))
        run = ((lambda a: flatten(megaw_launch(a, 2, tmp))) if how == "megaw"
               else (lambda a: megad_run(a, 2)))
        name = "gpt3_175b (%s)" % how
        argv, out, err, refused = until_it_trains(name, original, run)
        check("%s: refused --fp16, --tensorboard-dir, then the ramp by iterations" % name,
              refused == ["--fp16", "--tensorboard-dir", "--rampup-batch-size"], str(refused))
        if not check("%s: trains after the replacements" % name, "iteration" in out, err[-800:]):
            continue
        no_flag_ignored(name, argv, refused, original)
        lines = sorted(set(lines_of(out)))
        # Megatron's update_train_iters: 8 ramp iterations to 56 samples,
        # then (128 - 56) // 16 = 4
        check("%s: 12 iterations from --train-samples 128" % name,
              [l[0] for l in lines] == list(range(1, 13)) and all(l[1] == 12 for l in lines),
              str(lines))
        c, want_batch, want_consumed = 0, [], []
        for _ in range(12):
            b = megatron_rampup(c, 4, 4, 48, 16)
            want_batch.append(b)
            c += b
            want_consumed.append(c)
        check("%s: the global batch ramps as Megatron's rampup computes" % name,
              [l[4] for l in lines] == want_batch, "%s, want %s" % ([l[4] for l in lines],
                                                                   want_batch))
        check("%s: consumed samples" % name, [l[2] for l in lines] == want_consumed)
        for (it, _, _, lr, _, _), n in zip(lines, [0] + want_consumed):
            want = megatron_lr(n, 6e-5, 6e-6, 0.001 * 96, 96)
            check("%s: learning rate at iteration %d is Megatron's %.6E" % (name, it, want),
                  abs(lr - want) <= 1e-6 * want + 1e-12, "%.6E" % lr)
        evals = sorted({int(i) for i, _ in EVAL.findall(out)})
        check("%s: the validation block every 4 iterations" % name, evals == [4, 8, 12])
        check("%s: checkpoints every 4 iterations" % name, checkpoints(ckpt) == [4, 8, 12])
        results[how] = [l[5] for l in lines]
        if how == "megaw":
            check("%s: --load found nothing and said so" % name,
                  "no checkpoint in --load" in err, err)
            # the tokenizer trained with is megaw generate's
            g = subprocess.run([MEGAW, "generate", "--load", ckpt, "--prompt", "Hello, world",
                                "--max-new-tokens", "3"], capture_output=True, text=True)
            check("megaw generate reads and writes text with the job's --vocab-file",
                  g.returncode == 0 and g.stdout.startswith("Hello, world") and
                  len(g.stdout) > len("Hello, world\n"), g.stderr)
    if len(results) == 2:
        check("gpt3_175b: megaw and megad run print the same losses",
              results["megaw"] == results["megad run"], str(results))


def llama3_8b(tmp, data, label="llama3_8b", script=script_llama3_8b,
              want_refused=LLAMA3_REFUSED, hows=("megaw", "megad run")):
    """The Llama 3 script (or the FSDP one, of the same model): DP 2 (its 8
    GPUs of TP 1) with the distributed optimizer, a Llama of RoPE base 1e6,
    4 query heads a group, untied."""
    results = {}
    for how in hows:
        ckpt = os.path.join(tmp, "ckpt-%s-%s" % (label, how.replace(" ", "-")))
        original = script(data, ckpt, os.path.join(tmp, "tb"))
        run = ((lambda a: flatten(megaw_launch(a, 2, tmp))) if how == "megaw"
               else (lambda a: megad_run(a, 2)))
        name = "%s (%s)" % (label, how)
        argv, out, err, refused = until_it_trains(name, original, run)
        check("%s: refused what mega does not take, in the script's order" % name,
              refused == want_refused, str(refused))
        if not check("%s: trains after the replacements" % name, "iteration" in out, err[-800:]):
            continue
        no_flag_ignored(name, argv, refused, original)
        lines = sorted(set(lines_of(out)))
        check("%s: 6 iterations of 8 samples from --train-samples 48" % name,
              [l[0] for l in lines] == list(range(1, 7)) and
              all(l[1] == 6 and l[4] == 8 and l[2] == 8 * l[0] for l in lines), str(lines))
        for it, _, _, lr, _, _ in lines:
            want = megatron_lr(8 * (it - 1), 1.5e-4, 1e-5, 8, 40)
            check("%s: learning rate at iteration %d is Megatron's %.6E" % (name, it, want),
                  abs(lr - want) <= 1e-6 * want + 1e-12, "%.6E" % lr)
        check("%s: the validation block every 3 iterations" % name,
              sorted({int(i) for i, _ in EVAL.findall(out)}) == [3, 6], out[-1500:])
        check("%s: checkpoints every 3 iterations" % name, checkpoints(ckpt) == [3, 6])
        with open(os.path.join(ckpt, "iter_0000006", "config.json")) as f:
            c = json.load(f)
        want = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
                "intermediate_size": 224, "num_attention_heads": 8, "num_key_value_heads": 2,
                "head_dim": 8, "rope_theta": 1000000.0, "tie_word_embeddings": False,
                "attention_bias": False, "mlp_bias": False, "initializer_range": 0.0134,
                "max_position_embeddings": 32, "vocab_size": 1024}
        check("%s: config.json is the script's Llama" % name,
              {k: c.get(k) for k in want} == want and "partial_rotary_factor" not in c, str(c))
        results[how] = [l[5] for l in lines]
    if len(results) == 2:
        check("%s: megaw and megad run print the same losses" % label,
              results["megaw"] == results["megad run"], str(results))
    return results


def gpt3_175b_step(tmp, data, vocab, merges):
    """The 175B script as it is now: its step-wise batch schedule is refused
    with the constant --global-batch-size as the way out; PP 2, megaw."""
    ckpt = os.path.join(tmp, "ckpt-175b-step")
    original = script_gpt3_175b_step(data, vocab, merges, ckpt, os.path.join(tmp, "tb"))
    name = "gpt3_175b_step (megaw)"
    argv, out, err, refused = until_it_trains(name, original,
                                              lambda a: flatten(megaw_launch(a, 2, tmp)))
    check("%s: refused the step schedule, --fp16, --tensorboard-dir" % name,
          refused == ["--step-batch-size-schedule", "--fp16", "--tensorboard-dir"],
          str(refused))
    if not check("%s: trains after the replacements" % name, "iteration" in out, err[-800:]):
        return
    no_flag_ignored(name, argv, refused, original)
    lines = sorted(set(lines_of(out)))
    check("%s: 8 iterations of the global batch 16" % name,
          [l[0] for l in lines] == list(range(1, 9)) and
          all(l[1] == 8 and l[4] == 16 and l[2] == 16 * l[0] for l in lines), str(lines))
    for it, _, _, lr, _, _ in lines:
        # warmup .001 of 6 x 16 decay samples, cosine to 6e-6
        want = megatron_lr(16 * (it - 1), 6e-5, 6e-6, 0.001 * 96, 96)
        check("%s: learning rate at iteration %d is Megatron's %.6E" % (name, it, want),
              abs(lr - want) <= 1e-6 * want + 1e-12, "%.6E" % lr)
    check("%s: the validation block every 4 iterations" % name,
          sorted({int(i) for i, _ in EVAL.findall(out)}) == [4, 8])
    check("%s: checkpoints every 4 iterations" % name, checkpoints(ckpt) == [4, 8])


# ---- one check for each item ----

TINY = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
        "--lr", "1e-3"]


def items(tmp, prefix):
    rc, out, err = flatten(megaw_launch(TINY + ["--train-iters", "3", "--data-path",
                                                prefix + ".bin", "--tokenizer-type",
                                                "NullTokenizer", "--vocab-size", "50256",
                                                "--json"], 1, tmp))
    ref = flatten(megaw_launch(TINY + ["--train-iters", "3", "--data-path", prefix,
                                       "--tokenizer-type", "NullTokenizer", "--vocab-size",
                                       "50256", "--json"], 1, tmp))
    losses = [[json.loads(l)["loss"] for l in o.splitlines()] for o in (out, ref[1])]
    check("--data-path PREFIX.bin reads the dataset PREFIX and says so",
          rc == 0 and "names one file of the indexed dataset" in err and
          losses[0] == losses[1] and len(losses[0]) == 3, "%s %s" % (err, losses))
    bad = os.path.join(tmp, "lone.idx")
    shutil.copy(prefix + ".idx", bad)
    rc, out, err = megad_run(TINY + ["--train-iters", "3", "--data-path", bad], 1)
    check("an .idx without its .bin is refused (an index is never read as tokens)",
          rc == 2 and "is the index of an indexed dataset, but" in err, err)

    text = os.path.join(tmp, "text.txt")
    with open(text, "w") as f:
        f.write("the quick brown fox jumps over the lazy dog. " * 40)
    rc, out, err = flatten(megaw_launch(TINY + ["--train-iters", "4", "--data-path", text,
                                                "--eval-interval", "2", "--eval-iters", "0",
                                                "--json"], 1, tmp))
    check("--eval-iters 0 turns evaluation off",
          rc == 0 and "eval_loss" not in out and "--eval-iters 0: no evaluation" in err, err)
    rc, out, err = flatten(megaw_launch(TINY + ["--train-iters", "4", "--data-path", text,
                                                "--eval-interval", "2"], 1, tmp))
    check("without --split, megaw says evaluation reads the end of the training stream",
          "no --split: training reads all of the data" in err, err)
    check("megaw's text prints the eval loss", len(EVAL.findall(out)) == 2, out)
    # Megatron's --log-interval 100 where a script leaves it out: the line at
    # the last iteration only, here
    check("without --log-interval, Megatron's 100: the last iteration's line only",
          [l[0] for l in lines_of(out)] == [4], out)
    rc, out, err = megad_run(TINY + ["--train-iters", "4", "--data-path", text,
                                     "--eval-interval", "2"], 1)
    check("megad run says what evaluation reads", "no --split: training reads" in err, err)
    check("megad run's text prints the eval loss", len(EVAL.findall(out)) == 2, out)

    rc, out, err = megad_run(TINY + ["--train-iters", "4", "--data-path", text,
                                     "--pipeline-parallel-size", "2"], 2)
    check("megad run suggests the nearest flag",
          rc == 2 and "did you mean --pipeline-model-parallel-size?" in err, err)
    rc, out, err = flatten(megaw_launch(TINY + ["--num-layer", "3"], 1, tmp))
    check("megaw suggests the nearest flag", rc == 2 and "did you mean --num-layers?" in err, err)
    for cmd in ("run", "serve"):
        p = subprocess.run([MEGAD, cmd, "--help"], capture_output=True, text=True)
        check("megad %s --help prints help" % cmd,
              p.returncode == 0 and p.stdout.startswith("usage: megad") and
              ("%s: " % cmd) in p.stdout and not p.stderr, p.stderr)

    # the rampup's data order is a formula of the flags: DP 2 takes the
    # single rank's samples, so its losses are the single rank's
    ramp = TINY + ["--global-batch-size", "8", "--train-samples", "60", "--rampup-batch-size",
                   "4", "4", "20", "--data-path", text, "--json"]
    rc1, out1, err1 = flatten(megaw_launch(ramp, 1, tmp))
    rc2, out2, err2 = megad_run(ramp, 2)
    one = {j["iteration"]: j["loss"] for j in map(json.loads, out1.splitlines())}
    two = {j["iteration"]: j["loss"] for j in map(json.loads, out2.splitlines())
           if "loss" in j}
    check("--rampup-batch-size: DP 2 gives the single rank's losses",
          rc1 == 0 and rc2 == 0 and sorted(one) == sorted(two) and len(one) == 10 and
          all(abs(one[i] - two[i]) <= 1e-5 * abs(one[i]) for i in one),
          "%s\n%s\n%s" % (one, two, err2[-500:]))


def main():
    os.makedirs(WORK, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=WORK)
    vocab, merges = write_vocab(tmp)
    rnd = random.Random(24)
    docs = [[rnd.randrange(VOCAB - 1) for _ in range(rnd.randrange(40, 80))] + [VOCAB - 1]
            for _ in range(200)]
    prefix = os.path.join(tmp, "corpus_text_document")
    write_mmidx(prefix, docs)
    items(tmp, prefix)
    with_mp(tmp, prefix, vocab, merges)
    gpt3_175b(tmp, prefix, vocab, merges)
    gpt3_175b_step(tmp, prefix, vocab, merges)
    llama_docs = [[rnd.randrange(LLAMA_VOCAB - 1) for _ in range(rnd.randrange(40, 80))] +
                  [LLAMA_VOCAB - 1] for _ in range(200)]
    llama_prefix = os.path.join(tmp, "llama_text_document")
    write_mmidx(llama_prefix, llama_docs)
    fsdp = llama3_8b(tmp, llama_prefix, "llama3_8b_fsdp", script_llama3_8b_fsdp,
                     LLAMA3_FSDP_REFUSED, ("megaw",))
    plain = llama3_8b(tmp, llama_prefix)
    if fsdp and plain:
        check("the FSDP Llama script trains as the Llama 3 script does (the same losses)",
              fsdp["megaw"] == plain["megaw"], "%s %s" % (fsdp, plain))
    if FAILS:
        print("%d check(s) failed" % len(FAILS))
        sys.exit(1)
    shutil.rmtree(tmp, ignore_errors=True)
    print("all checks passed")


if __name__ == "__main__":
    main()