#!/usr/bin/python3
"""megaw with a real vocabulary against PyTorch: GPT-2's 50,257 token ids
(NullTokenizer --vocab-size 50256: ids 0..50256, the last the end of
document as Megatron's NullTokenizer), padded as Megatron pads to 50,304.

Writes an MMIDIDX pair of int32 token ids (documents ending with the
end-of-document id, as preprocess_data.py --append-eod writes them), trains
one iteration with megaw on a tiny model (two microbatches accumulate), and
saves before and after it. Then, with the torch.nn GPT-2 of
tests/ref/make_ref.py in float64: the initial weights (iter_0000000), the
first global batch from the README's data order, the mean loss and every
parameter's gradient. megaw's first-iteration loss must match, and so must
its gradients, read from Adam's first moment after one step without
clipping (exp_avg = (1 - beta1) * grad).

  /usr/bin/python3 vocab_parity.py MEGAW WORKDIR
"""
import json
import os
import random
import struct
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
import make_ref  # noqa: E402

T, G, MB, VOCAB, PADDED, BETA1 = 16, 4, 2, 50256, 50304, 0.9


def write_int32_mmidx(prefix, docs):
    with open(prefix + ".bin", "wb") as f:
        for d in docs:
            f.write(struct.pack("<%di" % len(d), *d))
    lengths = [len(d) for d in docs]
    pointers = [4 * sum(lengths[:i]) for i in range(len(docs))]
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 4, len(docs), len(docs) + 1))
        f.write(struct.pack("<%di" % len(docs), *lengths))
        f.write(struct.pack("<%dq" % len(docs), *pointers))
        f.write(struct.pack("<%dq" % (len(docs) + 1), *range(len(docs) + 1)))


def main():
    megaw, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    rng = random.Random(5)
    docs = [[rng.randrange(VOCAB) for _ in range(rng.randrange(5, 40))] + [VOCAB]
            for _ in range(12)]
    prefix = os.path.join(work, "gpt2ids")
    write_int32_mmidx(prefix, docs)
    stream = [t for d in docs for t in d]
    save = os.path.join(work, "ckpt")
    subprocess.run(["rm", "-rf", save], check=True)
    out = subprocess.run(
        [megaw, "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
         "--seq-length", str(T), "--micro-batch-size", str(MB), "--global-batch-size", str(G),
         "--train-iters", "1", "--lr", "1e-3", "--clip-grad", "0", "--adam-beta1", str(BETA1),
         "--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB),
         "--data-path", prefix, "--save", save, "--save-initial", "--json"],
        check=True, stdout=subprocess.PIPE).stdout.decode().strip().splitlines()
    step = json.loads(out[-1])

    cfg_json = json.load(open(os.path.join(save, "iter_0000000", "config.json")))
    assert cfg_json["vocab_size"] == PADDED, cfg_json["vocab_size"]
    tensors, _ = make_ref.read_safetensors(os.path.join(save, "iter_0000000", "model.safetensors"))
    cfg = {"vocab_size": PADDED, "max_seq_len": cfg_json["n_positions"],
           "num_layers": cfg_json["n_layer"], "num_heads": cfg_json["n_head"],
           "channels": cfg_json["n_embd"], "ln_eps": cfg_json["layer_norm_epsilon"]}
    model = make_ref.GPT(cfg).double()
    model.load_hf(tensors)
    assert tensors["transformer.wte.weight"].shape == (PADDED, 32)

    K = (len(stream) - 1) // T  # iteration 1: windows 0..G-1 (mod K)
    win = [j % K for j in range(G)]
    tok = torch.tensor([stream[k * T:k * T + T] for k in win])
    tgt = torch.tensor([stream[k * T + 1:k * T + T + 1] for k in win])
    _, loss, grads = make_ref.forward_backward(model, tok, tgt)
    rel = abs(loss.item() - step["loss"]) / loss.item()
    print(f"loss: megaw {step['loss']:.9f}, torch {loss.item():.9f}, rel {rel:.2e}")
    ok = rel < 1e-5

    moments, _ = make_ref.read_safetensors(os.path.join(save, "iter_0000001",
                                                        "optimizer.safetensors"))
    worst = 0.0
    for name, g_ref in grads.items():
        g = moments[name + ".exp_avg"].astype(np.float64) / (1 - BETA1)
        err = np.linalg.norm(g - g_ref) / max(np.linalg.norm(g_ref), 1e-30)
        worst = max(worst, err)
        if err > 1e-4:
            print(f"grad {name}: relative error {err:.2e}")
            ok = False
    # the padded rows are never inputs or targets, yet the softmax gives them gradient
    pad = moments["transformer.wte.weight.exp_avg"][VOCAB + 1:]
    assert np.abs(pad).max() > 0
    print(f"gradients of {len(model.hf_params())} tensors (wte {PADDED} x 32): worst relative "
          f"error {worst:.2e}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
