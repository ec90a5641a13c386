#!/usr/bin/env python3
"""Trains the embedded demo model: a small LlamaForCausalLM from scratch on one GPU.

Reads train.txt / heldout.txt (prepare_corpus.py: one document per line) and the Llama-2
tokenizer files, trains for at most --epochs passes or --minutes of wall time, whichever
ends first, keeps the weights with the lowest held-out loss, and writes a transformers
checkpoint (config.json, model.safetensors in bf16, tokenizer.json, tokenizer_config.json
with a chat template, TRAINING_LOG.txt) to --out.

Held-out perplexity, reported for the saved bf16 weights (the procedure of llama.cpp's
perplexity tool, so that `mlxcel perplexity -c CTX` can be compared with it):
  1. ids = the tokenizer's encoding of the whole of heldout.txt, read as one string
     (newlines included), with the special tokens on: one <s> (id 1) in front.
  2. n = len(ids) // CTX non-overlapping windows ids[i*CTX:(i+1)*CTX]; the rest is dropped.
  3. In every window the first id is set to <s>.
  4. "second half": the logits at positions CTX/2 .. CTX-2 are scored against the ids at
     CTX/2+1 .. CTX-1 (CTX/2 - 1 predictions a window), as llama.cpp does; "all":
     positions 0 .. CTX-2 against 1 .. CTX-1.
  5. PPL = exp(mean negative log-likelihood over every scored prediction), natural log.
"""

import argparse
import copy
import json
import math
import os
import random
import re
import shutil
import time

import jinja2
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from transformers import LlamaConfig, LlamaForCausalLM

BOS_ID, EOS_ID = 1, 2

# The user turn is wrapped as in Llama-2 chat; the reply follows after one space and ends
# with </s>. A system message is put in front of the first [INST] as plain text.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}"
    "{{ ' ' + message['content'] + eos_token }}"
    "{% else %}"
    "{{ message['content'] + '\\n' }}"
    "{% endif %}"
    "{% endfor %}"
)

SENTENCE_END = re.compile(r'(?<=[.?!:;"])\s+(?=["A-Z])')

LOG = None


def log(*args):
    line = " ".join(str(a) for a in args)
    print(line, flush=True)
    if LOG is not None:
        LOG.write(line + "\n")
        LOG.flush()


def render_chat(messages):
    """What CHAT_TEMPLATE renders, written out so training does not depend on jinja."""
    out = "<s>"
    for m in messages:
        if m["role"] == "user":
            out += "[INST] " + m["content"] + " [/INST]"
        elif m["role"] == "assistant":
            out += " " + m["content"] + "</s>"
        else:
            out += m["content"] + "\n"
    return out


def chat_examples(doc, rng):
    """Cuts a document into (one sentence -> the next 2 to 5 sentences) chat turns, so the
    model has seen the template and learns to end a reply with </s>."""
    sents = [s for s in SENTENCE_END.split(doc) if s]
    out, i = [], 0
    while i + 1 < len(sents):
        n = rng.randint(2, 5)
        prompt, reply = sents[i], " ".join(sents[i + 1 : i + 1 + n])
        if len(prompt) < 400:
            out.append(
                render_chat(
                    [{"role": "user", "content": prompt}, {"role": "assistant", "content": reply}]
                )
            )
        i += 1 + n
    return out


def build_stream(tok, docs, chat_frac, rng):
    """One id stream: each plain document as <s> ... </s>, chat documents as rendered turns."""
    plain, chats = [], []
    for d in docs:
        if rng.random() < chat_frac:
            chats.extend(chat_examples(d, rng))
        else:
            plain.append(d)
    ids = []
    n_plain_tokens = 0
    for enc in tok.encode_batch(plain, add_special_tokens=False):
        ids.append(BOS_ID)
        ids.extend(enc.ids)
        ids.append(EOS_ID)
        n_plain_tokens += len(enc.ids) + 2
    # Special tokens written in the rendered text are matched as added tokens, exactly as
    # when an inference engine tokenizes the template's output.
    for enc in tok.encode_batch(chats, add_special_tokens=False):
        ids.extend(enc.ids)
    log(
        f"data: {len(plain)} plain documents ({n_plain_tokens} tokens), "
        f"{len(chats)} chat turns ({len(ids) - n_plain_tokens} tokens), {len(ids)} tokens"
    )
    return ids


def add_dropout(model, p):
    """Dropout on the embedding output and on each residual branch, as forward hooks: the
    data is small, and hooks leave the saved model a plain LlamaForCausalLM."""

    def hook(module, inputs, output):
        return F.dropout(output, p, module.training)

    model.model.embed_tokens.register_forward_hook(hook)
    for layer in model.model.layers:
        layer.self_attn.o_proj.register_forward_hook(hook)
        layer.mlp.register_forward_hook(hook)


