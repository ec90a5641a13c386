/* The local side: the store, the Hugging Face cache (read only), resolving a name, listing
 * and removing. */
#include "hub/hub.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char *path_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *path_printf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = base_xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

char *hub_store_dir(const hub_options *o, const hub_repo_id *id) {
    return path_printf("%s/models/%s/%s", o->store, id->owner, id->name);
}

static bool store_complete(const char *dir) {
    char *marker = base_path_join(dir, HUB_COMPLETE_MARKER);
    bool ok = base_file_exists(marker);
    free(marker);
    return ok;
}

static bool has_suffix(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* Every shard the index names exists (the cache links a snapshot's file only once its blob is
 * complete, so existence is enough). */
static bool index_shards_present(const char *dir, const char *index_path) {
    json_t *root = json_load_file(index_path, 0, NULL);
    json_t *map = json_object_get(root, "weight_map");
    bool ok = json_is_object(map) && json_object_size(map) > 0;
    const char *key;
    json_t *v;
    json_object_foreach(map, key, v) {
        if (!ok) break;
        const char *shard = json_string_value(v);
        char *p = shard && hub_component_ok(shard) ? base_path_join(dir, shard) : NULL;
        ok = p && base_file_exists(p);
        free(p);
    }
    json_decref(root);
    return ok;
}

/* A snapshot can be run when it holds config.json and its weights: every shard the index
 * names, or else at least one .safetensors file. */
static bool snapshot_usable(const char *dir) {
    char *config = base_path_join(dir, "config.json");
    char *index = base_path_join(dir, "model.safetensors.index.json");
    bool ok = base_file_exists(config);
    if (ok && base_file_exists(index)) {
        ok = index_shards_present(dir, index);
    } else if (ok) {
        ok = false;
        DIR *d = opendir(dir);
        struct dirent *e;
        while (d && !ok && (e = readdir(d))) {
            if (!has_suffix(e->d_name, ".safetensors")) continue;
            char *p = base_path_join(dir, e->d_name);
            ok = base_file_exists(p);
            free(p);
        }
        if (d) closedir(d);
    }
    free(config);
    free(index);
    return ok;
}

/* The commit a ref names (refs/<revision> holds it on one line), or "" . */
static void read_ref(const char *repo_dir, const char *revision, char *out, size_t size) {
    out[0] = 0;
    char *ref = path_printf("%s/refs/%s", repo_dir, revision);
    FILE *f = fopen(ref, "r");
    free(ref);
    if (!f) return;
    if (fgets(out, (int)size, f)) out[strcspn(out, " \r\n")] = 0;
    fclose(f);
    if (!hub_component_ok(out)) out[0] = 0;
}

char *hub_hf_snapshot(const hub_options *o, const hub_repo_id *id) {
    if (!o->hf_cache[0]) return NULL;
    char *repo = path_printf("%s/models--%s--%s", o->hf_cache, id->owner, id->name);
    char commit[HUB_NAME_MAX + 1];
    read_ref(repo, o->revision, commit, sizeof commit);
    char *best = commit[0] ? path_printf("%s/snapshots/%s", repo, commit) : NULL;
    if (best && !snapshot_usable(best)) {
        free(best);
        best = NULL;
    }
    /* Without a usable ref, the newest usable snapshot will do (files fetched by revision). */
    char *snaps = base_path_join(repo, "snapshots");
    DIR *d = best ? NULL : opendir(snaps);
    struct dirent *e;
    time_t best_time = 0;
    while (d && (e = readdir(d))) {
        if (!hub_component_ok(e->d_name)) continue;
        char *p = base_path_join(snaps, e->d_name);
        struct stat st;
        if (stat(p, &st) == 0 && S_ISDIR(st.st_mode) && (!best || st.st_mtime > best_time) &&
            snapshot_usable(p)) {
            free(best);
            best = p;
            best_time = st.st_mtime;
        } else {
            free(p);
        }
    }
    if (d) closedir(d);
    free(snaps);
    free(repo);
    return best;
}

int hub_resolve(const char *name_or_dir, const hub_options *o, char **dir, base_err *err) {
    if (base_dir_exists(name_or_dir)) {
        *dir = base_xstrdup(name_or_dir);
        return 0;
    }
    hub_repo_id id;
    if (hub_repo_parse(name_or_dir, &id, err))
        return base_fail_wrap(err, "%s: no such model directory, nor a Hub repo id", name_or_dir);
    char *store = hub_store_dir(o, &id);
    if (store_complete(store)) {
        *dir = store;
        return 0;
    }
    char *snapshot = hub_hf_snapshot(o, &id);
    if (snapshot) {
        free(store);
        *dir = snapshot;
        return 0;
    }
    if (o->offline) {
        base_fail(err,
                  "%s/%s is not downloaded, and downloads are off (--offline or HF_HUB_OFFLINE); "
                  "looked in %s%s%s",
                  id.owner, id.name, store, o->hf_cache[0] ? " and " : "", o->hf_cache);
        free(store);
        return -1;
    }
    free(store);
    return hub_download(&id, o, dir, err);
}

/* ---- listing ---- */

/* Bytes of the regular files directly in dir (links are not followed). */
static uint64_t dir_bytes(const char *dir) {
    uint64_t total = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
            total += (uint64_t)st.st_size;
    }
    if (d) closedir(d);
    return total;
}

