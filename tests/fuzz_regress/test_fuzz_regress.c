/* Replays, through the fuzz targets' own bodies, every input that once broke one
 * (tests/fuzz_regress/<target>/) and every seed (fuzz/corpus/<target>/). A bug that comes
 * back crashes this test, or aborts it naming the broken promise; the sanitizer build in CI
 * catches the memory errors a plain build would survive. */
#include "../../fuzz/fuzz_http.h"
#include "../../fuzz/fuzz_http_request.h"
#include "test.h"

#include <dirent.h>

typedef struct regress_target {
    const char *name;
    int (*run)(const uint8_t *data, size_t size);
} regress_target;

static const regress_target targets[] = {
    {"safetensors", fuzz_safetensors},
    {"config", fuzz_config},
    {"tokenizer_json", fuzz_tokenizer_json},
    {"bpe", fuzz_bpe},
    {"chat", fuzz_chat},
    {"chat_nesting", fuzz_chat_nesting},
    {"npy", fuzz_npy},
    {"http_body", fuzz_http_body},
    {"http_request", fuzz_http_request},
};

static int name_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Runs every file of dir (sorted, hidden ones skipped) through the target; returns how many. */
static int replay_dir(const regress_target *t, const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    char **names = NULL;
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        names = base_xrealloc(names, (n + 1) * sizeof *names);
        names[n++] = base_xstrdup(de->d_name);
    }
    closedir(d);
    if (n > 1) qsort(names, n, sizeof *names, name_cmp);
    int replayed = 0;
    for (size_t i = 0; i < n; i++) {
        char *path = base_path_join(dir, names[i]);
        char *data;
        size_t len;
        base_err err;
        if (base_read_file(path, &data, &len, &err) == 0) {
            t->run((const uint8_t *)data, len);
            free(data);
            replayed++;
        } else {
            CHECK_MSG(false, "%s", err.msg);
        }
        free(path);
        free(names[i]);
    }
    free(names);
    return replayed;
}

int main(void) {
    char dir[4096];
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) {
        const regress_target *t = &targets[i];
        snprintf(dir, sizeof dir, "%s/fuzz/corpus/%s", test_source_dir(), t->name);
        int seeds = replay_dir(t, dir);
        CHECK_MSG(seeds > 0, "no seeds replayed from %s", dir);
        snprintf(dir, sizeof dir, "%s/tests/fuzz_regress/%s", test_source_dir(), t->name);
        int saved = replay_dir(t, dir);
        printf("%s: %d seeds, %d saved inputs replayed\n", t->name, seeds, saved);
    }
    TEST_MAIN_END();
}
