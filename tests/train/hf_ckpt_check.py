#!/usr/bin/python3
"""A megaw checkpoint read by an independent implementation.

Trains a tiny model for 2 iterations with megaw and saves; resumes it for a
3rd iteration (--json). Then, in Python: reads iter_0000002 as a Hugging
Face directory (config.json, model.safetensors or HF's shards through
model.safetensors.index.json, HF names and layouts), builds iteration 3's
batch from the README's data order, and computes its loss with the torch.nn
model of tests/ref/make_ref.py that config.json names. The two losses must
agree. GPT-2 saved by one rank (one model.safetensors) and by two pipeline
stages (a sharded checkpoint, one shard per stage); a Llama (grouped-query
attention, RoPE of base 500000, untied, no biases) saved by one rank, by two
pipeline stages and by two tensor-parallel ranks (its query groups split),
and with RoPE on 0.29 of 100-channel heads (28 channels, counted in double),
whose greedy continuation by megaw generate must also be the torch model's
argmax, token by token.

  /usr/bin/python3 hf_ckpt_check.py MEGAW WORKDIR
"""
import json
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
import make_ref  # noqa: E402

T, G, MB = 32, 8, 4


def read_hf_model(d):
    """The model's tensors of an HF directory: model.safetensors, or the
    shards its index names (every listed tensor in its file, total_size)."""
    index = os.path.join(d, "model.safetensors.index.json")
    if not os.path.exists(index):
        tensors, meta = make_ref.read_safetensors(os.path.join(d, "model.safetensors"))
        assert meta.get("format") == "pt", meta
        return tensors
    idx = json.load(open(index))
    tensors, size = {}, 0
    for fname in sorted(set(idx["weight_map"].values())):
        part, meta = make_ref.read_safetensors(os.path.join(d, fname))
        assert meta.get("format") == "pt", (fname, meta)
        for name in part:
            assert idx["weight_map"].get(name) == fname, (name, fname)
            size += part[name].nbytes
        tensors.update(part)
    assert set(tensors) == set(idx["weight_map"]), sorted(set(tensors) ^ set(idx["weight_map"]))
    assert size == idx["metadata"]["total_size"], (size, idx["metadata"])
    return tensors


def save_and_resume(megaw, flags, save, pp, work, tp=1):
    """Saves after 2 iterations on pp pipeline stages of tp ranks (started
    by hand), resumes for a 3rd on one rank; returns iteration 3's step."""
    subprocess.run(["rm", "-rf", save], check=True)
    first = flags + ["--train-iters", "2", "--save", save]
    world = pp * tp
    if world == 1:
        subprocess.run(first, check=True, stdout=subprocess.DEVNULL)
    else:
        rdv = os.path.join(work, "rdv-pp%d-tp%d" % (pp, tp))
        subprocess.run(["rm", "-rf", rdv], check=True)
        os.makedirs(rdv)
        first += ["--pipeline-model-parallel-size", str(pp), "--tensor-model-parallel-size",
                  str(tp), "--world-size", str(world), "--rendezvous-dir", rdv]
        procs = [subprocess.Popen(first + ["--rank", str(r)], stdout=subprocess.DEVNULL)
                 for r in range(world)]
        assert all(p.wait(timeout=120) == 0 for p in procs)
    out = subprocess.run(flags + ["--train-iters", "3", "--load", save], check=True,
                         stdout=subprocess.PIPE).stdout.decode().strip().splitlines()
    step = json.loads(out[-1])
    assert step["iteration"] == 3, out
    return step


# Hugging Face's GELU names -> nn.GELU's approximate
GELU = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "none"}


