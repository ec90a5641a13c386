/* Safetensors: round trips through the writer, then one broken file per loader rule, each
 * checked for a failure whose message names the file and the tensor. */
#include "io/io_test_util.h"
#include "test_file.h"

#include <fcntl.h>
#include <jansson.h>

static char g_dir[64];
static volatile unsigned g_sink;

static char *path_in(const char *name) {
    return base_path_join(g_dir, name);
}

/* Opening path must fail with every one of the given substrings in the message. */
static void expect_fail(const char *path, const char *s1, const char *s2, int line) {
    io_checkpoint *ck = (io_checkpoint *)1;
    base_err err = {{0}};
    int rc = io_checkpoint_open_file(path, &ck, &err);
    CHECK_MSG(rc == -1 && ck == NULL, "line %d: open of %s succeeded", line, path);
    CHECK_MSG(iot_has(&err, path), "line %d: message lacks the path: %s", line, err.msg);
    CHECK_MSG(!s1 || iot_has(&err, s1), "line %d: message lacks '%s': %s", line, s1, err.msg);
    CHECK_MSG(!s2 || iot_has(&err, s2), "line %d: message lacks '%s': %s", line, s2, err.msg);
}

static void broken(const char *header, size_t data_len, const char *s1, const char *s2, int line) {
    char *p = path_in("broken.safetensors");
    iot_write_st(p, header, data_len);
    expect_fail(p, s1, s2, line);
    free(p);
}

#define BROKEN(h, n, s1, s2) broken(h, n, s1, s2, __LINE__)

/* Every dtype, a 0-d scalar, an empty tensor and metadata survive a write and a read. */
static void test_round_trip(void) {
    enum { N = BASE_DTYPE_COUNT + 2 };
    io_tensor_out t[N];
    uint8_t bufs[N][6 * 8];
    char names[N][32];
    for (int i = 0; i < N; i++) {
        for (size_t b = 0; b < sizeof bufs[i]; b++) bufs[i][b] = (uint8_t)(i * 31 + b * 7 + 1);
        snprintf(names[i], sizeof names[i], "t%02d", i);
        t[i] = (io_tensor_out){.name = names[i], .ndim = 2, .shape = {2, 3}, .data = bufs[i]};
        t[i].dtype = (base_dtype)(i < BASE_DTYPE_COUNT ? i : BASE_DTYPE_F32);
    }
    t[N - 2].ndim = 0; /* scalar: one element */
    t[N - 1].shape[0] = 0;
    const char *meta[] = {"format", "mlx", "note", "x"};
    char *p = path_in("good.safetensors");
    base_err err = {{0}};
    CHECK_MSG(io_safetensors_write(p, t, N, meta, 2, &err) == 0, "%s", err.msg);

    /* The header follows the format independently of our reader: 8-byte aligned, padded with
     * spaces, offsets contiguous from 0 in the order written. */
    char *raw;
    size_t len;
    CHECK(base_read_file(p, &raw, &len, &err) == 0);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | (uint8_t)raw[i];
    CHECK(hl % 8 == 0 && hl + 8 <= len);
    json_t *root = json_loadb(raw + 8, hl, 0, NULL);
    CHECK(root != NULL);
    size_t pad = 0;
    while (pad < hl && raw[8 + hl - 1 - pad] == ' ') pad++;
    CHECK(pad < 8 && raw[8 + hl - 1 - pad] == '}');
    uint64_t off = 0;
    for (int i = 0; i < N; i++) {
        json_t *e = json_object_get(root, names[i]);
        size_t want = base_dtype_size(t[i].dtype) * (t[i].ndim == 0 ? 1 : t[i].shape[0] * 3);
        CHECK_MSG(e && (uint64_t)json_integer_value(
                           json_array_get(json_object_get(e, "data_offsets"), 0)) == off,
                  "%s begins at %llu", names[i], (unsigned long long)off);
        off += want;
        CHECK(json_integer_value(json_array_get(json_object_get(e, "data_offsets"), 1)) ==
              (json_int_t)off);
    }
    CHECK(len == 8 + hl + off);
    CHECK(
        strcmp(json_string_value(json_object_get(json_object_get(root, "__metadata__"), "format")),
               "mlx") == 0);
    json_decref(root);
    free(raw);

    io_checkpoint *ck;
    CHECK_MSG(io_checkpoint_open_file(p, &ck, &err) == 0, "%s", err.msg);
    if (!ck) return;
    CHECK(io_checkpoint_count(ck) == N);
    CHECK(io_checkpoint_bytes(ck) == off);
    CHECK(strcmp(io_checkpoint_metadata(ck, "format"), "mlx") == 0);
    CHECK(strcmp(io_checkpoint_metadata(ck, "note"), "x") == 0);
    CHECK(io_checkpoint_metadata(ck, "absent") == NULL);
    CHECK(io_checkpoint_find(ck, "absent") == NULL);
    CHECK(io_checkpoint_at(ck, N) == NULL);
    for (int i = 0; i < N; i++) {
        const io_tensor *r = io_checkpoint_find(ck, names[i]);
        CHECK_MSG(r != NULL, "%s missing", names[i]);
        if (!r) continue;
        CHECK(r == io_checkpoint_at(ck, (size_t)i));
        CHECK(strcmp(r->file, p) == 0);
        CHECK(r->dtype == t[i].dtype && r->ndim == t[i].ndim);
        for (int d = 0; d < r->ndim; d++) CHECK(r->shape[d] == t[i].shape[d]);
        size_t want = base_dtype_size(t[i].dtype) * (t[i].ndim == 0 ? 1 : t[i].shape[0] * 3);
        CHECK(r->nbytes == want);
        CHECK(want == 0 || memcmp(r->data, bufs[i], want) == 0);
    }
    io_checkpoint_close(ck);

    char *tmp = path_in("good.safetensors.tmp");
    CHECK(!base_file_exists(tmp));
    free(tmp);
    free(p);
}

