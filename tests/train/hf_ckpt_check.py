#!/usr/bin/python3
"""A megaw checkpoint read by an independent implementation.

Trains a tiny model for 2 iterations with megaw and saves; resumes it for a
3rd iteration (--json). Then, in Python: reads iter_0000002 as a Hugging
Face GPT-2 directory (config.json, model.safetensors or HF's shards through
model.safetensors.index.json, HF names and layouts), builds iteration 3's
batch from the README's data order, and computes its loss with the torch.nn
GPT-2 of tests/ref/make_ref.py. The two losses must agree. Done twice: saved
by one rank (one model.safetensors) and by two pipeline stages (a sharded
checkpoint, one shard per stage).

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


def save_and_resume(megaw, flags, save, pp, work):
    """Saves after 2 iterations on pp pipeline stages (ranks started by
    hand), resumes for a 3rd on one rank; returns iteration 3's step."""
    subprocess.run(["rm", "-rf", save], check=True)
    first = flags + ["--train-iters", "2", "--save", save]
    if pp == 1:
        subprocess.run(first, check=True, stdout=subprocess.DEVNULL)
    else:
        rdv = os.path.join(work, "rdv-pp%d" % pp)
        subprocess.run(["rm", "-rf", rdv], check=True)
        os.makedirs(rdv)
        first += ["--pipeline-model-parallel-size", str(pp), "--world-size", str(pp),
                  "--rendezvous-dir", rdv]
        procs = [subprocess.Popen(first + ["--rank", str(r)], stdout=subprocess.DEVNULL)
                 for r in range(pp)]
        assert all(p.wait(timeout=120) == 0 for p in procs)
    out = subprocess.run(flags + ["--train-iters", "3", "--load", save], check=True,
                         stdout=subprocess.PIPE).stdout.decode().strip().splitlines()
    step = json.loads(out[-1])
    assert step["iteration"] == 3, out
    return step


def check(save, data, step, what):
    d = os.path.join(save, "iter_0000002")
    cfg_json = json.load(open(os.path.join(d, "config.json")))
    assert cfg_json["model_type"] == "gpt2" and cfg_json["tie_word_embeddings"]
    assert cfg_json["architectures"] == ["GPT2LMHeadModel"]
    tensors = read_hf_model(d)
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
    print(f"{what}: megaw loss {step['loss']:.9f}, torch from the checkpoint {loss:.9f}, "
          f"rel {rel:.2e}")
    return rel < 1e-5


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
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
