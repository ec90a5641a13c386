/* .npy: the writer's bytes against the format numpy itself writes, round trips, hand-built
 * float64 and version-2 files, and one broken file per reader rule. */
#include "io/io_test_util.h"

static char g_dir[64];

static char *path_in(const char *name) {
    return base_path_join(g_dir, name);
}

/* A .npy from a header dict (padded here to 64 bytes as numpy does) and raw data. */
static void write_npy_raw(const char *path, int major, const char *dict, const void *data,
                          size_t len) {
    size_t pre = major == 1 ? 10 : 12, dl = strlen(dict);
    size_t total = (pre + dl + 1 + 63) / 64 * 64, hl = total - pre;
    uint8_t *buf = calloc(total + len + 1, 1);
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (uint8_t)major;
    for (size_t i = 0; i < pre - 8; i++) buf[8 + i] = (uint8_t)(hl >> (8 * i));
    memcpy(buf + pre, dict, dl);
    memset(buf + pre + dl, ' ', hl - dl - 1);
    buf[total - 1] = '\n';
    if (len) memcpy(buf + total, data, len);
    iot_write_bytes(path, buf, total + len);
    free(buf);
}

/* numpy.save of a float32 array of shape (2, 3) starts with exactly these 128 bytes. */
static void test_writer_bytes(void) {
    static const char want_dict[] = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
    float v[6] = {1, -2, 3.5f, 0, 1e-3f, -7};
    int64_t shape[2] = {2, 3};
    char *p = path_in("a.npy");
    base_err err = {{0}};
    CHECK_MSG(io_npy_write_f32(p, v, shape, 2, &err) == 0, "%s", err.msg);
    char *raw;
    size_t len;
    CHECK(base_read_file(p, &raw, &len, &err) == 0);
    CHECK(len == 128 + sizeof v);
    CHECK(memcmp(raw, "\x93NUMPY\x01\x00\x76\x00", 10) == 0);
    CHECK(memcmp(raw + 10, want_dict, sizeof want_dict - 1) == 0);
    for (size_t i = 10 + sizeof want_dict - 1; i < 127; i++) CHECK(raw[i] == ' ');
    CHECK(raw[127] == '\n');
    CHECK(memcmp(raw + 128, v, sizeof v) == 0);
    free(raw);

    /* one dimension keeps the tuple's trailing comma; zero dimensions is "()" */
    int64_t s1[1] = {5};
    float five[5] = {0};
    CHECK(io_npy_write_f32(p, five, s1, 1, &err) == 0);
    CHECK(base_read_file(p, &raw, &len, &err) == 0);
    CHECK(strstr(raw + 10, "'shape': (5,), }") != NULL && len == 128 + 20);
    free(raw);
    CHECK(io_npy_write_f32(p, five, s1, 0, &err) == 0);
    CHECK(base_read_file(p, &raw, &len, &err) == 0);
    CHECK(strstr(raw + 10, "'shape': (), }") != NULL && len == 128 + 4);
    free(raw);
    free(p);
}

static void test_round_trip(void) {
    char *p = path_in("r.npy");
    base_err err = {{0}};
    int64_t shape[3] = {2, 3, 4};
    float v[24];
    for (int i = 0; i < 24; i++) v[i] = (float)i * 0.25f - 3;
    CHECK(io_npy_write_f32(p, v, shape, 3, &err) == 0);
    float *got = NULL;
    int64_t gs[IO_MAX_DIMS];
    int nd = -1;
    CHECK_MSG(io_npy_read_f32(p, &got, gs, &nd, &err) == 0, "%s", err.msg);
    CHECK(nd == 3 && gs[0] == 2 && gs[1] == 3 && gs[2] == 4);
    CHECK(got && memcmp(got, v, sizeof v) == 0);
    free(got);

    int64_t empty[2] = {0, 7};
    CHECK(io_npy_write_f32(p, NULL, empty, 2, &err) == 0);
    CHECK_MSG(io_npy_read_f32(p, &got, gs, &nd, &err) == 0, "%s", err.msg);
    CHECK(nd == 2 && gs[0] == 0 && gs[1] == 7);
    free(got);

    int64_t neg[1] = {-1};
    CHECK(io_npy_write_f32(p, v, neg, 1, &err) == -1 && iot_has(&err, p));
    CHECK(io_npy_write_f32(p, v, shape, IO_MAX_DIMS + 1, &err) == -1);
    free(p);
}