/* A rejected write leaves an existing file untouched and no temporary behind. */
static void test_write_failures(void) {
    char *p = path_in("keep.safetensors");
    float v = 1.0f;
    io_tensor_out good = {
        .name = "a", .dtype = BASE_DTYPE_F32, .ndim = 1, .shape = {1}, .data = &v};
    base_err err = {{0}};
    CHECK(io_safetensors_write(p, &good, 1, NULL, 0, &err) == 0);
    io_tensor_out dup[2] = {good, good};
    CHECK(io_safetensors_write(p, dup, 2, NULL, 0, &err) == -1);
    CHECK(iot_has(&err, "'a'"));
    io_tensor_out neg = good;
    neg.shape[0] = -1;
    CHECK(io_safetensors_write(p, &neg, 1, NULL, 0, &err) == -1);
    io_checkpoint *ck;
    CHECK(io_checkpoint_open_file(p, &ck, &err) == 0);
    if (ck) {
        CHECK(io_checkpoint_count(ck) == 1);
        io_checkpoint_close(ck);
    }
    char *tmp = path_in("keep.safetensors.tmp");
    CHECK(!base_file_exists(tmp));
    /* the rename onto a directory fails after the data went out: no temporary may remain */
    char *blocked = path_in("blocked.safetensors"),
         *blocked_tmp = path_in("blocked.safetensors.tmp");
    mkdir(blocked, 0755);
    CHECK(io_safetensors_write(blocked, &good, 1, NULL, 0, &err) == -1);
    CHECK(iot_has(&err, blocked));
    CHECK(!base_file_exists(blocked_tmp));
    free(blocked);
    free(blocked_tmp);
    CHECK(io_safetensors_write("/nonexistent_dir_x/y.safetensors", &good, 1, NULL, 0, &err) == -1);
    CHECK(iot_has(&err, "/nonexistent_dir_x/y.safetensors"));
    free(tmp);
    free(p);
}

