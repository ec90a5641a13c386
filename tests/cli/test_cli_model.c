/* The model commands through the binary: `logits` writes transformers' logits, `generate
 * --json` ends with transformers' greedy tokens, and bad input gets one "mlxcel: error:" line
 * with exit status 2 (usage) or 1 (everything else). */
#include "test.h"

#include "io/io.h"

#include <jansson.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Runs `mlxcel <args>`; returns its exit status, stdout in out and stderr in err_out. */
static int run(const char *args, char *out, size_t size, char *err_out, size_t err_size) {
    char cmd[8192], err_path[64];
    snprintf(err_path, sizeof err_path, "/tmp/mlxcel-cli-stderr-%d", (int)getpid());
    snprintf(cmd, sizeof cmd, "%s/mlxcel %s 2>%s", getenv("MLXCEL_BIN_DIR"), args, err_path);
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(out, 1, size - 1, p) : 0;
    out[n] = 0;
    int status = p ? pclose(p) : -1;
    FILE *e = fopen(err_path, "r");
    n = e ? fread(err_out, 1, err_size - 1, e) : 0;
    err_out[n] = 0;
    if (e) fclose(e);
    remove(err_path);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static char *ids_text(json_t *arr) {
    size_t cap = json_array_size(arr) * 12 + 1, n = 0;
    char *s = malloc(cap);
    s[0] = 0;
    for (size_t i = 0; i < json_array_size(arr); i++)
        n += (size_t)snprintf(s + n, cap - n, i ? ",%lld" : "%lld",
                              (long long)json_integer_value(json_array_get(arr, i)));
    return s;
}

/* The last line of text. */
static const char *last_line(char *text) {
    size_t n = strlen(text);
    while (n && text[n - 1] == '\n') text[--n] = 0;
    char *nl = strrchr(text, '\n');
    return nl ? nl + 1 : text;
}

/* A BF16 tensor [d0] (d1 0) or [d0, d1] in a safetensors header, its data after *end. */
static void add_bf16(json_t *header, uint64_t *end, const char *name, int64_t d0, int64_t d1) {
    uint64_t bytes = (uint64_t)d0 * (uint64_t)(d1 ? d1 : 1) * 2;
    json_t *shape =
        d1 ? json_pack("[I, I]", (json_int_t)d0, (json_int_t)d1) : json_pack("[I]", (json_int_t)d0);
    json_object_set_new(header, name,
                        json_pack("{s:s, s:o, s:[I, I]}", "dtype", "BF16", "shape", shape,
                                  "data_offsets", (json_int_t)*end, (json_int_t)(*end + bytes)));
    *end += bytes;
}

/* Writes path as a Gemma-3-4B-shaped BF16 checkpoint (tied embeddings) whose data is a hole of
 * a sparse file: inspect reads the header alone, so the 8 GB cost no disk. Returns the weight
 * bytes a decode step reads, counted here from the shapes: every matrix, the table again as
 * the head and one row of it, and the norms as F32 (Gemma's 1 + w is formed at load). */
static uint64_t write_gemma3_4b_headers(const char *path) {
    enum { HIDDEN = 2560, INTER = 10240, LAYERS = 34, Q = 8 * 256, KV = 4 * 256, HD = 256 };
    static const char *const norms[] = {"input_layernorm.weight", "post_attention_layernorm.weight",
                                        "pre_feedforward_layernorm.weight",
                                        "post_feedforward_layernorm.weight"};
    json_t *h = json_object();
    uint64_t end = 0;
    char name[128];
    add_bf16(h, &end, "model.embed_tokens.weight", 262208, HIDDEN);
    add_bf16(h, &end, "model.norm.weight", HIDDEN, 0);
    for (int l = 0; l < LAYERS; l++) {
#define T(suffix, d0, d1)                                                                          \
    (snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix), add_bf16(h, &end, name, d0, d1))
        T("self_attn.q_proj.weight", Q, HIDDEN);
        T("self_attn.k_proj.weight", KV, HIDDEN);
        T("self_attn.v_proj.weight", KV, HIDDEN);
        T("self_attn.o_proj.weight", HIDDEN, Q);
        T("self_attn.q_norm.weight", HD, 0);
        T("self_attn.k_norm.weight", HD, 0);
        T("mlp.gate_proj.weight", INTER, HIDDEN);
        T("mlp.up_proj.weight", INTER, HIDDEN);
        T("mlp.down_proj.weight", HIDDEN, INTER);
        for (int i = 0; i < 4; i++) T(norms[i], HIDDEN, 0);
#undef T
    }
    /* "{...}" padded with spaces to 8 bytes, as writers align the data */
    char *text = json_dumps(h, JSON_COMPACT);
    size_t len = strlen(text), padded = (len + 7) / 8 * 8;
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f) {
        uint64_t n = padded;
        unsigned char le[8];
        for (int i = 0; i < 8; i++) le[i] = (unsigned char)(n >> (8 * i));
        CHECK(fwrite(le, 1, 8, f) == 8 && fwrite(text, 1, len, f) == len);
        for (size_t i = len; i < padded; i++) fputc(' ', f);
        CHECK(fflush(f) == 0 && ftruncate(fileno(f), (off_t)(8 + padded + end)) == 0);
        fclose(f);
    }
    free(text);
    json_decref(h);
    uint64_t layer =
        2ull * ((uint64_t)(Q + 2 * KV) * HIDDEN + (uint64_t)HIDDEN * Q + 3ull * INTER * HIDDEN) +
        4ull * (4 * HIDDEN + 2 * HD);
    return 2ull * 262208 * HIDDEN + 2ull * HIDDEN + 4ull * HIDDEN + LAYERS * layer;
}