typedef struct model_vec {
    hub_model *v; /* (cap) */
    size_t n, cap;
} model_vec;

static void push_model(model_vec *m, char *name, char *dir, uint64_t bytes, hub_source source,
                       bool complete) {
    if (m->n == m->cap) {
        m->cap = m->cap ? m->cap * 2 : 8;
        m->v = base_xrealloc(m->v, m->cap * sizeof *m->v);
    }
    m->v[m->n++] = (hub_model){name, dir, bytes, source, complete};
}

static bool is_real_dir(int parent, const char *name) {
    struct stat st;
    return fstatat(parent, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
}

static void list_store(const hub_options *o, model_vec *m) {
    char *models = base_path_join(o->store, "models");
    DIR *owners = opendir(models);
    struct dirent *oe;
    while (owners && (oe = readdir(owners))) {
        if (!hub_component_ok(oe->d_name) || !is_real_dir(dirfd(owners), oe->d_name)) continue;
        char *owner_dir = base_path_join(models, oe->d_name);
        DIR *names = opendir(owner_dir);
        struct dirent *ne;
        while (names && (ne = readdir(names))) {
            if (!hub_component_ok(ne->d_name) || !is_real_dir(dirfd(names), ne->d_name)) continue;
            char *dir = base_path_join(owner_dir, ne->d_name);
            push_model(m, path_printf("%s/%s", oe->d_name, ne->d_name), dir, dir_bytes(dir),
                       HUB_SOURCE_STORE, store_complete(dir));
        }
        if (names) closedir(names);
        free(owner_dir);
    }
    if (owners) closedir(owners);
    free(models);
}

static void list_hf_cache(const hub_options *o, model_vec *m) {
    DIR *d = o->hf_cache[0] ? opendir(o->hf_cache) : NULL;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        const char *prefix = "models--";
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
        char *text = base_xstrdup(e->d_name + strlen(prefix));
        char *sep = strstr(text, "--");
        hub_repo_id id;
        if (sep) {
            sep[0] = '/';
            memmove(sep + 1, sep + 2, strlen(sep + 2) + 1);
        }
        char *snapshot =
            sep && hub_repo_parse(text, &id, NULL) == 0 ? hub_hf_snapshot(o, &id) : NULL;
        if (snapshot) {
            char *blobs = path_printf("%s/%s/blobs", o->hf_cache, e->d_name);
            push_model(m, text, snapshot, dir_bytes(blobs), HUB_SOURCE_HF_CACHE, true);
            free(blobs);
        } else {
            free(text);
        }
    }
    if (d) closedir(d);
}

static int model_cmp(const void *a, const void *b) {
    const hub_model *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (int)x->source - (int)y->source;
}

int hub_list(const hub_options *o, hub_model **models, size_t *n, base_err *err) {
    model_vec m = {0};
    list_store(o, &m);
    list_hf_cache(o, &m);
    if (m.n) qsort(m.v, m.n, sizeof *m.v, model_cmp);
    *models = m.v;
    *n = m.n;
    return 0;
}

void hub_models_free(hub_model *models, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(models[i].name);
        free(models[i].dir);
    }
    free(models);
}

/* ---- removing ---- */

/* Removes `name` in the directory `parent`; a directory is emptied first, a symbolic link is
 * unlinked itself. `path` is only for messages. */
static int remove_at(int parent, const char *name, const char *path, base_err *err) {
    struct stat st;
    if (fstatat(parent, name, &st, AT_SYMLINK_NOFOLLOW))
        return base_fail(err, "%s: %s", path, strerror(errno));
    if (!S_ISDIR(st.st_mode)) {
        if (unlinkat(parent, name, 0)) return base_fail(err, "%s: %s", path, strerror(errno));
        return 0;
    }
    int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        int e = errno;
        if (fd >= 0) close(fd);
        return base_fail(err, "%s: %s", path, strerror(e));
    }
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char *child = base_path_join(path, e->d_name);
        rc = remove_at(dirfd(d), e->d_name, child, err);
        free(child);
    }
    closedir(d);
    if (rc == 0 && unlinkat(parent, name, AT_REMOVEDIR))
        rc = base_fail(err, "%s: %s", path, strerror(errno));
    return rc;
}

int hub_remove(const char *name, const hub_options *o, base_err *err) {
    hub_repo_id id;
    if (hub_repo_parse(name, &id, err)) return -1;
    char *owner_dir = path_printf("%s/models/%s", o->store, id.owner);
    char *dir = hub_store_dir(o, &id);
    int fd = open(owner_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    int rc = 0;
    if (fd < 0 || fstatat(fd, id.name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        char *snapshot = hub_hf_snapshot(o, &id);
        if (snapshot)
            rc = base_fail(err,
                           "%s/%s is only in the Hugging Face cache (%s), which mlxcel does not "
                           "modify",
                           id.owner, id.name, snapshot);
        else
            rc = base_fail(err, "%s/%s is not in the store (%s)", id.owner, id.name, dir);
        free(snapshot);
    } else {
        rc = remove_at(fd, id.name, dir, err);
    }
    if (fd >= 0) close(fd);
    /* The owner's directory goes when its last model does; a non-empty one stays. */
    if (rc == 0) rmdir(owner_dir);
    free(owner_dir);
    free(dir);
    return rc;
}