static void test_broken_files(void) {
    char *p = path_in("short.safetensors");
    iot_write_bytes(p, "\x05\0\0\0\0", 5);
    expect_fail(p, "truncated", NULL, __LINE__);

    iot_write_st_len(p, 1000, "{}", 0);
    expect_fail(p, "past the end", NULL, __LINE__);

    /* a length over the limit on a file large enough to hold it (sparse, so cheap) */
    uint64_t big = 150u * 1000u * 1000u;
    iot_write_st_len(p, big, "{}", 0);
    CHECK(truncate(p, (off_t)(8 + big)) == 0);
    expect_fail(p, "limit", NULL, __LINE__);
    free(p);

    BROKEN("{not json", 0, "not valid JSON", NULL);
    BROKEN("[1, 2]", 0, "must be a JSON object", NULL);
    BROKEN("{\"w\": 3}", 0, "'w'", "must be an object");
    BROKEN("{\"w\":{\"dtype\":\"F8_E4M3\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, "'w'",
           "F8_E4M3");
    BROKEN("{\"w\":{\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,2]}}", 2, "'w'", "dtype");
    BROKEN("{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "'w'",
           "shape x F32");
    BROKEN("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, "'w'",
           "past the data section");
    BROKEN("{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}", 8, "'w'",
           "begin 8 > end 4");
    BROKEN("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
           "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
           12, "overlaps", "'a'");
    BROKEN("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
           "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
           12, "'b'", NULL);
    BROKEN("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
           "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
           8, "duplicate", "'a'");
    /* the duplicate is found after unescaping: "a\u0062" is "ab" */
    BROKEN("{\"ab\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
           "\"a\\u0062\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
           8, "duplicate", "'ab'");
    BROKEN("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
           "duplicate", "'a'");
    BROKEN("{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,0]}}", 0, "'w'",
           "non-negative");
    BROKEN("{\"w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, "'w'",
           "shape[0]");
    BROKEN("{\"w\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,0]}}",
           0, "'w'", "overflows");
    BROKEN("{\"w\":{\"dtype\":\"F64\",\"shape\":[1152921504606846976,2],\"data_offsets\":[0,0]}}",
           0, "'w'", "overflows");
    BROKEN("{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
           "'w'", "9 dimensions");
    BROKEN("{\"w\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, "'w'", "data_offsets");
    BROKEN("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 1, "'w'",
           "data_offsets");
    BROKEN("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 1, "'w'",
           "data_offsets");
    BROKEN("{\"__metadata__\":{\"k\":1}}", 0, "__metadata__", "'k'");
    BROKEN("{\"__metadata__\":[]}", 0, "__metadata__", NULL);
}

/* An empty tensor may sit at the edge of another's span but not inside it. */
static void test_empty_spans(void) {
    char *p = path_in("edges.safetensors");
    iot_write_st(p,
                 "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]},"
                 "\"z\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[0,0]}}",
                 8);
    io_checkpoint *ck;
    base_err err = {{0}};
    CHECK_MSG(io_checkpoint_open_file(p, &ck, &err) == 0, "%s", err.msg);
    if (ck) {
        CHECK(io_checkpoint_count(ck) == 3);
        CHECK(io_checkpoint_find(ck, "e")->nbytes == 0);
        io_checkpoint_close(ck);
    }
    free(p);
    BROKEN("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
           "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}",
           8, "'e'", "overlaps");
}

/* Writes shard `name` in `dir` holding float tensors named in `names` (NULL-terminated). */
static void write_shard(const char *dir, const char *name, const char *const *names, float base) {
    io_tensor_out t[8];
    static float vals[8][4];
    size_t n = 0;
    for (; names[n]; n++) {
        for (int k = 0; k < 4; k++) vals[n][k] = base + (float)(n * 4 + k);
        t[n] = (io_tensor_out){
            .name = names[n], .dtype = BASE_DTYPE_F32, .ndim = 1, .shape = {4}, .data = vals[n]};
    }
    char *p = base_path_join(dir, name);
    base_err err = {{0}};
    if (io_safetensors_write(p, t, n, NULL, 0, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    free(p);
}

static char *fresh_subdir(const char *name) {
    char *d = path_in(name);
    mkdir(d, 0755);
    return d;
}

static void expect_dir_fail(const char *dir, const char *s1, const char *s2, int line) {
    io_checkpoint *ck = (io_checkpoint *)1;
    base_err err = {{0}};
    CHECK_MSG(io_checkpoint_open_dir(dir, &ck, &err) == -1 && ck == NULL,
              "line %d: open of %s succeeded", line, dir);
    CHECK_MSG(!s1 || iot_has(&err, s1), "line %d: message lacks '%s': %s", line, s1, err.msg);
    CHECK_MSG(!s2 || iot_has(&err, s2), "line %d: message lacks '%s': %s", line, s2, err.msg);
    io_checkpoint *headers = (io_checkpoint *)1;
    CHECK_MSG(io_checkpoint_open_headers(dir, &headers, &err) == -1 && headers == NULL,
              "line %d: header-only open succeeded", line);
}

static const char *const g_s1[] = {"a.w", "b.w", NULL};
static const char *const g_s2[] = {"c.w", NULL};

static const char g_index[] = "{\"metadata\":{\"total_size\":48},\"weight_map\":{"
                              "\"a.w\":\"model-00001-of-00002.safetensors\","
                              "\"b.w\":\"model-00001-of-00002.safetensors\","
                              "\"c.w\":\"model-00002-of-00002.safetensors\"}}";

static void test_sharded(void) {
    char *d = fresh_subdir("sharded");
    write_shard(d, "model-00001-of-00002.safetensors", g_s1, 0);
    write_shard(d, "model-00002-of-00002.safetensors", g_s2, 100);
    test_write_file(d, "model.safetensors.index.json", g_index);
    io_checkpoint *ck;
    base_err err = {{0}};
    CHECK_MSG(io_checkpoint_open_dir(d, &ck, &err) == 0, "%s", err.msg);
    if (ck) {
        CHECK(io_checkpoint_count(ck) == 3);
        const io_tensor *c = io_checkpoint_find(ck, "c.w");
        CHECK(c && strstr(c->file, "model-00002-of-00002.safetensors"));
        CHECK(c && ((const float *)c->data)[3] == 103.0f);
        const io_tensor *b = io_checkpoint_find(ck, "b.w");
        CHECK(b && ((const float *)b->data)[0] == 4.0f);
        CHECK(io_checkpoint_bytes(ck) == 48);
        io_checkpoint_close(ck);
    }
    CHECK_MSG(io_checkpoint_open_headers(d, &ck, &err) == 0, "%s", err.msg);
    if (ck) {
        const io_tensor *c = io_checkpoint_find(ck, "c.w");
        CHECK(c && c->data == NULL && c->nbytes == 16);
        CHECK(io_checkpoint_bytes(ck) == 48);
        io_checkpoint_close(ck);
    }
    free(d);
}

static void test_sharded_broken(void) {
    char *d = fresh_subdir("missing_shard");
    write_shard(d, "model-00001-of-00002.safetensors", g_s1, 0);
    test_write_file(d, "model.safetensors.index.json", g_index);
    expect_dir_fail(d, "model-00002-of-00002.safetensors", "not found", __LINE__);
    free(d);

    d = fresh_subdir("not_in_shard");
    const char *const only_a[] = {"a.w", NULL};
    write_shard(d, "model-00001-of-00002.safetensors", only_a, 0);
    write_shard(d, "model-00002-of-00002.safetensors", g_s2, 0);
    test_write_file(d, "model.safetensors.index.json", g_index);
    expect_dir_fail(d, "'b.w'", "model-00001-of-00002.safetensors", __LINE__);
    free(d);

    d = fresh_subdir("wrong_shard");
    const char *const b_c[] = {"b.w", "c.w", NULL};
    write_shard(d, "model-00001-of-00002.safetensors", only_a, 0);
    write_shard(d, "model-00002-of-00002.safetensors", b_c, 0);
    test_write_file(d, "model.safetensors.index.json", g_index);
    expect_dir_fail(d, "'b.w'", "does not hold it", __LINE__);
    free(d);

    d = fresh_subdir("dup_across");
    const char *const a_c[] = {"a.w", "c.w", NULL};
    write_shard(d, "model-00001-of-00002.safetensors", g_s1, 0);
    write_shard(d, "model-00002-of-00002.safetensors", a_c, 0);
    test_write_file(d, "model.safetensors.index.json", g_index);
    expect_dir_fail(d, "'a.w'", "two shards", __LINE__);
    free(d);

    d = fresh_subdir("dotdot");
    write_shard(d, "model-00001-of-00002.safetensors", g_s1, 0);
    test_write_file(d, "model.safetensors.index.json",
                    "{\"weight_map\":{\"a.w\":\"../model-00001-of-00002.safetensors\"}}");
    expect_dir_fail(d, "'a.w'", "plain file name", __LINE__);
    test_write_file(d, "model.safetensors.index.json",
                    "{\"weight_map\":{\"a.w\":\"sub/model-00001-of-00002.safetensors\"}}");
    expect_dir_fail(d, "sub/model", "plain file name", __LINE__);
    test_write_file(d, "model.safetensors.index.json", "{\"weight_map\":{}}");
    expect_dir_fail(d, "weight_map", "model.safetensors.index.json", __LINE__);
    test_write_file(d, "model.safetensors.index.json", "{\"weight_map\":");
    expect_dir_fail(d, "model.safetensors.index.json", NULL, __LINE__);
    free(d);

    /* a broken shard's message carries the shard's path */
    d = fresh_subdir("bad_shard");
    write_shard(d, "model-00001-of-00002.safetensors", g_s1, 0);
    char *p = base_path_join(d, "model-00002-of-00002.safetensors");
    iot_write_st(p, "{\"c.w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8);
    test_write_file(d, "model.safetensors.index.json", g_index);
    expect_dir_fail(d, p, "'c.w'", __LINE__);
    free(p);
    free(d);
}

static void test_unindexed_dirs(void) {
    char *d = fresh_subdir("single");
    write_shard(d, "model.safetensors", g_s1, 0);
    write_shard(d, "other.safetensors", g_s2, 0); /* ignored: model.safetensors wins */
    io_checkpoint *ck;
    base_err err = {{0}};
    CHECK_MSG(io_checkpoint_open_dir(d, &ck, &err) == 0, "%s", err.msg);
    if (ck) {
        CHECK(io_checkpoint_count(ck) == 2 && !io_checkpoint_find(ck, "c.w"));
        io_checkpoint_close(ck);
    }
    free(d);

    d = fresh_subdir("globbed");
    /* written out of name order, since some filesystems list in creation order */
    write_shard(d, "a.safetensors", g_s2, 0);
    write_shard(d, "z.safetensors", g_s1, 0);
    test_write_file(d, "readme.txt", "not a shard");
    test_write_file(d, "._a.safetensors", "resource fork, not a shard");
    CHECK_MSG(io_checkpoint_open_dir(d, &ck, &err) == 0, "%s", err.msg);
    if (ck) {
        CHECK(io_checkpoint_count(ck) == 3);
        CHECK(strcmp(io_checkpoint_at(ck, 0)->name, "c.w") == 0); /* a.safetensors first */
        io_checkpoint_close(ck);
    }
    write_shard(d, "b.safetensors", g_s2, 0);
    expect_dir_fail(d, "'c.w'", "two shards", __LINE__);
    free(d);

    /* six shards written in a scrambled order must still load in name order */
    d = fresh_subdir("ordered");
    static const int order[6] = {3, 0, 5, 1, 4, 2};
    for (int i = 0; i < 6; i++) {
        char file[32], tname[8];
        snprintf(file, sizeof file, "shard%d.safetensors", order[i]);
        snprintf(tname, sizeof tname, "t%d", order[i]);
        const char *const one[] = {tname, NULL};
        write_shard(d, file, one, 0);
    }
    CHECK_MSG(io_checkpoint_open_dir(d, &ck, &err) == 0, "%s", err.msg);
    if (ck) {
        for (size_t i = 0; i < io_checkpoint_count(ck); i++) {
            char tname[24];
            snprintf(tname, sizeof tname, "t%zu", i);
            CHECK_MSG(strcmp(io_checkpoint_at(ck, i)->name, tname) == 0, "at %zu: %s", i,
                      io_checkpoint_at(ck, i)->name);
        }
        io_checkpoint_close(ck);
    }
    free(d);

    d = fresh_subdir("empty");
    expect_dir_fail(d, d, "no model.safetensors.index.json", __LINE__);
    free(d);
    d = path_in("does_not_exist");
    expect_dir_fail(d, d, "no such directory", __LINE__);
    free(d);
}

/* Every prefix of a good file and random byte flips: each open either fails cleanly or gives
 * tensors that lie inside the file. */
static void test_corruption(void) {
    char *d = fresh_subdir("fuzz");
    write_shard(d, "good.safetensors", g_s1, 0);
    char *good = base_path_join(d, "good.safetensors"), *p = base_path_join(d, "x.safetensors");
    char *raw;
    size_t len;
    base_err err = {{0}};
    if (base_read_file(good, &raw, &len, &err) != 0) return;
    int prefix_opened = 0;
    for (size_t n = 0; n < len; n++) {
        iot_write_bytes(p, raw, n);
        io_checkpoint *ck;
        if (io_checkpoint_open_file(p, &ck, &err) == 0) {
            prefix_opened++;
            io_checkpoint_close(ck);
        }
    }
    CHECK_MSG(prefix_opened == 0, "%d truncated prefixes opened", prefix_opened);
    uint64_t seed = 12345;
    int opened = 0;
    char *mut = malloc(len);
    for (int it = 0; it < 2000; it++) {
        memcpy(mut, raw, len);
        for (int k = 0; k < 3; k++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            mut[(seed >> 33) % len] = (char)(seed >> 17);
        }
        iot_write_bytes(p, mut, len);
        io_checkpoint *ck;
        if (io_checkpoint_open_file(p, &ck, &err) != 0) continue;
        /* touching every byte faults (or trips the sanitizer) if a span left the map */
        unsigned sum = 0;
        for (size_t i = 0; i < io_checkpoint_count(ck); i++) {
            const io_tensor *t = io_checkpoint_at(ck, i);
            CHECK(t->nbytes <= len);
            for (uint64_t b = 0; b < t->nbytes; b++) sum += ((const uint8_t *)t->data)[b];
        }
        g_sink += sum;
        opened++;
        io_checkpoint_close(ck);
    }
    CHECK(opened > 0); /* some flips land in tensor data and leave the file valid */
    free(mut);
    free(raw);
    free(good);
    free(p);
    free(d);
}

int main(void) {
    iot_mkdtemp(g_dir);
    test_round_trip();
    test_write_failures();
    test_broken_files();
    test_empty_spans();
    test_sharded();
    test_sharded_broken();
    test_unindexed_dirs();
    test_corruption();
    iot_rm_tree(g_dir);
    TEST_MAIN_END();
}