/* inspect on a Gemma-3-4B-shaped config (34 layers, 5 of them global, a 1024-token window,
 * 4 kv heads of 256) and a header-only checkpoint of that shape: local and global layers are
 * counted apart, the local group holds each sequence's window and prefill step (CPU: 512
 * tokens), the rest of the budget buys global blocks, and the decode bytes are the shapes'. */
static void inspect_windowed(void) {
    char dir[256], path[512], args[2048], out[65536], err[4096];
    snprintf(dir, sizeof dir, "/tmp/mlxcel-inspect-gemma3-%d", (int)getpid());
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs("{\"architectures\": [\"Gemma3ForCausalLM\"], \"model_type\": \"gemma3_text\", "
          "\"hidden_size\": 2560, \"intermediate_size\": 10240, \"num_hidden_layers\": 34, "
          "\"num_attention_heads\": 8, \"num_key_value_heads\": 4, \"head_dim\": 256, "
          "\"sliding_window\": 1024, \"sliding_window_pattern\": 6, "
          "\"max_position_embeddings\": 131072, \"vocab_size\": 262208, "
          "\"query_pre_attn_scalar\": 256, \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000.0, "
          "\"rope_local_base_freq\": 10000.0, \"rope_scaling\": {\"factor\": 8.0, "
          "\"rope_type\": \"linear\"}, \"hidden_activation\": \"gelu_pytorch_tanh\", "
          "\"tie_word_embeddings\": true}\n",
          f);
    fclose(f);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unsigned long long decode = write_gemma3_4b_headers(path);
    const unsigned long long budget = 24ull << 30;
    for (int np = 1; np <= 4; np += 3) {
        snprintf(args, sizeof args,
                 "inspect -m %s -c 131072 -np %d --kv-cache-budget 24Gi --kv-dtype bf16 --json "
                 "--device cpu",
                 dir, np);
        CHECK_MSG(run(args, out, sizeof out, err, sizeof err) == 0, "inspect: %s", err);
        json_t *o = json_loads(out, 0, NULL), *l = json_object_get(o, "kv_local");
        CHECK_MSG(o && l, "inspect --json: %s", out);
        if (!o || !l) {
            json_decref(o);
            break;
        }
#define GET(obj, key) json_integer_value(json_object_get(obj, key))
        long long reserve = GET(o, "decode_workspace_reserve_bytes"), blocks = GET(o, "kv_blocks");
        long long gbpb = GET(l, "global_bytes_per_block"), lbpb = GET(l, "local_bytes_per_block");
        long long local = GET(l, "local_blocks"), per_seq = GET(l, "local_blocks_per_seq");
        long long fit = GET(o, "context_fits_per_seq");
        long long full = GET(o, "context_fits_per_seq_full_attention");
        /* K and V, 32 tokens, 4 heads of 256, bf16: 5 global layers, 29 local */
        CHECK(GET(o, "kv_local_layers") == 29 && GET(l, "window") == 1024);
        CHECK(gbpb == 5ll * 2 * 32 * 4 * 256 * 2 && lbpb == 29ll * 2 * 32 * 4 * 256 * 2);
        /* the 1023 tokens before a 512-token step and the step: 48 blocks, one more for where
         * the span starts in its block, one spare for copy-on-write */
        CHECK_MSG(per_seq == 50 && local == 50ll * np, "local blocks %lld (%lld a sequence)", local,
                  per_seq);
        CHECK(blocks == (long long)((budget - (unsigned long long)reserve -
                                     (unsigned long long)(local * lbpb)) /
                                    (unsigned long long)gbpb));
        CHECK(fit == blocks * 32 / np);
        CHECK(full == (long long)((budget - (unsigned long long)reserve) /
                                  (unsigned long long)(gbpb + lbpb)) *
                          32 / np);
        printf("  gemma3-4b shape, 24 GiB bf16, -np %d: %lld tokens fit per sequence with "
               "window-bounded local layers, %lld with every layer keeping the whole context\n",
               np, fit, full);
        CHECK(fit > 6 * full);
        CHECK_MSG(GET(o, "decode_read_bytes") == (long long)decode &&
                      GET(o, "decode_read_bytes_all_experts") == (long long)decode,
                  "decode bytes %lld, want %llu", GET(o, "decode_read_bytes"), decode);
#undef GET
        json_decref(o);
    }
    snprintf(args, sizeof args,
             "inspect -m %s -c 131072 --kv-cache-budget 24Gi --kv-dtype bf16 --device cpu", dir);
    CHECK_MSG(run(args, out, sizeof out, err, sizeof err) == 0 &&
                  strstr(out, "29 local keeping a 1024-token window") &&
                  strstr(out, "with window-bounded local layers"),
              "inspect: %s %s", out, err);
    remove(path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    remove(path);
    rmdir(dir);
    /* every layer local (Phi-3 with a window): the budget bounds no context */
    snprintf(args, sizeof args,
             "inspect -m %s/tests/fixtures/phi3_window_q4_g64 -c 4096 --kv-cache-budget 64Mi "
             "--json --device cpu",
             test_source_dir());
    CHECK_MSG(run(args, out, sizeof out, err, sizeof err) == 0, "inspect phi3: %s", err);
    json_t *o = json_loads(out, 0, NULL);
    CHECK_MSG(o && json_is_null(json_object_get(o, "context_fits_per_seq")) &&
                  json_integer_value(json_object_get(o, "kv_local_layers")) > 0,
              "inspect phi3: %s", out);
    json_decref(o);
}

/* inspect's decode bytes, from the headers alone, are bench's "read per decode step" from the
 * loaded model; a mixture of experts (2 of 4 routed) shows the all-experts figure beside it. */
static void inspect_decode_bytes(void) {
    static const char *const models[] = {"models/demo", "tests/fixtures/qwen3_moe_q4_g64",
                                         "tests/fixtures/gpt_oss_mxfp4_q8"};
    char args[2048], out[65536], err[4096];
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        bool moe = strstr(models[i], "moe") || strstr(models[i], "gpt_oss");
        snprintf(args, sizeof args, "inspect -m %s/%s --json --device cpu", test_source_dir(),
                 models[i]);
        CHECK_MSG(run(args, out, sizeof out, err, sizeof err) == 0, "inspect: %s", err);
        json_t *o = json_loads(out, 0, NULL);
        long long routed = json_integer_value(json_object_get(o, "decode_read_bytes"));
        long long all = json_integer_value(json_object_get(o, "decode_read_bytes_all_experts"));
        json_decref(o);
        snprintf(args, sizeof args, "bench -m %s/%s -p 0 -n 1 -b 1 -r 1 -t 1 --device cpu",
                 test_source_dir(), models[i]);
        unsigned long long step = 0;
        const char *hdr =
            run(args, out, sizeof out, err, sizeof err) == 0 ? strstr(out, "bytes, ") : NULL;
        CHECK_MSG(hdr && sscanf(hdr, "bytes, %llu read per decode step", &step) == 1,
                  "bench header: %s %s", out, err);
        CHECK_MSG(routed > 0 && (unsigned long long)routed == step &&
                      (moe ? all > routed : all == routed),
                  "%s: inspect reads %lld (%lld every expert), bench %llu", models[i], routed, all,
                  step);
        snprintf(args, sizeof args, "inspect -m %s/%s --device cpu", test_source_dir(), models[i]);
        char want[128];
        if (moe)
            snprintf(want, sizeof want,
                     "decode reads     %lld bytes a step per sequence (routed experts: 2 of 4), "
                     "%lld with every expert\n",
                     routed, all);
        else
            snprintf(want, sizeof want, "decode reads     %lld bytes a step per sequence\n",
                     routed);
        CHECK_MSG(run(args, out, sizeof out, err, sizeof err) == 0 && strstr(out, want),
                  "inspect %s: %s, want '%s'", models[i], out, want);
        printf("  %s: inspect and bench read %lld bytes a decode step (%lld every expert)\n",
               models[i], routed, all);
    }
}

