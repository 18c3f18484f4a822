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

  /usr/bin/python3 megatron_scripts.py MEGAW MEGAD WORKDIR
"""
import json
import math
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

MEGAW, MEGAD, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
VOCAB = 50257  # GPT-2's vocab.json entries; <|endoftext|> is the last
LLAMA_VOCAB = 1000  # the Llama 3 script's tokenizer's, scaled down from 128,256
FAILS = []


def check(what, ok, detail=""):
    print("%s: %s%s" % ("ok" if ok else "FAIL", what, "" if ok else " -- " + detail))
    if not ok:
        FAILS.append(what)
    return ok


# ---- the data: GPT-2's vocabulary's size and an indexed dataset ----

def bytes_to_unicode():
    """GPT-2's byte-to-unicode table: printable bytes as themselves, the
    other 68 from U+0100 on."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def write_vocab(dirname):
    """vocab.json with 50,257 entries, as GPT-2's: the 256 byte tokens in
    GPT-2's spelling, filler tokens, <|endoftext|> last; and merges.txt
    without merges (so text encodes byte by byte)."""
    vocab = {u: k for k, u in enumerate(bytes_to_unicode())}
    vocab.update({"t%d" % k: k for k in range(256, VOCAB - 1)})
    vocab["<|endoftext|>"] = VOCAB - 1
    vpath, mpath = os.path.join(dirname, "gpt2-vocab.json"), os.path.join(dirname, "gpt2-merges.txt")
    with open(vpath, "w") as f:
        json.dump(vocab, f)
    with open(mpath, "w") as f:
        f.write("#version: 0.2\n")
    return vpath, mpath


def write_mmidx(prefix, docs):
    """Megatron's MMIDIDX from the format: uint16 ids (dtype 8)."""
    lengths, pointers, offset = [], [], 0
    with open(prefix + ".bin", "wb") as f:
        for d in docs:
            f.write(struct.pack("<%dH" % len(d), *d))
            lengths.append(len(d))
            pointers.append(offset)
            offset += 2 * len(d)
    doc_idx = list(range(len(docs) + 1))
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", 8))
        f.write(struct.pack("<Q", len(docs)))
        f.write(struct.pack("<Q", len(doc_idx)))
        f.write(struct.pack("<%di" % len(lengths), *lengths))
        f.write(struct.pack("<%dq" % len(pointers), *pointers))
        f.write(struct.pack("<%dq" % len(doc_idx), *doc_idx))


# ---- the scripts ----

def script_with_mp(data, vocab, merges, ckpt):
    """examples/pretrain_gpt_distributed_with_mp.sh ("345M"), in order."""
    return [
        "--tensor-model-parallel-size", "2",
        "--pipeline-model-parallel-size", "2",
        "--num-layers", "4",                      # 24
        "--hidden-size", "64",                    # 1024
        "--num-attention-heads", "4",             # 16
        "--micro-batch-size", "4",
        "--global-batch-size", "16",
        "--seq-length", "32",                     # 1024
        "--max-position-embeddings", "32",        # 1024
        "--train-iters", "6",                     # 500000
        "--lr-decay-iters", "5",                  # 320000
        "--save", ckpt,
        "--load", ckpt,
        "--data-path", data,
        "--vocab-file", vocab,
        "--merge-file", merges,
        "--data-impl", "mmap",
        "--split", "949,50,1",
        "--distributed-backend", "nccl",
        "--lr", "0.00015",
        "--lr-decay-style", "cosine",
        "--min-lr", "1.0e-5",
        "--weight-decay", "1e-2",
        "--clip-grad", "1.0",
        "--lr-warmup-fraction", ".01",
        "--checkpoint-activations",
        "--log-interval", "2",                    # 100
        "--save-interval", "3",                   # 10000
        "--eval-interval", "3",                   # 1000
        "--eval-iters", "2",                      # 10
        "--fp16",
    ]


