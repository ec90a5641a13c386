/* Checkpoints: one file, or a directory of shards (with or without an index), seen as one
 * flat table of tensors with unique names. */
#include "io/io_internal.h"

#include <dirent.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define IO_INDEX_NAME "model.safetensors.index.json"

static int str_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void free_strs(char **v, size_t n) {
    for (size_t i = 0; i < n; i++) free(v[i]);
    free(v);
}

/* A shard name comes from a file we do not trust: it must stay inside the directory. */
static bool shard_name_ok(const char *s) {
    return s[0] != 0 && !strchr(s, '/') && !strchr(s, '\\') && !strstr(s, "..");
}

/* Checks every weight_map entry against the opened shards. */
static int check_weight_map(const io_checkpoint *ck, const char *dir, const char *index_path,
                            json_t *map, base_err *err) {
    const char *name;
    json_t *v;
    json_object_foreach(map, name, v) {
        const io_tensor *t = io_checkpoint_find(ck, name);
        char *want = base_path_join(dir, json_string_value(v));
        bool ok = t && strcmp(t->file, want) == 0;
        free(want);
        if (!ok)
            return base_fail(err, "%s: tensor '%s' is mapped to shard '%s', which does not hold it",
                             index_path, name, json_string_value(v));
    }
    return 0;
}

/* The first tensor the index maps to shard, so that a missing shard error names one. */
static const char *first_mapped_to(json_t *map, const char *shard) {
    const char *name;
    json_t *v;
    json_object_foreach(map, name, v) {
        if (strcmp(json_string_value(v), shard) == 0) return name;
    }
    return "?";
}

static int open_indexed(io_checkpoint *ck, const char *dir, const char *index_path, bool map_data,
                        base_err *err) {
    char *text = NULL;
    if (base_read_file(index_path, &text, NULL, err) != 0) return -1;
    json_error_t jerr;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!root) return base_fail(err, "%s: line %d: %s", index_path, jerr.line, jerr.text);
    json_t *map = json_object_get(root, "weight_map");
    int rc = 0;
    if (!json_is_object(map) || json_object_size(map) == 0)
        rc = base_fail(err, "%s: 'weight_map' must be a non-empty object", index_path);
    size_t n = 0;
    char **shards = NULL;
    const char *name;
    json_t *v;
    if (rc == 0) {
        shards = base_xmalloc(json_object_size(map) * sizeof *shards);
        json_object_foreach(map, name, v) {
            if (!json_is_string(v) || !shard_name_ok(json_string_value(v))) {
                rc = base_fail(err, "%s: tensor '%s': shard %s%s%s must be a plain file name",
                               index_path, name, json_is_string(v) ? "'" : "",
                               json_is_string(v) ? json_string_value(v) : "(not a string)",
                               json_is_string(v) ? "'" : "");
                break;
            }
            shards[n++] = base_xstrdup(json_string_value(v));
        }
    }
    if (rc == 0) {
        qsort(shards, n, sizeof *shards, str_cmp);
        for (size_t i = 0; i < n && rc == 0; i++) {
            if (i > 0 && strcmp(shards[i], shards[i - 1]) == 0) continue;
            char *path = base_path_join(dir, shards[i]);
            if (!base_file_exists(path))
                rc = base_fail(err, "%s: shard '%s' not found (it holds tensor '%s')", index_path,
                               shards[i], first_mapped_to(map, shards[i]));
            else
                rc = io_ck_add_file(ck, path, map_data, err);
            free(path);
        }
    }
    if (rc == 0) rc = io_ck_index(ck, err);
    if (rc == 0) rc = check_weight_map(ck, dir, index_path, map, err);
    free_strs(shards, n);
    json_decref(root);
    return rc;
}

/* Every *.safetensors file in dir, sorted; hidden files are skipped (macOS copies leave
 * "._x.safetensors" resource forks beside the real shards). */
static int list_safetensors(const char *dir, char ***out, size_t *n_out, base_err *err) {
    DIR *d = opendir(dir);
    if (!d) return base_fail(err, "%s: cannot open directory", dir);
    static const char suffix[] = ".safetensors";
    size_t n = 0, sl = sizeof suffix - 1;
    char **names = NULL;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (de->d_name[0] == '.' || len <= sl || strcmp(de->d_name + len - sl, suffix) != 0)
            continue;
        names = base_xrealloc(names, (n + 1) * sizeof *names);
        names[n++] = base_path_join(dir, de->d_name);
    }
    closedir(d);
    if (n > 1) qsort(names, n, sizeof *names, str_cmp);
    *out = names;
    *n_out = n;
    return 0;
}