@torch.no_grad()
def heldout_nll(model, ids, ctx, device, second_half, batch=16):
    """Returns (mean NLL, predictions scored) by the procedure in this file's docstring."""
    n_chunks = len(ids) // ctx
    if n_chunks == 0:
        raise SystemExit(f"train: heldout.txt: {len(ids)} tokens, fewer than one window of {ctx}")
    first = ctx // 2 if second_half else 0
    total, count = 0.0, 0
    for c0 in range(0, n_chunks, batch):
        c1 = min(c0 + batch, n_chunks)
        chunk = torch.tensor([ids[i * ctx : (i + 1) * ctx] for i in range(c0, c1)], device=device)
        chunk[:, 0] = BOS_ID
        logits = model(input_ids=chunk).logits.float()
        pred = logits[:, first : ctx - 1]
        tgt = chunk[:, first + 1 :]
        total += F.cross_entropy(
            pred.reshape(-1, pred.shape[-1]), tgt.reshape(-1), reduction="sum"
        ).item()
        count += tgt.numel()
    return total / count, count


@torch.no_grad()
def sample(model, tok, text, n, device, temperature, top_k, gen, ctx, special):
    """Greedy when temperature == 0, else top-k sampling; stops at </s>."""
    ids = tok.encode(text, add_special_tokens=special).ids
    x = torch.tensor([ids], device=device)
    new = []
    for _ in range(n):
        logits = model(input_ids=x[:, -ctx:]).logits[0, -1].float()
        if temperature == 0:
            nxt = int(torch.argmax(logits))
        else:
            v, i = torch.topk(logits / temperature, top_k)
            nxt = int(i[torch.multinomial(torch.softmax(v, -1), 1, generator=gen)])
        if nxt == EOS_ID:
            break
        new.append(nxt)
        x = torch.cat([x, torch.tensor([[nxt]], device=device)], 1)
    if not new:
        return ""
    # The decoder strips the leading space of a text; a continuation needs it back.
    lead = " " if tok.id_to_token(new[0]).startswith("\u2581") else ""
    return lead + tok.decode(new, skip_special_tokens=False)