def script_gpt3_175b(data, vocab, merges, ckpt, tb):
    """examples/gpt3/train_gpt3_175b_distributed.sh ("175B"), in order."""
    return [
        "--num-layers", "4",                      # 96
        "--hidden-size", "64",                    # 12288
        "--num-attention-heads", "4",             # 96
        "--seq-length", "32",                     # 2048
        "--max-position-embeddings", "32",        # 2048
        "--attention-backend", "auto",
        "--micro-batch-size", "1",
        "--global-batch-size", "16",              # 1536
        "--rampup-batch-size", "4", "4", "48",    # 16 16 5859375
        "--train-iters", "8",                     # 500000
        "--weight-decay", "0.1",
        "--adam-beta1", "0.9",
        "--adam-beta2", "0.95",
        "--init-method-std", "0.006",
        "--clip-grad", "1.0",
        "--fp16",
        "--lr", "6.0e-5",
        "--lr-decay-style", "cosine",
        "--min-lr", "6.0e-6",
        "--lr-warmup-fraction", ".001",
        "--lr-decay-iters", "6",                  # 430000
        "--tensor-model-parallel-size", "1",      # 8
        "--pipeline-model-parallel-size", "2",    # 16
        "--data-path", data,
        "--vocab-file", vocab,
        "--merge-file", merges,
        "--split", "949,50,1",
        "--log-interval", "1",                    # 100
        "--save-interval", "4",                   # 10000
        "--eval-interval", "4",                   # 1000
        "--save", ckpt,
        "--load", ckpt,
        "--eval-iters", "2",                      # 10
        "--tensorboard-dir", tb,
    ]


def script_llama3_8b(data, ckpt, tb):
    """examples/llama/train_llama3_8b_h100_fp8.sh (Megatron-LM d98e8a6), in
    order: MODEL_ARGS, TRAINING_ARGS, DTYPE_ARGS (fp8), MODEL_PARALLEL_ARGS,
    DDP_ARGS, the real-data DATA_ARGS_LIST, EVAL_AND_LOGGING_ARGS."""
    return [
        "--use-mcore-models",
        "--num-layers", "2",                      # 32
        "--hidden-size", "64",                    # 4096
        "--ffn-hidden-size", "224",               # 14336
        "--num-attention-heads", "8",             # 32
        "--group-query-attention",
        "--num-query-groups", "2",                # 8
        "--kv-channels", "8",                     # 128
        "--seq-length", "32",                     # 8192
        "--max-position-embeddings", "32",        # 8192
        "--position-embedding-type", "rope",
        "--rotary-base", "1000000",
        "--rotary-percent", "1.0",
        "--attention-dropout", "0.0",
        "--hidden-dropout", "0.0",
        "--swiglu",
        "--normalization", "RMSNorm",
        "--init-method-std", "0.0134",
        "--attention-backend", "fused",
        "--apply-layernorm-1p",
        "--untie-embeddings-and-output-weights",
        "--disable-bias-linear",
        "--micro-batch-size", "1",
        "--global-batch-size", "8",               # 128
        "--train-samples", "48",                  # 1953125000
        "--lr-decay-samples", "40",               # 1949218748
        "--lr-warmup-samples", "8",               # 3906252
        "--lr", "0.00015",
        "--min-lr", "0.00001",
        "--decoupled-lr", "5.0e-4",
        "--decoupled-min-lr", "4.5e-5",
        "--lr-decay-style", "cosine",
        "--clip-grad", "1.0",
        "--weight-decay", "0.1",
        "--adam-beta1", "0.9",
        "--adam-beta2", "0.95",
        "--bf16",
        "--grad-reduce-in-bf16",
        "--cross-entropy-loss-fusion",
        "--calculate-per-token-loss",
        "--manual-gc",
        "--empty-unused-memory-level", "1",
        "--exit-duration-in-mins", "235",
        "--fp8-format", "hybrid",
        "--fp8-amax-history-len", "1024",
        "--fp8-amax-compute-algo", "max",
        "--fp8-param-gather",
        "--tensor-model-parallel-size", "1",
        "--context-parallel-size", "1",
        "--sequence-parallel",
        "--use-distributed-optimizer",
        "--overlap-grad-reduce",
        "--overlap-param-gather",
        "--data-path", data,
        "--tokenizer-type", "HuggingFaceTokenizer",
        "--tokenizer-model", "meta-llama/Meta-Llama-3-8B",
        "--data-cache-path", os.path.join(os.path.dirname(ckpt), "cache"),
        "--split", "'99,1,0'",
        "--no-create-attention-mask-in-dataloader",
        "--no-mmap-bin-files",
        "--num-workers", "1",
        "--vocab-size", str(LLAMA_VOCAB),         # 128256
        "--log-interval", "1",
        "--eval-iters", "2",                      # 32
        "--eval-interval", "3",                   # 100
        "--save-interval", "3",                   # 1000
        "--log-throughput",
        "--profile",
        "--profile-step-start", "4",
        "--profile-step-end", "6",
        "--ckpt-format", "torch_dist",
        "--distributed-timeout-minutes", "60",
        "--save", ckpt,
        "--load", ckpt,
        "--tensorboard-dir", tb,
    ]


