#!/usr/bin/env python3
"""The table of bench/run_cpu.sh from the rows it collected (results.jsonl): the machine, the
commit, the shape, each engine's best pp128 / tg32 over the rounds and their ratio, decode's
weight bytes a second against the read bandwidth measured in the same run (the ceiling that
mlxcel bench measures and prints in its rows), and every round's figures.

    /usr/bin/python3 bench/cpu_table.py RESULTS.jsonl BF16_MODEL_DIR THREADS REPS
"""

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_gguf  # noqa: E402

FLAGS = ("avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16")


def cpu():
    model, flags = "unknown", []
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                have = set(value.split())
                flags = [x for x in FLAGS if x in have]
                break
    return model, flags


def commit():
    def git(*args):
        return subprocess.run(["git", *args], capture_output=True, text=True).stdout.strip()

    dirty = git("status", "--porcelain", "--untracked-files=no")
    return git("rev-parse", "--short=12", "HEAD") + (" (tree modified)" if dirty else "")


def gguf_tensor_bytes(bf16_dir, kind):
    _, tensors = make_gguf.plan(bf16_dir, kind)
    total = 0
    for _, dims, k, _ in tensors:
        total += make_gguf.nbytes(dims[1] if len(dims) > 1 else 1, dims[0], k)
    return total


def main():
    if len(sys.argv) != 5:
        sys.exit("usage: cpu_table.py RESULTS.jsonl BF16_MODEL_DIR THREADS REPS")
    path, bf16_dir, threads, reps = sys.argv[1:]
    rows, loads = [], []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            (loads.append(r["load"]) if "load" in r else rows.append(r))
    rounds = sorted({r["round"] for r in rows})
    bw = {}
    for r in rows:
        if r["engine"] == "mlxcel" and r["row"].get("ceiling") == "read":
            bw[r["round"]] = max(bw.get(r["round"], 0), r["row"]["ceiling_gb_per_s"])
    best_bw = max(bw.values())
    peer = next(r["row"] for r in rows if r["engine"] == "llama.cpp")

    def figure(engine, bits, test, rnd=None):
        got = [r["row"] for r in rows if r["engine"] == engine and r["bits"] == bits
               and r["row"]["test"] == test and (rnd is None or r["round"] == rnd)]
        return max(got, key=lambda x: x["tok_per_s"]) if got else None

    with open(os.path.join(bf16_dir, "config.json")) as f:
        c = json.load(f)
    model, flags = cpu()
    print(f"device: {model}, {os.cpu_count()} cores, {' '.join(flags)}; the machine is shared "
          f"with other users: 1-minute load average {min(loads):.2f} to {max(loads):.2f} "
          f"during the run")
    print(f"commit: {commit()}; {threads} threads; best of {reps} runs a turn, "
          f"{len(rounds)} rounds of turns")
    print(f"llama.cpp: {peer['llama_cpp']} (node-llama-cpp {peer['node_llama_cpp']} prebuilt), "
          f"ggml-cpu-{peer['ggml_cpu']}, flash attention {peer['flash_attention']}; "
          f"CPU: {peer['features']}")
    print(f"shape: random Llama-3.2-1B: hidden {c['hidden_size']}, {c['num_hidden_layers']} "
          f"layers, {c['num_attention_heads']} / {c['num_key_value_heads']} heads of "
          f"{c['head_dim']}, ffn {c['intermediate_size']}, vocab {c['vocab_size']}, tied "
          f"embedding; mlxcel MLX affine group 64 with bf16 scales and biases, llama.cpp "
          f"Q4_0 / Q8_0 (every matrix, the embedding too; norms F32), both from the same bf16 "
          f"weights")
    print(f"read bandwidth (mlxcel bench's ceiling, {threads} threads, 512 MiB, best of 5 "
          f"passes before each mlxcel turn; a round's best): "
          f"{' / '.join(f'{bw[r]:.1f}' for r in rounds)} GB/s, best {best_bw:.1f}\n")

    print("| weights | test | mlxcel tok/s | llama.cpp tok/s | ratio | mlxcel weights GB/s "
          "(of read bw) | llama.cpp weights GB/s (of read bw) |")
    print("|---|---|---|---|---|---|---|")
    for bits in (4, 8):
        step = gguf_tensor_bytes(bf16_dir, f"q{bits}_0")
        for test in ("pp128", "tg32"):
            m, p = figure("mlxcel", bits, test), figure("llama.cpp", bits, test)
            if m is None or p is None:
                continue
            cells = [f"{bits}-bit / Q{bits}_0", test, f"{m['tok_per_s']:.1f}",
                     f"{p['tok_per_s']:.1f}", f"{m['tok_per_s'] / p['tok_per_s']:.2f}x"]
            if test.startswith("tg"):
                mg = m["weight_gb_per_s"]
                pg = p["tok_per_s"] * step / 1e9
                cells += [f"{mg:.1f} ({100 * mg / best_bw:.0f}%)",
                          f"{pg:.1f} ({100 * pg / best_bw:.0f}%)"]
            else:
                cells += ["", ""]
            print("| " + " | ".join(cells) + " |")

    print("\nEvery round, tok/s, mlxcel / llama.cpp:\n")
    print("| round | read GB/s | 4-bit pp128 | 4-bit tg32 | 8-bit pp128 | 8-bit tg32 |")
    print("|---|---|---|---|---|---|")
    for rnd in rounds:
        cells = [str(rnd), f"{bw[rnd]:.1f}"]
        for bits in (4, 8):
            for test in ("pp128", "tg32"):
                m, p = figure("mlxcel", bits, test, rnd), figure("llama.cpp", bits, test, rnd)
                cells.append(" / ".join(f"{x['tok_per_s']:.1f}" if x else "-" for x in (m, p)))
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
