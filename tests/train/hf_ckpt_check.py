#!/usr/bin/python3
"""A megaw checkpoint read by an independent implementation.

Trains a tiny model for 2 iterations with megaw and saves; resumes it for a
3rd iteration (--json). Then, in Python: reads iter_0000002 as a Hugging
Face GPT-2 directory (config.json, model.safetensors, HF names and
layouts), builds iteration 3's batch from the README's data order, and
computes its loss with the torch.nn GPT-2 of tests/ref/make_ref.py. The two
losses must agree.

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


def main():
    megaw, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    data = os.path.join(work, "data.bin")
    phrase = b"the quick brown fox jumps over the lazy dog. "
    with open(data, "wb") as f:
        f.write((phrase * 200)[:5000] + bytes(range(256)))
    save = os.path.join(work, "ckpt")
    subprocess.run(["rm", "-rf", save], check=True)
    flags = [megaw, "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
             "--seq-length", str(T), "--max-position-embeddings", "48",
             "--micro-batch-size", str(MB), "--global-batch-size", str(G), "--lr", "1e-2",
             "--lr-decay-iters", "3", "--data-path", data, "--json"]
    subprocess.run(flags + ["--train-iters", "2", "--save", save], check=True,
                   stdout=subprocess.DEVNULL)
    out = subprocess.run(flags + ["--train-iters", "3", "--load", save], check=True,
                         stdout=subprocess.PIPE).stdout.decode().strip().splitlines()
    step = json.loads(out[-1])
    assert step["iteration"] == 3, out

    d = os.path.join(save, "iter_0000002")
    cfg_json = json.load(open(os.path.join(d, "config.json")))
    assert cfg_json["model_type"] == "gpt2" and cfg_json["tie_word_embeddings"]
    assert cfg_json["architectures"] == ["GPT2LMHeadModel"]
    tensors, meta = make_ref.read_safetensors(os.path.join(d, "model.safetensors"))
    assert meta.get("format") == "pt", meta
    cfg = {"vocab_size": cfg_json["vocab_size"], "max_seq_len": cfg_json["n_positions"],
           "num_layers": cfg_json["n_layer"], "num_heads": cfg_json["n_head"],
           "channels": cfg_json["n_embd"], "ln_eps": cfg_json["layer_norm_epsilon"]}
    model = make_ref.GPT(cfg).double()
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
    print(f"megaw loss {step['loss']:.9f}, torch from the checkpoint {loss:.9f}, rel {rel:.2e}")
    return 0 if rel < 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