/* bench on the CPU: decode's ceiling is the read bandwidth, which the header names and each
 * row's share (of bw) is taken against, in the table and in the --json rows alike. */
static void bench_read_ceiling(void) {
    static const char fmt[] = "bench -m %s/models/demo -p 0 -n 4 -b 1,2 -r 1 -t 2 --device cpu%s";
    char args[2048], out[65536], err[4096];
    snprintf(args, sizeof args, fmt, test_source_dir(), "");
    CHECK_MSG(run(args, out, sizeof out, err, sizeof err) == 0, "bench: %s", err);
    const char *hdr = strstr(out, "; read bandwidth ");
    double bw = 0, gb = 0, pct = 0;
    CHECK_MSG(hdr && sscanf(hdr, "; read bandwidth %lf GB/s (read only", &bw) == 1 && bw > 0,
              "bench header: %s", out);
    /* the first decode row: | model | dev | threads | tg4 | 1 | tok/s | GB/s | share% | */
    const char *row = strstr(out, "| tg4 ");
    CHECK_MSG(row && sscanf(row, "| tg4 | %*d | %*f | %lf | %lf%%", &gb, &pct) == 2,
              "bench row: %s", out);
    /* the share printed to 0.1 from figures printed to 0.01 */
    CHECK_MSG(fabs(pct - 100.0 * gb / bw) < 0.06 + 100.0 * 0.01 * (gb + bw) / (bw * bw),
              "of bw %.1f%%, GB/s %.2f over the read bandwidth %.2f", pct, gb, bw);
    snprintf(args, sizeof args, fmt, test_source_dir(), " --json");
    CHECK_MSG(run(args, out, sizeof out, err, sizeof err) == 0, "bench --json: %s", err);
    int rows = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n"), rows++) {
        json_t *o = json_loads(line, 0, NULL);
        const char *name = json_string_value(json_object_get(o, "ceiling"));
        double c = json_real_value(json_object_get(o, "ceiling_gb_per_s"));
        double share = json_real_value(json_object_get(o, "ceiling_share"));
        double read = json_real_value(json_object_get(o, "weight_gb_per_s")) +
                      json_real_value(json_object_get(o, "kv_gb_per_s"));
        CHECK_MSG(name && !strcmp(name, "read") && c > 0 && share > 0 &&
                      fabs(share - read / c) < 1e-9 * share,
                  "row %s: share %g, want %g / %g", line, share, read, c);
        json_decref(o);
    }
    CHECK_MSG(rows == 2, "%d rows", rows);
}