static void test_f64_and_v2(void) {
    char *p = path_in("d.npy");
    double d[3] = {1.5, -2.25, 1e30};
    write_npy_raw(p, 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", d, sizeof d);
    float *got = NULL;
    int64_t gs[IO_MAX_DIMS];
    int nd = 0;
    base_err err = {{0}};
    CHECK_MSG(io_npy_read_f32(p, &got, gs, &nd, &err) == 0, "%s", err.msg);
    CHECK(nd == 1 && gs[0] == 3);
    CHECK(got && got[0] == 1.5f && got[1] == -2.25f && got[2] == 1e30f);
    free(got);

    float f[2] = {4, 5};
    write_npy_raw(p, 2, "{\"shape\": (1, 2), \"fortran_order\": False, \"descr\": \"<f4\"}", f,
                  sizeof f);
    CHECK_MSG(io_npy_read_f32(p, &got, gs, &nd, &err) == 0, "%s", err.msg);
    CHECK(nd == 2 && gs[0] == 1 && gs[1] == 2 && got && got[1] == 5);
    free(got);
    free(p);
}

static void broken(const char *dict, size_t data_len, int major, const char *want, int line) {
    char *p = path_in("bad.npy");
    uint8_t zeros[64] = {0};
    write_npy_raw(p, major, dict, zeros, data_len);
    float *got = (float *)1;
    int64_t gs[IO_MAX_DIMS];
    int nd;
    base_err err = {{0}};
    CHECK_MSG(io_npy_read_f32(p, &got, gs, &nd, &err) == -1 && got == NULL,
              "line %d: read succeeded", line);
    CHECK_MSG(iot_has(&err, p) && iot_has(&err, want), "line %d: %s", line, err.msg);
    free(p);
}

#define BROKEN(dict, n, major, want) broken(dict, n, major, want, __LINE__)

static void test_broken(void) {
    BROKEN("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", 8, 1, "'>f4'");
    BROKEN("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", 8, 1, "'<i4'");
    BROKEN("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", 8, 1, "Fortran");
    BROKEN("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", 8, 1, "8 bytes");
    BROKEN("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 8, 1, "8 bytes");
    BROKEN("{'descr': '<f4', 'fortran_order': False, }", 8, 1, "'shape'");
    BROKEN("{'descr': '<f4', 'shape': (2,), }", 8, 1, "fortran_order");
    BROKEN("{'fortran_order': False, 'shape': (2,), }", 8, 1, "descr");
    BROKEN("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", 8, 1, "'x'");
    BROKEN("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,), }", 8, 1, "fortran_order");
    BROKEN("{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }", 4, 1,
           "'shape'");
    BROKEN("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", 8, 1, "'shape'");
    BROKEN("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", 8, 1,
           "'shape'");
    BROKEN("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 2), }", 8, 1,
           "overflows");
    BROKEN("['descr']", 0, 1, "not a dict");
    BROKEN("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 8, 7, "version 7");

    char *p = path_in("magic.npy");
    iot_write_bytes(p, "NUMPY\x01\x00\x00\x00\x00", 10);
    float *got;
    int64_t gs[IO_MAX_DIMS];
    int nd;
    base_err err = {{0}};
    CHECK(io_npy_read_f32(p, &got, gs, &nd, &err) == -1 && iot_has(&err, "magic"));
    iot_write_bytes(p, "\x93NUMPY\x01\x00\xff\x00{", 11);
    CHECK(io_npy_read_f32(p, &got, gs, &nd, &err) == -1 && iot_has(&err, "truncated"));
    free(p);
    CHECK(io_npy_read_f32("/nonexistent_x.npy", &got, gs, &nd, &err) == -1 &&
          iot_has(&err, "/nonexistent_x.npy"));
}

/* Every prefix and random byte flips of a good file: a clean error or a well-formed array. */
static void test_corruption(void) {
    char *p = path_in("c.npy"), *q = path_in("cx.npy");
    float v[6] = {1, 2, 3, 4, 5, 6};
    int64_t shape[2] = {3, 2};
    base_err err = {{0}};
    CHECK(io_npy_write_f32(p, v, shape, 2, &err) == 0);
    char *raw;
    size_t len;
    if (base_read_file(p, &raw, &len, &err) != 0) return;
    int opened = 0;
    for (size_t n = 0; n < len; n++) {
        iot_write_bytes(q, raw, n);
        float *got;
        int64_t gs[IO_MAX_DIMS];
        int nd;
        if (io_npy_read_f32(q, &got, gs, &nd, &err) == 0) {
            opened++;
            free(got);
        }
    }
    CHECK_MSG(opened == 0, "%d truncated prefixes read", opened);
    uint64_t seed = 99;
    for (int it = 0; it < 2000; it++) {
        char mut[256];
        memcpy(mut, raw, len);
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        mut[(seed >> 33) % len] = (char)(seed >> 17);
        iot_write_bytes(q, mut, len);
        float *got;
        int64_t gs[IO_MAX_DIMS];
        int nd;
        if (io_npy_read_f32(q, &got, gs, &nd, &err) != 0) continue;
        uint64_t count = 1;
        for (int d = 0; d < nd; d++) count *= (uint64_t)gs[d];
        CHECK(nd <= IO_MAX_DIMS && count * 4 <= len);
        free(got);
    }
    free(raw);
    free(p);
    free(q);
}

int main(void) {
    iot_mkdtemp(g_dir);
    test_writer_bytes();
    test_round_trip();
    test_f64_and_v2();
    test_broken();
    test_corruption();
    iot_rm_tree(g_dir);
    TEST_MAIN_END();
}