def script_gpt3_175b_step(data, vocab, merges, ckpt, tb):
    """examples/gpt3/train_gpt3_175b_distributed.sh as it is now (Megatron-LM
    d98e8a6): the ramp is --step-batch-size-schedule, training by
    --train-iters; in order."""
    argv = script_gpt3_175b(data, vocab, merges, ckpt, tb)
    i = argv.index("--rampup-batch-size")
    # "0:16 2.4B:320 4.8B:624 7.2B:928 9.6B:1232 12B:1536", tokens
    return argv[:i] + ["--step-batch-size-schedule", "0:4 1K:8 2K:12 3K:16"] + argv[i + 4:]


def script_llama3_8b_fsdp(data, ckpt, tb):
    """examples/megatron_fsdp/train_llama3_8b_fsdp_h100_fp8.sh (Megatron-LM
    d98e8a6), its defaults (Megatron FSDP on, no Nsight), in order:
    MODEL_ARGS, TRAINING_ARGS with the FSDP block and DDP_ARGS, DTYPE_ARGS,
    MODEL_PARALLEL_ARGS, the real-data DATA_ARGS_LIST, EVAL_AND_LOGGING_ARGS.
    Its model is the Llama 3 script's."""
    llama = script_llama3_8b(data, ckpt, tb)

    def part(first, end):
        return llama[llama.index(first):llama.index(end)]
    model = part("--use-mcore-models", "--micro-batch-size")
    # its TRAINING_ARGS are the Llama 3 script's but for these two
    training = part("--micro-batch-size", "--fp8-format")
    training.remove("--grad-reduce-in-bf16")
    training[training.index("--calculate-per-token-loss")] = "--no-check-for-nan-in-loss-and-grad"
    fsdp = [
        "--use-megatron-fsdp",
        "--data-parallel-sharding-strategy", "optim_grads_params",
        "--no-gradient-accumulation-fusion",
        "--calculate-per-token-loss",
        "--init-model-with-meta-device",
        "--ckpt-format", "fsdp_dtensor",
        "--use-nccl-ub",
        "--fsdp-double-buffer",
        "--fsdp-manual-registration",
    ]
    ddp = part("--use-distributed-optimizer", "--data-path")
    data_args = part("--data-path", "--log-interval")
    return (model + training + fsdp + ddp + part("--fp8-format", "--tensor-model-parallel-size")
            + part("--tensor-model-parallel-size", "--use-distributed-optimizer") + data_args + [
        "--log-interval", "1",
        "--eval-iters", "2",                      # 32
        "--eval-interval", "3",                   # 100
        "--save-interval", "3",                   # 1000
        "--log-throughput",
        "--logging-level", "20",
        "--distributed-timeout-minutes", "60",
        "--save", ckpt,
        "--load", ckpt,
        "--tensorboard-dir", tb,
    ])


