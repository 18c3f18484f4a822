"""Megatron-LM's example launch scripts as argv lists, scaled down (the
model, the run's length, parallel sizes, the ramp's sample count; every
other flag kept, in the scripts' order), and what each refusal of a flag
mega does not take must say, with what the user then writes instead
(REPLACE). megatron_scripts.py runs them."""
import os

LLAMA_VOCAB = 1000  # the Llama 3 script's tokenizer's, scaled down from 128,256


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
