/* The hub module without a network: SHA-256 against the FIPS 180-2 example vectors, repo id
 * rules, options from the environment, the resolution order (directory, store, Hugging Face
 * cache, offline error) and removal. */
#include "hub/hub.h"
#include "test.h"
#include "test_file.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void sha_hex(const void *data, size_t n, char hex[65]) {
    hub_sha256 s;
    hub_sha256_init(&s);
    hub_sha256_update(&s, data, n);
    hub_sha256_final(&s, hex);
}

static void test_sha256(void) {
    char hex[65];
    sha_hex("", 0, hex);
    CHECK(strcmp(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") == 0);
    sha_hex("abc", 3, hex);
    CHECK(strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad") == 0);
    const char *two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    sha_hex(two_blocks, strlen(two_blocks), hex);
    CHECK(strcmp(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1") == 0);
    /* One million 'a', fed in uneven pieces so that pieces straddle block boundaries. */
    static char a[1000000];
    memset(a, 'a', sizeof a);
    hub_sha256 s;
    hub_sha256_init(&s);
    for (size_t off = 0, step = 1; off < sizeof a; off += step, step = step * 3 % 257 + 1)
        hub_sha256_update(&s, a + off, off + step > sizeof a ? sizeof a - off : step);
    hub_sha256_final(&s, hex);
    CHECK(strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0") == 0);
}

/* Every length across the padding boundaries (55, 56, 63, 64 bytes mod 64) against coreutils'
 * sha256sum, through hub_sha256_file. */
static void test_sha256_lengths(const char *root) {
    char path[HUB_PATH_MAX], cmd[HUB_PATH_MAX + 32], want[65], got[65];
    snprintf(path, sizeof path, "%s/sha_input", root);
    snprintf(cmd, sizeof cmd, "sha256sum '%s'", path);
    unsigned char data[200];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (unsigned char)(i * 7 + 3);
    int mismatches = 0, runs = 0;
    for (size_t len = 0; len <= sizeof data; len++) {
        FILE *f = fopen(path, "wb");
        if (!f) break;
        fwrite(data, 1, len, f);
        fclose(f);
        FILE *p = popen(cmd, "r");
        bool read = p && fscanf(p, "%64s", want) == 1;
        if (p) pclose(p);
        if (!read) break;
        runs++;
        if (hub_sha256_file(path, got, NULL) || strcmp(got, want) != 0) mismatches++;
    }
    CHECK_MSG(runs == (int)sizeof data + 1, "sha256sum ran %d times", runs);
    CHECK_MSG(mismatches == 0, "%d lengths differ from sha256sum", mismatches);
}

static void test_repo_ids(void) {
    hub_repo_id id;
    CHECK(hub_repo_parse("Llama-3.2-1B-Instruct-4bit", &id, NULL) == 0 &&
          strcmp(id.owner, "mlx-community") == 0 &&
          strcmp(id.name, "Llama-3.2-1B-Instruct-4bit") == 0);
    CHECK(hub_repo_parse("Qwen/Qwen3-0.6B", &id, NULL) == 0 && strcmp(id.owner, "Qwen") == 0 &&
          strcmp(id.name, "Qwen3-0.6B") == 0);
    const char *bad[] = {"",     "/",   "/abs",  "a/",     "/b",      "a/b/c", "../x",
                         "x/..", "..",  ".",     "a\\b",   "a b",     "a//b",  "a/b/",
                         "a/.",  "a:b", "a/b?c", "a/b%2e", "ünï/cøde"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        base_err err = {{0}};
        CHECK_MSG(hub_repo_parse(bad[i], &id, &err) == -1 && strstr(err.msg, bad[i]),
                  "'%s' must be refused with a message naming it", bad[i]);
    }
    char long_name[HUB_NAME_MAX + 2];
    memset(long_name, 'x', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = 0;
    CHECK(hub_repo_parse(long_name, &id, NULL) == -1);
    long_name[HUB_NAME_MAX] = 0;
    CHECK(hub_repo_parse(long_name, &id, NULL) == 0);
}

static void test_options(void) {
    hub_options o;
    setenv("MLXCEL_CACHE_DIR", "/tmp/store", 1);
    setenv("HF_HOME", "/tmp/hfhome", 1);
    unsetenv("HF_HUB_CACHE");
    setenv("HF_ENDPOINT", "http://127.0.0.1:9/", 1);
    setenv("HF_HUB_OFFLINE", "true", 1);
    unsetenv("HF_TOKEN");
    CHECK(hub_options_from_env(&o, NULL) == 0);
    CHECK(strcmp(o.store, "/tmp/store") == 0);
    CHECK(strcmp(o.hf_cache, "/tmp/hfhome/hub") == 0);
    CHECK(strcmp(o.endpoint, "http://127.0.0.1:9") == 0);
    CHECK(o.offline && !o.token && strcmp(o.revision, "main") == 0);
    setenv("HF_HUB_CACHE", "/tmp/hubcache", 1);
    setenv("HF_HUB_OFFLINE", "0", 1);
    setenv("HF_TOKEN", "tok", 1);
    CHECK(hub_options_from_env(&o, NULL) == 0);
    CHECK(strcmp(o.hf_cache, "/tmp/hubcache") == 0 && !o.offline && strcmp(o.token, "tok") == 0);
    unsetenv("MLXCEL_CACHE_DIR");
    unsetenv("XDG_CACHE_HOME");
    setenv("HOME", "/home/someone", 1);
    CHECK(hub_options_from_env(&o, NULL) == 0 &&
          strcmp(o.store, "/home/someone/.cache/mlxcel") == 0);
    unsetenv("HF_HUB_CACHE");
    unsetenv("HF_HOME");
    unsetenv("HF_ENDPOINT");
    CHECK(hub_options_from_env(&o, NULL) == 0 &&
          strcmp(o.hf_cache, "/home/someone/.cache/huggingface/hub") == 0 &&
          strcmp(o.endpoint, "https://huggingface.co") == 0);
}

static void mkdirs(const char *path) {
    char cmd[HUB_PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", path);
    CHECK(system(cmd) == 0);
}

/* Resolution order and the Hugging Face cache's usability rules, in a temp directory. */
static void test_resolve(const char *root) {
    hub_options o = {.revision = "main", .offline = true};
    snprintf(o.store, sizeof o.store, "%s/store", root);
    snprintf(o.hf_cache, sizeof o.hf_cache, "%s/hf", root);
    snprintf(o.endpoint, sizeof o.endpoint, "http://127.0.0.1:9");
    char path[HUB_PATH_MAX], *dir = NULL;
    base_err err;

    /* An existing directory is taken as given, even when it looks like a repo id. */
    CHECK(hub_resolve(root, &o, &dir, &err) == 0 && strcmp(dir, root) == 0);
    free(dir);

    /* Offline and nowhere: the error says so and names the repo. */
    CHECK(hub_resolve("acme/m", &o, &dir, &err) == -1 && strstr(err.msg, "acme/m") &&
          strstr(err.msg, "not downloaded"));

    /* The cache's snapshot, through refs/main, once it has config.json and its weights. */
    snprintf(path, sizeof path, "%s/hf/models--acme--m/snapshots/c0ffee", root);
    mkdirs(path);
    char refs[HUB_PATH_MAX];
    snprintf(refs, sizeof refs, "%s/hf/models--acme--m/refs", root);
    mkdirs(refs);
    test_write_file(refs, "main", "c0ffee\n");
    test_write_file(path, "config.json", "{}");
    CHECK(hub_resolve("acme/m", &o, &dir, &err) == -1);
    test_write_file(
        path, "model.safetensors.index.json",
        "{\"weight_map\": {\"a\": \"model-1.safetensors\", \"b\": \"model-2.safetensors\"}}");
    test_write_file(path, "model-1.safetensors", "x");
    CHECK_MSG(hub_resolve("acme/m", &o, &dir, &err) == -1,
              "a snapshot missing a shard its index names must not be used");
    test_write_file(path, "model-2.safetensors", "x");
    CHECK(hub_resolve("acme/m", &o, &dir, &err) == 0 && strcmp(dir, path) == 0);
    free(dir);

    /* The store's copy wins over the cache, but only once it is complete. */
    char store_dir[HUB_PATH_MAX];
    snprintf(store_dir, sizeof store_dir, "%s/store/models/acme/m", root);
    mkdirs(store_dir);
    test_write_file(store_dir, "config.json", "{}");
    CHECK(hub_resolve("acme/m", &o, &dir, &err) == 0 && strcmp(dir, path) == 0);
    free(dir);
    test_write_file(store_dir, HUB_COMPLETE_MARKER, "acme/m main\n");
    CHECK(hub_resolve("acme/m", &o, &dir, &err) == 0 && strcmp(dir, store_dir) == 0);
    free(dir);

    /* list: both copies, store first, sizes from disk. */
    hub_model *models;
    size_t n;
    CHECK(hub_list(&o, &models, &n, &err) == 0 && n == 2);
    if (n == 2) {
        CHECK(strcmp(models[0].name, "acme/m") == 0 && models[0].source == HUB_SOURCE_STORE &&
              models[0].complete && models[0].bytes == 2 + strlen("acme/m main\n"));
        CHECK(models[1].source == HUB_SOURCE_HF_CACHE && strcmp(models[1].dir, path) == 0);
    }
    hub_models_free(models, n);

    /* rm removes a link inside the model, never what it points at. */
    char outside[HUB_PATH_MAX], link[HUB_PATH_MAX + 16];
    snprintf(outside, sizeof outside, "%s/outside", root);
    mkdirs(outside);
    test_write_file(outside, "keep", "k");
    snprintf(link, sizeof link, "%s/escape", store_dir);
    CHECK(symlink(outside, link) == 0);
    CHECK(hub_remove("acme/m", &o, &err) == 0);
    CHECK(!base_dir_exists(store_dir));
    char keep[HUB_PATH_MAX + 8];
    snprintf(keep, sizeof keep, "%s/keep", outside);
    CHECK(base_file_exists(keep));
    /* Only the cache has it now: rm refuses and the cache stays. */
    CHECK(hub_remove("acme/m", &o, &err) == -1 && strstr(err.msg, "Hugging Face cache"));
    CHECK(base_dir_exists(path));
    CHECK(hub_remove("../m", &o, &err) == -1);
}

int main(void) {
    test_sha256();
    test_repo_ids();
    test_options();
    char root[] = "/tmp/mlxcel_hub_XXXXXX";
    if (mkdtemp(root)) {
        test_sha256_lengths(root);
        test_resolve(root);
        char cmd[64];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
        CHECK(system(cmd) == 0);
    } else {
        CHECK(!"mkdtemp");
    }
    TEST_MAIN_END();
}