# What each refusal must say, and what the user then writes: the flags to
# take out (with how many values each), the words in the message, the flags
# to put in.
REPLACE = {
    "--checkpoint-activations": (
        [("--checkpoint-activations", 0)],
        ["Megatron replaced it with --recompute-activations",
         "use --recompute-granularity full --recompute-method uniform --recompute-num-layers 1"],
        ["--recompute-granularity", "full", "--recompute-method", "uniform",
         "--recompute-num-layers", "1"]),
    "--fp16": (
        [("--fp16", 0)],
        ["mega has no fp16 mixed precision", "use --bf16"],
        ["--bf16"]),
    "--tensorboard-dir": (
        [("--tensorboard-dir", 1)],
        ["mega writes no TensorBoard", "megactl watch JOB --json", "/metrics", "drop it"],
        []),
    "--rampup-batch-size": (
        [("--train-iters", 1), ("--lr-decay-iters", 1)],
        ["--rampup-batch-size needs sample-based training, as in Megatron",
         "give --train-samples 128 instead of --train-iters 8",
         "--lr-decay-samples 96 for --lr-decay-iters 6"],
        ["--train-samples", "128", "--lr-decay-samples", "96"]),
    # the Llama 3 script's, in its order
    "--attention-backend": (
        [("--attention-backend", 1)],
        ["mega chooses the attention itself", "give --attention-backend auto, or drop the flag"],
        []),
    "--apply-layernorm-1p": (
        [("--apply-layernorm-1p", 0)],
        ["as Hugging Face's LlamaRMSNorm does", "drop it"],
        []),
    "--decoupled-lr": (
        [("--decoupled-lr", 1)],
        ["one learning rate", "drop it"],
        []),
    "--decoupled-min-lr": (
        [("--decoupled-min-lr", 1)],
        ["one learning rate", "drop it"],
        []),
    "--grad-reduce-in-bf16": (
        [("--grad-reduce-in-bf16", 0)],
        ["reduces gradients in fp32", "drop it"],
        []),
    "--cross-entropy-loss-fusion": (
        [("--cross-entropy-loss-fusion", 0)],
        ["no fused cross-entropy kernel", "drop it"],
        []),
    "--empty-unused-memory-level": (
        [("--empty-unused-memory-level", 1)],
        ["no cache to empty", "drop it (0 is accepted)"],
        []),
    "--fp8-format": (
        [("--fp8-format", 1), ("--fp8-amax-history-len", 1), ("--fp8-amax-compute-algo", 1),
         ("--fp8-param-gather", 0)],
        ["mega has no fp8 GEMMs", "use --bf16"],
        []),
    "--tokenizer-type": (
        [("--tokenizer-type", 1), ("--tokenizer-model", 1), ("--vocab-size", 1)],
        ["'HuggingFaceTokenizer' is not one of NullTokenizer, GPT2BPETokenizer",
         "give --tokenizer-type NullTokenizer --vocab-size N, N the tokenizer's vocabulary "
         "size less one"],
        ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(LLAMA_VOCAB - 1)]),
    "--data-cache-path": (
        [("--data-cache-path", 1)],
        ["file order (--data-order file) has none to cache", "drop --data-cache-path"],
        []),
    "--no-mmap-bin-files": (
        [("--no-mmap-bin-files", 0)],
        ["memory-maps", "drop it"],
        []),
    "--num-workers": (
        [("--num-workers", 1)],
        ["without data-loader workers", "drop it"],
        []),
    "--profile": (
        [("--profile", 0), ("--profile-step-start", 1), ("--profile-step-end", 1)],
        ["its own Chrome trace", "use --trace-iteration K"],
        []),
    "--ckpt-format": (
        [("--ckpt-format", 1)],
        ["one format: Hugging Face safetensors", "drop it"],
        []),
    # the current 175B script's and the FSDP Llama script's
    "--step-batch-size-schedule": (
        [("--step-batch-size-schedule", 1)],
        ["no step-wise batch schedule", "drop it to train at --global-batch-size throughout"],
        []),
    "--no-check-for-nan-in-loss-and-grad": (
        [("--no-check-for-nan-in-loss-and-grad", 0)],
        ["always stops at a gradient norm that is not finite", "drop it"],
        []),
    "--use-megatron-fsdp": (
        [("--use-megatron-fsdp", 0)],
        ["mega has no FSDP", "use --use-distributed-optimizer"],
        []),
    "--data-parallel-sharding-strategy": (
        [("--data-parallel-sharding-strategy", 1)],
        ["mega has no FSDP", "drop it (no_shard is accepted"],
        []),
    "--init-model-with-meta-device": (
        [("--init-model-with-meta-device", 0)],
        ["no meta device", "drop it"],
        []),
    "--use-nccl-ub": (
        [("--use-nccl-ub", 0)],
        ["no NCCL user buffers", "drop it"],
        []),
    "--fsdp-double-buffer": (
        [("--fsdp-double-buffer", 0)],
        ["mega has no FSDP", "drop it"],
        []),
    "--fsdp-manual-registration": (
        [("--fsdp-manual-registration", 0)],
        ["mega has no FSDP", "drop it"],
        []),
    "--logging-level": (
        [("--logging-level", 1)],
        ["no levels", "drop it"],
        []),
    "--distributed-timeout-minutes": (
        [("--distributed-timeout-minutes", 1)],
        ["--step-timeout", "drop it"],
        []),
}
LLAMA3_REFUSED = ["--attention-backend", "--apply-layernorm-1p", "--decoupled-lr",
                  "--decoupled-min-lr", "--grad-reduce-in-bf16", "--cross-entropy-loss-fusion",
                  "--empty-unused-memory-level", "--fp8-format", "--tokenizer-type",
                  "--no-mmap-bin-files", "--num-workers", "--profile",
                  "--ckpt-format", "--distributed-timeout-minutes", "--tensorboard-dir",
                  # a job flag, refused by the job's check (file order) after the parse
                  "--data-cache-path"]