static int open_dir(const char *dir, bool map_data, io_checkpoint **out, base_err *err) {
    *out = NULL;
    if (!base_dir_exists(dir)) return base_fail(err, "%s: no such directory", dir);
    io_checkpoint *ck = base_xcalloc(1, sizeof *ck);
    char *index_path = base_path_join(dir, IO_INDEX_NAME);
    char *single = base_path_join(dir, "model.safetensors");
    int rc = 0;
    if (base_file_exists(index_path)) {
        rc = open_indexed(ck, dir, index_path, map_data, err);
    } else if (base_file_exists(single)) {
        rc = io_ck_add_file(ck, single, map_data, err);
        if (rc == 0) rc = io_ck_index(ck, err);
    } else {
        char **files = NULL;
        size_t n = 0;
        rc = list_safetensors(dir, &files, &n, err);
        if (rc == 0 && n == 0)
            rc = base_fail(err, "%s: no %s, model.safetensors or *.safetensors file", dir,
                           IO_INDEX_NAME);
        for (size_t i = 0; i < n && rc == 0; i++) rc = io_ck_add_file(ck, files[i], map_data, err);
        if (rc == 0) rc = io_ck_index(ck, err);
        free_strs(files, n);
    }
    free(index_path);
    free(single);
    if (rc != 0) {
        io_checkpoint_close(ck);
        return -1;
    }
    *out = ck;
    return 0;
}

int io_checkpoint_open_file(const char *path, io_checkpoint **out, base_err *err) {
    *out = NULL;
    io_checkpoint *ck = base_xcalloc(1, sizeof *ck);
    if (io_ck_add_file(ck, path, true, err) != 0 || io_ck_index(ck, err) != 0) {
        io_checkpoint_close(ck);
        return -1;
    }
    *out = ck;
    return 0;
}

int io_checkpoint_open_dir(const char *dir, io_checkpoint **out, base_err *err) {
    return open_dir(dir, true, out, err);
}

int io_checkpoint_open_headers(const char *dir, io_checkpoint **out, base_err *err) {
    return open_dir(dir, false, out, err);
}

void io_checkpoint_close(io_checkpoint *ck) {
    if (!ck) return;
    for (size_t i = 0; i < ck->n_shards; i++) {
        if (ck->shards[i].map) munmap(ck->shards[i].map, ck->shards[i].map_len);
        free(ck->shards[i].path);
    }
    for (size_t i = 0; i < ck->n_tensors; i++) free((char *)ck->tensors[i].name);
    for (size_t i = 0; i < 2 * ck->n_meta; i++) free(ck->meta[i]);
    for (size_t i = 0; i < ck->n_owned; i++) free(ck->owned[i]);
    free(ck->owned);
    free(ck->shards);
    free(ck->tensors);
    free(ck->by_name);
    free(ck->meta);
    free(ck);
}

int io_checkpoint_replace(io_checkpoint *ck, const char *const *drop, size_t n_drop,
                          io_tensor_new *add, size_t n_add, base_err *err) {
    ck->owned = base_xrealloc(ck->owned, (ck->n_owned + n_add + 1) * sizeof *ck->owned);
    for (size_t i = 0; i < n_add; i++)
        if (add[i].data) ck->owned[ck->n_owned++] = add[i].data;
    const io_tensor *first = n_drop ? io_checkpoint_find(ck, drop[0]) : NULL;
    const char *file = first ? first->file : "";
    bool *gone = base_xcalloc(ck->n_tensors + 1, sizeof *gone);
    int rc = 0;
    for (size_t i = 0; i < n_drop && rc == 0; i++) {
        const io_tensor *t = io_checkpoint_find(ck, drop[i]);
        if (!t)
            rc = base_fail(err, "checkpoint: missing tensor %s", drop[i]);
        else
            gone[t - ck->tensors] = true;
    }
    size_t kept = 0;
    for (size_t i = 0; i < ck->n_tensors && rc == 0; i++) {
        if (gone[i]) {
            free((char *)ck->tensors[i].name);
            continue;
        }
        ck->tensors[kept++] = ck->tensors[i];
    }
    free(gone);
    if (rc == 0) {
        ck->n_tensors = kept;
        io_ck_reserve_tensors(ck, n_add);
    }
    for (size_t i = 0; i < n_add; i++) {
        if (rc != 0) {
            free(add[i].name);
            continue;
        }
        io_tensor *t = &ck->tensors[ck->n_tensors++];
        *t = (io_tensor){.name = add[i].name,
                         .file = file,
                         .dtype = add[i].dtype,
                         .ndim = add[i].ndim,
                         .data = add[i].data};
        uint64_t n = 1;
        for (int d = 0; d < add[i].ndim; d++) n *= (uint64_t)(t->shape[d] = add[i].shape[d]);
        t->nbytes = n * base_dtype_size(add[i].dtype);
    }
    return rc ? rc : io_ck_index(ck, err);
}

size_t io_checkpoint_count(const io_checkpoint *ck) {
    return ck->n_tensors;
}

const io_tensor *io_checkpoint_at(const io_checkpoint *ck, size_t i) {
    return i < ck->n_tensors ? &ck->tensors[i] : NULL;
}

const io_tensor *io_checkpoint_find(const io_checkpoint *ck, const char *name) {
    size_t lo = 0, hi = ck->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(ck->by_name[mid]->name, name);
        if (c == 0) return ck->by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

const char *io_checkpoint_metadata(const io_checkpoint *ck, const char *key) {
    for (size_t i = 0; i < ck->n_meta; i++) {
        if (strcmp(ck->meta[2 * i], key) == 0) return ck->meta[2 * i + 1];
    }
    return NULL;
}

uint64_t io_checkpoint_bytes(const io_checkpoint *ck) {
    uint64_t sum = 0;
    for (size_t i = 0; i < ck->n_tensors; i++) sum = base_sat_add_u64(sum, ck->tensors[i].nbytes);
    return sum;
}
