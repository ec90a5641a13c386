#!/usr/bin/env python3
"""The perplexity Hugging Face transformers gives for the shipped demo model, computed the way
llama.cpp's perplexity tool (and `mlxcel perplexity`) does, for the CLI's agreement test.

The MLX 4-bit checkpoint in models/demo is dequantized exactly (make_fixtures.py's independent
reader and bit-stream unpacker) into a float32 LlamaForCausalLM. The held-out text is tokenized
with the model's tokenizer.json and one BOS in front, cut into non-overlapping windows of CTX
tokens (a short tail is dropped), each window's first token made BOS, and the predictions of
each window's second half scored: PPL = exp(mean NLL).

    python3 tools/reference/demo_perplexity.py models/demo tests/fixtures/demo_perplexity
"""

import json
import math
import os
import sys

import numpy as np
import torch
from tokenizers import Tokenizer
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import decode_checkpoint, is_quantizable  # noqa: E402

CTX = 512
CHUNKS = 8  # the windows the CI test scores (all windows are reported too)


def load_model(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    q = cfg["quantization"]
    spec = (q["bits"], q["group_size"])
    weights = decode_checkpoint(
        os.path.join(model_dir, "model.safetensors"),
        lambda module: spec if is_quantizable(module + ".weight") else None,
    )
    config = LlamaConfig.from_pretrained(model_dir)
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    state = {k: torch.from_numpy(v.astype(np.float32)) for k, v in weights.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert set(missing) <= {"lm_head.weight"}, missing  # tied to the embedding
    model.tie_weights()
    return model


def perplexity(model, ids, bos, n_windows):
    nll, count = 0.0, 0
    first = CTX // 2
    for w in range(n_windows):
        window = list(ids[w * CTX : (w + 1) * CTX])
        window[0] = bos
        with torch.no_grad():
            logits = model(torch.tensor([window])).logits[0].double()
        logp = torch.log_softmax(logits, dim=-1)
        for j in range(first + 1, CTX):
            nll -= logp[j - 1, window[j]].item()
            count += 1
    return math.exp(nll / count), count


def main():
    model_dir, out_dir = sys.argv[1], sys.argv[2]
    text_path = os.path.join(out_dir, "heldout.txt")
    with open(text_path, encoding="utf-8") as f:
        text = f.read()
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    ids = tok.encode(text, add_special_tokens=True).ids
    bos = tok.token_to_id("<s>")
    assert ids[0] == bos, "the tokenizer must add BOS"
    model = load_model(model_dir)
    total = len(ids) // CTX
    ppl_chunks, n_chunks = perplexity(model, ids, bos, CHUNKS)
    ppl_all, n_all = perplexity(model, ids, bos, total)
    out = {
        "ctx": CTX,
        "chunks": CHUNKS,
        "perplexity_chunks": ppl_chunks,
        "scored_chunks": n_chunks,
        "windows_all": total,
        "perplexity_all": ppl_all,
        "scored_all": n_all,
        "n_tokens": len(ids),
        "notes": "transformers float32 on the dequantized models/demo weights, llama-perplexity procedure",
    }
    with open(os.path.join(out_dir, "reference.json.tmp"), "w") as f:
        json.dump(out, f, indent=2)
    os.replace(os.path.join(out_dir, "reference.json.tmp"), os.path.join(out_dir, "perplexity.json"))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