LLAMA3_FSDP_REFUSED = ["--attention-backend", "--apply-layernorm-1p", "--decoupled-lr",
                       "--decoupled-min-lr", "--cross-entropy-loss-fusion",
                       "--no-check-for-nan-in-loss-and-grad", "--empty-unused-memory-level",
                       "--use-megatron-fsdp", "--data-parallel-sharding-strategy",
                       "--init-model-with-meta-device", "--ckpt-format", "--use-nccl-ub",
                       "--fsdp-double-buffer", "--fsdp-manual-registration", "--fp8-format",
                       "--tokenizer-type", "--no-mmap-bin-files",
                       "--num-workers", "--logging-level", "--distributed-timeout-minutes",
                       "--tensorboard-dir",
                       # a job flag, refused by the job's check (file order) after the parse
                       "--data-cache-path"]

def remove(argv, flags):
    """argv less each (flag, its number of values)."""
    for flag, n in flags:
        i = argv.index(flag)
        argv = argv[:i] + argv[i + 1 + n:]
    return argv


def megaw_launch(args, world, tmp, timeout=240):
    """world ranks of megaw started by hand; (rcs, stdouts, stderrs)."""
    rdv = tempfile.mkdtemp(dir=tmp, prefix="rdv-")
    base = [MEGAW] + args
    if world > 1:
        base += ["--world-size", str(world), "--rendezvous-dir", rdv]
    procs = [subprocess.Popen(base + (["--rank", str(r)] if world > 1 else []),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    outs = []
    deadline = time.time() + timeout
    for p in procs:
        try:
            outs.append(p.communicate(timeout=max(1, deadline - time.time())))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    return [p.returncode for p in procs], [o for o, _ in outs], [e for _, e in outs]


def megad_run(args, slots, timeout=240):
    p = subprocess.run([MEGAD, "run", "--slots", str(slots)] + args, capture_output=True,
                       text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def first_flag(argv):
    return next((a for a in argv if a.startswith("--")), None)


def until_it_trains(name, argv, run):
    """Runs argv; applies each refusal's replacement; returns (argv, out,
    err, refused flags)."""
    refused = []
    for _ in range(len(REPLACE) + 1):
        rc, out, err = run(argv)
        if rc == 0:
            return argv, out, err, refused
        # the refused flag is the one the message names first (its text may
        # name others, as the way out)
        named = [f for f in REPLACE if f in err and f not in refused]
        flag = min(named, key=err.index) if named else None
        if not check("%s: exit %d is a refusal of a known flag" % (name, rc), rc == 2 and flag,
                     err.strip()[-600:]):
            return argv, out, err, refused
        words, says, instead = REPLACE[flag]
        for s in says:
            check("%s: %s's refusal says '%s'" % (name, flag, s), s in err, err.strip())
        check("%s: the refusal is a line of the program's own" % name,
              all(l.startswith(("megaw: ", "megad: ")) for l in err.splitlines()), err)
        refused.append(flag)
        argv = remove(argv, words) + instead
    return argv, "", "no run", refused


def known_flags():
    """mega's job flags and the Megatron flags it accepts, from megaw --help."""
    text = subprocess.run([MEGAW, "--help"], capture_output=True, text=True).stdout
    head, _, accepted = text.partition("Megatron flags accepted because they restate")
    table = set(re.findall(r"^  (--[a-z0-9_-]+)", head, re.M))
    ok = set(re.findall(r"(--[a-z0-9_-]+)", accepted.split("Other Megatron flags")[0]))
    return table, ok


def no_flag_ignored(name, argv, refused, original):
    table, ok = known_flags()
    for a in argv:
        if a.startswith("--"):
            check("%s: %s is mega's flag or restates mega" % (name, a), a in table or a in ok)
    for a in original:
        if a.startswith("--"):
            check("%s: the script's %s is honoured or refused" % (name, a),
                  a in argv or a in refused or
                  any(a == f for r in refused for f, _ in REPLACE[r][0]))


LINE = re.compile(r"^ \[[0-9-]+ [0-9:.]+\] iteration +(\d+)/ +(\d+) \| consumed samples: +(\d+) \|"
                  r" elapsed time per iteration \(ms\): [0-9.]+ \|.* learning rate: ([0-9.E+-]+) \|"
                  r" global batch size: +(\d+) \| lm loss: ([0-9.E+-]+) \| loss scale: 1\.0 \|"
                  r" grad norm: [0-9.]+ \| number of skipped iterations: +0 \|"
                  r" number of nan iterations: +0 \|", re.M)
EVAL = re.compile(r"^ validation loss at iteration (\d+) \| lm loss value: ([0-9.E+-]+) \|"
                  r" lm loss PPL: [0-9.E+-]+ \| $", re.M)


def lines_of(out):
    return [(int(m[0]), int(m[1]), int(m[2]), float(m[3]), int(m[4]), m[5])
            for m in LINE.findall(out)]


def megatron_lr(n, lr, min_lr, warmup, decay):
    """OptimizerParamScheduler.get_lr, cosine: linear warmup from 0 for n <=
    warmup, min_lr past the decay, else min + (lr - min) (cos(pi r) + 1) / 2,
    r = (n - warmup) / (decay - warmup); n counts samples."""
    if warmup > 0 and n <= warmup:
        return lr * n / warmup
    if n > decay:
        return min_lr
    r = (n - warmup) / (decay - warmup)
    return min_lr + (lr - min_lr) * 0.5 * (math.cos(math.pi * r) + 1)


def megatron_rampup(c, start, inc, samples, G):
    """RampupBatchsizeNumMicroBatchesCalculator.update's global batch."""
    if c > samples:
        return G
    return start + int(c / (samples / ((G - start) // inc))) * inc


def checkpoints(ckpt):
    return sorted(int(d[5:]) for d in os.listdir(ckpt) if re.fullmatch(r"iter_\d{7}", d))


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


def flatten(r):
    rcs, outs, errs = r
    bad = [rc for rc in rcs if rc != 0]
    return (bad[0] if bad else 0), "".join(outs), "".join(errs)


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