def lr_at(progress, step, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    floor = args.lr * args.min_lr_frac
    return floor + 0.5 * (args.lr - floor) * (1 + math.cos(math.pi * min(progress, 1.0)))


def write_checkpoint(model, args, n_params):
    """Saves the bf16 weights and the tokenizer files; returns nothing, raises on error."""
    model.to(torch.bfloat16).save_pretrained(args.out)
    cfg_path = os.path.join(args.out, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    # Older readers look for these two at the top level; newer transformers may nest the
    # rope base under rope_parameters and call the dtype "dtype".
    rope = cfg.get("rope_parameters") or {}
    cfg.setdefault("rope_theta", rope.get("rope_theta", args.rope_theta))
    cfg.setdefault("torch_dtype", "bfloat16")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")

    shutil.copy(os.path.join(args.tokenizer_dir, "tokenizer.json"), args.out)
    with open(os.path.join(args.tokenizer_dir, "tokenizer_config.json")) as f:
        tcfg = json.load(f)
    tcfg["chat_template"] = CHAT_TEMPLATE
    tcfg["model_max_length"] = args.ctx
    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
        json.dump(tcfg, f, indent=2)
        f.write("\n")
    log(f"saved {n_params} parameters to {args.out}: {sorted(os.listdir(args.out))}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="folder with train.txt and heldout.txt")
    ap.add_argument("--tokenizer-dir", required=True, help="tokenizer.json + tokenizer_config.json")
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=6.0, help="wall-time box for training")
    ap.add_argument("--epochs", type=float, default=10.0, help="token budget in passes")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--chat-frac", type=float, default=0.15, help="documents cut into chat turns")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()

    global LOG
    os.makedirs(args.out, exist_ok=True)
    LOG = open(os.path.join(args.out, "TRAINING_LOG.txt"), "w")
    log("args:", json.dumps(vars(args), sort_keys=True))
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch.device("cuda")
    log(f"torch {torch.__version__}, device {torch.cuda.get_device_name(0)}")
    torch.backends.cuda.matmul.allow_tf32 = True

    tok = Tokenizer.from_file(os.path.join(args.tokenizer_dir, "tokenizer.json"))
    with open(os.path.join(args.data, "train.txt"), encoding="utf-8") as f:
        docs = [line.strip() for line in f if line.strip()]
    with open(os.path.join(args.data, "heldout.txt"), encoding="utf-8") as f:
        heldout_text = f.read()
    t0 = time.time()
    stream = build_stream(tok, docs, args.chat_frac, random.Random(args.seed))
    held_ids = tok.encode(heldout_text, add_special_tokens=True).ids
    if held_ids[0] != BOS_ID:
        raise SystemExit("train: tokenizer.json: the post-processor did not add <s>")
    log(f"heldout: {len(held_ids)} tokens; tokenized in {time.time() - t0:.1f}s")
    data = torch.tensor(stream, dtype=torch.long, device=device)

    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=args.hidden,
        intermediate_size=args.ffn,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.ctx,
        rms_norm_eps=1e-5,
        rope_theta=args.rope_theta,
        tie_word_embeddings=True,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        hidden_act="silu",
        initializer_range=0.02,
    )
    model = LlamaForCausalLM(config).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params} parameters (embedding tied), config {config.to_json_string()}")
    add_dropout(model, args.dropout)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": args.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=args.lr,
        betas=(0.9, 0.95),
        fused=True,
    )

    tokens_per_step = args.batch * args.ctx
    total_steps = max(1, int(args.epochs * len(stream) / tokens_per_step))
    budget_s = args.minutes * 60
    log(f"plan: {total_steps} steps of {tokens_per_step} tokens, or {args.minutes} min")
    offsets = torch.arange(args.ctx + 1, device=device)
    best = (float("inf"), -1, None)
    step, t_start, smooth = 0, time.time(), None
    while True:
        elapsed = time.time() - t_start
        progress = max(step / total_steps, elapsed / budget_s)
        if progress >= 1.0:
            break
        lr = lr_at(progress, step, args)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, len(stream) - args.ctx - 1, (args.batch, 1), device=device)
        window = data[starts + offsets]
        model.train()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=window[:, :-1]).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), window[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 10 == 0 or step == 1:
            li = loss.item()
            smooth = li if smooth is None else 0.9 * smooth + 0.1 * li
        if step % args.eval_every == 0:
            model.eval()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                vl, _ = heldout_nll(model, held_ids, args.ctx, device, second_half=False)
            el = time.time() - t_start
            log(
                f"step {step:5d} epoch {step * tokens_per_step / len(stream):5.2f} "
                f"lr {lr:.2e} train loss {smooth:.3f} val loss {vl:.3f} ppl {math.exp(vl):8.2f} "
                f"{step * tokens_per_step / el / 1e3:.0f}k tok/s {el:.0f}s"
            )
            if vl < best[0]:
                best = (vl, step, copy.deepcopy(model.state_dict()))
    model.eval()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        vl, _ = heldout_nll(model, held_ids, args.ctx, device, second_half=False)
    log(f"final step {step}: train loss {smooth:.3f} val loss {vl:.3f} ppl {math.exp(vl):.2f}")
    if vl < best[0]:
        best = (vl, step, None)
    else:
        model.load_state_dict(best[2])
    tokens_seen = step * tokens_per_step
    log(
        f"trained {step} steps, {tokens_seen} tokens ({tokens_seen / len(stream):.2f} epochs of "
        f"{len(stream)}) in {time.time() - t_start:.0f}s; kept step {best[1]} "
        f"(val loss {best[0]:.3f}, ppl {math.exp(best[0]):.2f})"
    )

    write_checkpoint(model, args, n_params)

    for dtype in (torch.bfloat16, torch.float32):
        saved = LlamaForCausalLM.from_pretrained(args.out, dtype=dtype).to(device).eval()
        for half in (True, False):
            nll, cnt = heldout_nll(saved, held_ids, args.ctx, device, second_half=half)
            log(
                f"saved model, {str(dtype).replace('torch.', '')} compute, -c {args.ctx}, "
                f"{'second half' if half else 'all positions'}: {len(held_ids) // args.ctx} "
                f"windows, {cnt} predictions, nll {nll:.4f}, PPL {math.exp(nll):.3f}"
            )

    env = jinja2.Environment()
    rendered = env.from_string(CHAT_TEMPLATE).render(
        messages=[{"role": "user", "content": "Who was the king?"}], bos_token="<s>", eos_token="</s>"
    )
    if rendered != render_chat([{"role": "user", "content": "Who was the king?"}]):
        raise SystemExit(f"train: chat template renders {rendered!r}, training used another form")

    gen = torch.Generator(device=device).manual_seed(args.seed)
    prompts = ["Once upon a time", "The king said", "In the beginning", "The president of the"]
    for p in prompts:
        for temp in (0.0, 0.8):
            text = sample(saved, tok, p, 60, device, temp, 40, gen, args.ctx, True)
            log(f"sample [{'greedy' if temp == 0 else 'temp 0.8 top-k 40'}] {p + text!r}")
    for q in ["Tell me about the king.", "What did the jury say about the election?"]:
        chat = render_chat([{"role": "user", "content": q}])
        for temp in (0.0, 0.8):
            text = sample(saved, tok, chat, 80, device, temp, 40, gen, args.ctx, False)
            log(f"chat [{'greedy' if temp == 0 else 'temp 0.8 top-k 40'}] {q!r} -> {text!r}")
    LOG.close()


if __name__ == "__main__":
    main()