int main(void) {
    char fx[1024], args[8192], out[65536], err[4096];
    snprintf(fx, sizeof fx, "%s/tests/fixtures/llama_q4_g64", test_source_dir());
    char *ref_path = base_path_join(fx, "reference.json");
    json_t *ref = json_load_file(ref_path, 0, NULL);
    free(ref_path);
    CHECK(ref != NULL);
    if (!ref) TEST_MAIN_END();
    char *prompt = ids_text(json_object_get(ref, "tokens"));
    char *greedy = ids_text(json_object_get(ref, "greedy"));
    int n_greedy = (int)json_array_size(json_object_get(ref, "greedy"));

    /* logits of every position against transformers' */
    snprintf(args, sizeof args, "logits -m %s --tokens %s -o /tmp/mlxcel-cli-logits.npy -t 2", fx,
             prompt);
    CHECK_MSG(run(args, out, sizeof out, err, sizeof err) == 0, "logits: %s", err);
    float *got = NULL, *want = NULL;
    int64_t gs[8], ws[8];
    int gd = 0, wd = 0;
    base_err e;
    char *want_path = base_path_join(fx, "logits.npy");
    CHECK(io_npy_read_f32("/tmp/mlxcel-cli-logits.npy", &got, gs, &gd, &e) == 0);
    CHECK(io_npy_read_f32(want_path, &want, ws, &wd, &e) == 0);
    free(want_path);
    if (got && want) {
        CHECK(gd == 2 && wd == 2 && gs[0] == ws[0] && gs[1] == ws[1]);
        double rel = test_rel_err(got, want, (size_t)(ws[0] * ws[1]));
        printf("  logits: %lld x %lld, relative error %.2e\n", (long long)ws[0], (long long)ws[1],
               rel);
        CHECK(rel < 1e-3);
    }
    free(got);
    free(want);

    /* greedy generation: the last stdout line is one JSON object whose tokens are transformers' */
    snprintf(args, sizeof args, "generate -m %s --tokens %s -n %d --temp 0 --json -t 2", fx, prompt,
             n_greedy);
    CHECK_MSG(run(args, out, sizeof out, err, sizeof err) == 0, "generate: %s", err);
    json_t *res = json_loads(last_line(out), 0, NULL);
    CHECK_MSG(res != NULL, "generate --json: last line is not JSON: %s", out);
    if (res) {
        char *toks = ids_text(json_object_get(res, "tokens"));
        CHECK_MSG(strcmp(toks, greedy) == 0, "generate: %s, want %s", toks, greedy);
        free(toks);
        json_decref(res);
    }

    /* usage errors: exit 2, one line naming the flag */
    static const struct {
        const char *args, *needle;
        int status;
    } bad[] = {
        {"generate --tokens 1,2", "-m", 2},
        {"generate -m . --tokens 1,x", "--tokens", 2},
        {"generate -m . --tokens 1 --temp abc", "--temp", 2},
        {"generate -m . --tokens 1 --bogus", "--bogus", 2},
        {"logits -m . --tokens 1", "-o", 2},
        {"frobnicate", "frobnicate", 2},
        {"generate -m /nonexistent/model --tokens 1", "/nonexistent/model", 1},
        {"logits -m FIXTURE --tokens 1,99999 -o /tmp/mlxcel-cli-x.npy", "99999", 1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char a[2048];
        const char *fixture = strstr(bad[i].args, "FIXTURE");
        if (fixture)
            snprintf(a, sizeof a, "%.*s%s%s", (int)(fixture - bad[i].args), bad[i].args, fx,
                     fixture + 7);
        else
            snprintf(a, sizeof a, "%s", bad[i].args);
        int status = run(a, out, sizeof out, err, sizeof err);
        bool one_line = strncmp(err, "mlxcel: error: ", 15) == 0 && strchr(err, '\n') &&
                        strchr(err, '\n')[1] == 0;
        CHECK_MSG(status == bad[i].status && one_line && strstr(err, bad[i].needle),
                  "mlxcel %s: status %d, stderr '%s'", a, status, err);
    }
    /* inspect: the budget buys floor((budget - reserve) / bytes per block) blocks */
    snprintf(
        args, sizeof args,
        "inspect -m %s/models/demo -c 512 -np 2 --kv-cache-budget 10000000 --json --device cpu",
        test_source_dir());
    CHECK_MSG(run(args, out, sizeof out, err, sizeof err) == 0, "inspect: %s", err);
    json_t *plan = json_loads(out, 0, NULL);
    CHECK_MSG(plan != NULL, "inspect --json: %s", out);
    if (plan) {
        static const char *keys[] = {"weights_bytes", "kv_block_size", "kv_bytes_per_block",
                                     "decode_workspace_reserve_bytes", "kv_blocks"};
        for (size_t i = 0; i < 5; i++) CHECK_MSG(json_object_get(plan, keys[i]), "%s", keys[i]);
        long long bpb = json_integer_value(json_object_get(plan, "kv_bytes_per_block"));
        long long reserve =
            json_integer_value(json_object_get(plan, "decode_workspace_reserve_bytes"));
        long long blocks = json_integer_value(json_object_get(plan, "kv_blocks"));
        CHECK(bpb > 0 && blocks == (10000000 - reserve) / bpb);
        json_decref(plan);
    }
    /* bench -d: each sequence's prompt goes into its cache before the timed steps. A budget of
     * one 300-token context (11 blocks of 32) holds four sequences of 5 tokens, not of 205. */
    for (int depth = 0; depth <= 200; depth += 200) {
        snprintf(args, sizeof args,
                 "bench -m %s/models/demo -p 0 -n 4 -d %d -c 300 -b 4 --kv-cache-budget 2200000 "
                 "-r 1 --json --device cpu",
                 test_source_dir(), depth);
        int status = run(args, out, sizeof out, err, sizeof err);
        if (depth == 0) {
            json_t *row = json_loads(out, 0, NULL);
            CHECK_MSG(status == 0 && row &&
                          !strcmp(json_string_value(json_object_get(row, "test")), "tg4"),
                      "bench -d 0: %d %s %s", status, out, err);
            json_decref(row);
        } else {
            CHECK_MSG(status == 1 && strstr(err, "kv cache full"), "bench -d 200: %d %s", status,
                      err);
        }
    }
    snprintf(args, sizeof args,
             "bench -m %s/models/demo -p 0 -n 4 -d 100 -b 2 -r 1 --json --device cpu",
             test_source_dir());
    CHECK_MSG(run(args, out, sizeof out, err, sizeof err) == 0 && strstr(out, "\"tg4@d100\"") &&
                  strstr(out, "\"n_depth\":100"),
              "bench -d 100: %s %s", out, err);
    /* bytes read: the weights once a step, K and V of both sequences at each timed step's
     * context (100 + 1 + i for i = 1..4, a mean of 103.5), in the header's units */
    json_t *row = json_loads(out, 0, NULL);
    snprintf(args, sizeof args, "bench -m %s/models/demo -p 0 -n 1 -r 1 --device cpu",
             test_source_dir());
    unsigned long long step = 0, per_tok = 0;
    const char *hdr =
        run(args, out, sizeof out, err, sizeof err) == 0 ? strstr(out, "bytes, ") : NULL;
    CHECK_MSG(hdr &&
                  sscanf(hdr, "bytes, %llu read per decode step, plus %llu", &step, &per_tok) == 2,
              "bench header: %s", out);
    double w = json_real_value(json_object_get(row, "weight_gb_per_s"));
    double kv = json_real_value(json_object_get(row, "kv_gb_per_s"));
    double kv_want = 2.0 * (double)per_tok * 103.5 / (double)step;
    CHECK_MSG(w > 0 && per_tok > 0 && fabs(kv / w - kv_want) < 1e-9 * kv_want,
              "kv/weights %g, want %g", kv / w, kv_want);
    json_decref(row);
    snprintf(args, sizeof args, "bench -m %s/models/demo -p 0 -n 8 -d 32 -c 40", test_source_dir());
    CHECK_MSG(run(args, out, sizeof out, err, sizeof err) == 2 && strstr(err, "-d 32") &&
                  strstr(err, "-c is 40"),
              "bench -d past -c: %s", err);
    /* a budget that cannot hold one full-context sequence is refused, naming both numbers */
    snprintf(args, sizeof args, "inspect -m %s/models/demo -c 512 --kv-cache-budget 1000",
             test_source_dir());
    CHECK_MSG(run(args, out, sizeof out, err, sizeof err) == 1 && strstr(err, "1000 bytes") &&
                  strstr(err, "needs"),
              "inspect small budget: %s", err);

    inspect_windowed();
    inspect_decode_bytes();
    bench_read_ceiling();

    free(prompt);
    free(greedy);
    json_decref(ref);
    TEST_MAIN_END();
}