def model_of(c):
    """The torch model a config.json describes, as Hugging Face reads it."""
    if c["model_type"] == "gpt2":
        assert c["architectures"] == ["GPT2LMHeadModel"] and c["tie_word_embeddings"]
        cfg = {"vocab_size": c["vocab_size"], "max_seq_len": c["n_positions"],
               "num_layers": c["n_layer"], "num_heads": c["n_head"], "channels": c["n_embd"],
               "ln_eps": c["layer_norm_epsilon"],
               # GPT2Config's activation_function, "gelu_new" by default
               "gelu": GELU[c.get("activation_function", "gelu_new")]}
        return make_ref.GPT(cfg).double()
    assert c["model_type"] == "llama" and c["architectures"] == ["LlamaForCausalLM"], c
    assert c["hidden_act"] == "silu" and c.get("rope_scaling") is None
    cfg = {"arch": "llama", "vocab_size": c["vocab_size"],
           "max_seq_len": c["max_position_embeddings"],
           "num_layers": c["num_hidden_layers"], "num_heads": c["num_attention_heads"],
           "num_kv_heads": c["num_key_value_heads"], "channels": c["hidden_size"],
           "head_dim": c.get("head_dim", c["hidden_size"] // c["num_attention_heads"]),
           "ffn_hidden": c["intermediate_size"], "ln_eps": c["rms_norm_eps"],
           "rope_theta": c["rope_theta"], "rotary_percent": c.get("partial_rotary_factor", 1.0),
           "untied": not c["tie_word_embeddings"], "no_bias": not c["attention_bias"]}
    return make_ref.model_from_config(cfg)


def greedy_matches(megaw, save, model, what):
    """megaw generate's greedy continuation of a prompt is the torch model's
    argmax at every step (up to a step whose two best logits are closer
    than float rounding can tell apart, where either pick is right)."""
    prompt, n = b"the lazy ", 12
    out = subprocess.run([megaw, "generate", "--load", save, "--prompt", prompt.decode(),
                          "--max-new-tokens", str(n)], check=True,
                         stdout=subprocess.PIPE).stdout
    assert out.startswith(prompt) and out.endswith(b"\n"), out
    got = list(out[len(prompt):-1])
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            top = model(torch.tensor([ids]))[0, -1].topk(2)
            if float(top.values[0] - top.values[1]) < 1e-4:
                break
            ids.append(int(top.indices[0]))
    want = ids[len(prompt):]
    print(f"{what}: megaw generate {bytes(got)!r}, torch's argmax {bytes(want)!r}")
    return got[:len(want)] == want and len(want) >= n // 2


def check(save, data, step, what, megaw=None):
    d = os.path.join(save, "iter_0000002")
    cfg_json = json.load(open(os.path.join(d, "config.json")))
    tensors = read_hf_model(d)
    model = model_of(cfg_json)
    assert set(tensors) == set(model.hf_params()), sorted(set(tensors) ^ set(model.hf_params()))
    model.load_hf(tensors)

    raw = open(data, "rb").read()
    K = (len(raw) - 1) // T
    i = 2  # iteration 3, 0-based
    win = [(i * G + j) % K for j in range(G)]
    tok = torch.tensor([list(raw[k * T:k * T + T]) for k in win])
    tgt = torch.tensor([list(raw[k * T + 1:k * T + T + 1]) for k in win])
    with torch.no_grad():
        logits = model(tok)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), tgt.view(-1)).item()
    rel = abs(loss - step["loss"]) / loss
    print(f"{what}: megaw loss {step['loss']:.9f}, torch from the checkpoint {loss:.9f}, "
          f"rel {rel:.2e}")
    return rel < 1e-5 and (megaw is None or greedy_matches(megaw, save, model, what))


def main():
    megaw, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    data = os.path.join(work, "data.bin")
    phrase = b"the quick brown fox jumps over the lazy dog. "
    with open(data, "wb") as f:
        f.write((phrase * 200)[:5000] + bytes(range(256)))
    flags = [megaw, "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
             "--seq-length", str(T), "--max-position-embeddings", "48",
             "--micro-batch-size", str(MB), "--global-batch-size", str(G), "--lr", "1e-2",
             "--lr-decay-iters", "3", "--data-path", data, "--json"]
    ok = True
    for pp in (1, 2):
        save = os.path.join(work, "ckpt-pp%d" % pp)
        step = save_and_resume(megaw, flags, save, pp, work)
        ok &= check(save, data, step, "saved by %d pipeline stage%s" % (pp, "s" if pp > 1 else ""))
    llama = flags + ["--position-embedding-type", "rope", "--normalization", "RMSNorm",
                     "--swiglu", "--ffn-hidden-size", "64", "--group-query-attention",
                     "--num-query-groups", "2", "--untie-embeddings-and-output-weights",
                     "--disable-bias-linear", "--rotary-base", "500000"]
    for pp, tp in ((1, 1), (2, 1), (1, 2)):
        save = os.path.join(work, "llama-pp%d-tp%d" % (pp, tp))
        step = save_and_resume(megaw, llama, save, pp, work, tp)
        ok &= check(save, data, step, "Llama saved by PP %d x TP %d" % (pp, tp), megaw)
    # RoPE on int(100 x 0.29) = 28 channels of each 100-wide head, as
    # Megatron and partial_rotary_factor count them in double (29 in float)
    save = os.path.join(work, "llama-rot29")
    step = save_and_resume(megaw, llama + ["--kv-channels", "100", "--rotary-percent", "0.29"],
                           save, 1, work)
    ok &= check(save, data, step, "Llama, RoPE on 28 of 100 channels", megaw)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
