#!/usr/bin/env python3
"""A tiny random-weight Qwen3ForSequenceClassification checkpoint (one label: a reranker's
relevance head) and the scores Hugging Face transformers gives for a few token sequences.

The same contract as make_fixtures.py, whose weight draw, writer and checks it reuses: the
fixture folder holds config.json as transformers writes such a checkpoint, model.safetensors
(Hugging Face names, the decoder drawn as the qwen3 fixture's is, plus `score.weight` [1, hidden], stored
in bfloat16) and scores.json: `sequences` (token ids; none is the pad id, so transformers
pools each one's last token) and `scores` (`logits[0]` of each sequence alone, float64 on the
CPU).

    python3 tools/reference/make_rerank_fixture.py OUT_DIR
"""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402

NAME = "qwen3_seqcls_bf16"
SEED = 43
LENGTHS = (1, 7, 20, 45)


def config():
    cfg = json.loads(json.dumps(mf.MODELS["qwen3"]["config"]))
    cfg["architectures"] = ["Qwen3ForSequenceClassification"]
    cfg["num_labels"] = 1
    cfg["id2label"] = {"0": "LABEL_0"}
    cfg["label2id"] = {"LABEL_0": 0}
    cfg["pad_token_id"] = 0
    cfg["tie_word_embeddings"] = False
    cfg["torch_dtype"] = "bfloat16"
    return dict(sorted(cfg.items()))


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    import torch
    import transformers

    out = os.path.join(sys.argv[1], NAME)
    os.makedirs(out, exist_ok=True)
    cfg = config()
    master = mf.master_weights(dict(cfg, tie_word_embeddings=True), SEED)
    rng = np.random.default_rng(SEED + 1)
    master["score.weight"] = (
        rng.standard_normal((1, cfg["hidden_size"]), dtype=np.float32) / np.sqrt(cfg["hidden_size"])
    ).astype(np.float32)
    stored, ref = {}, {}
    for name, w in master.items():
        b = mf.bf16_bits(w)
        stored[name] = ("BF16", b)
        ref[name] = mf.bf16_to_f64(b)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    path = os.path.join(out, "model.safetensors")
    mf.write_safetensors(path, stored)
    _, raw = mf.read_safetensors(path)
    assert set(raw) == set(stored)

    hf_cfg = transformers.AutoConfig.from_pretrained(out)
    model = transformers.AutoModelForSequenceClassification.from_config(hf_cfg).to(torch.float64)
    assert type(model).__name__ == "Qwen3ForSequenceClassification", type(model).__name__
    state = {k: torch.from_numpy(v) for k, v in ref.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if "rotary_emb" not in m]
    assert not missing and not unexpected, (missing, unexpected)
    model.eval()

    seq_rng = np.random.default_rng(SEED + 2)
    sequences, scores = [], []
    for n in LENGTHS:
        ids = [1] + [int(t) for t in seq_rng.integers(4, cfg["vocab_size"], size=n - 1)]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits
        assert logits.shape == (1, 1), logits.shape
        sequences.append(ids)
        scores.append([float(logits[0, 0])])
    # the score must depend on the whole sequence, not only its last token
    with torch.no_grad():
        alone = float(model(torch.tensor([[sequences[-1][-1]]])).logits[0, 0])
    assert abs(alone - scores[-1][0]) > 1e-3 * max(1.0, abs(scores[-1][0])), (alone, scores)
    reference = {
        "family": "qwen3",
        "architecture": "Qwen3ForSequenceClassification",
        "dtype": "bfloat16",
        "sequences": sequences,
        "scores": scores,
        "notes": "score = score.weight . final-normed hidden state of each sequence's last "
        "token (transformers pools the last non-pad token); float64 on the CPU",
        "seed": SEED,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    with open(os.path.join(out, "scores.json"), "w") as f:
        json.dump(reference, f, indent=2)
        f.write("\n")
    print(NAME, "scores", [s[0] for s in scores])


if __name__ == "__main__":
    main()
