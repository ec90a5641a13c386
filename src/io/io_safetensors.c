/* One safetensors file: the header is validated in full before any tensor is exposed, so a
 * corrupt or hostile file fails at open with a message naming the file and the tensor, and
 * never later as a wild read inside a kernel. */
#include "io/io_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct st_span {
    uint64_t begin, end;
    const char *name;
    size_t idx; /* the tensor's position in header order */
} st_span;

static int span_cmp(const void *a, const void *b) {
    const st_span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

const char *io_json_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a real number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    case JSON_NULL:
        return "null";
    }
    return "?";
}

/* Skips one JSON value of text known to be well formed; returns the index after it. */
static size_t skip_value(const char *s, size_t i, size_t n) {
    int depth = 0;
    bool in_str = false;
    for (; i < n; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = false;
            continue;
        }
        if (c == '"')
            in_str = true;
        else if (c == '{' || c == '[')
            depth++;
        else if (c == '}' || c == ']') {
            if (depth == 0) return i;
            depth--;
        } else if (c == ',' && depth == 0)
            return i;
    }
    return n;
}

static int str_ptr_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* i is at the opening quote of a string; returns the index after its closing quote. */
static size_t skip_string(const char *s, size_t i, size_t n) {
    for (i++; i < n; i++) {
        if (s[i] == '\\')
            i++;
        else if (s[i] == '"')
            return i + 1;
    }
    return n;
}

static size_t skip_ws(const char *s, size_t i, size_t n) {
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++;
    return i;
}

/* jansson reports a duplicate key without naming it, so walk the top-level entries to find
 * it: a name held twice, or an entry whose own object repeats a key. The walk is bounds
 * checked, so text past the duplicate that jansson never reached cannot lead it astray. */
static int report_duplicate(const char *path, const char *text, size_t n, base_err *err) {
    size_t n_keys = 0;
    char **keys = NULL;
    bool named = false;
    size_t i = skip_ws(text, 0, n) + 1; /* past '{' */
    for (;;) {
        i = skip_ws(text, i, n);
        if (i >= n || text[i] != '"') break;
        size_t kend = skip_string(text, i, n);
        json_t *k = json_loadb(text + i, kend - i, JSON_DECODE_ANY, NULL);
        keys = base_xrealloc(keys, (n_keys + 1) * sizeof *keys);
        keys[n_keys++] = base_xstrdup(json_is_string(k) ? json_string_value(k) : "");
        json_decref(k);
        i = skip_ws(text, kend, n);
        if (i >= n || text[i] != ':') break;
        size_t vbeg = skip_ws(text, i + 1, n), vend = skip_value(text, vbeg, n);
        json_t *v =
            json_loadb(text + vbeg, vend - vbeg, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, NULL);
        json_decref(v);
        if (!v) {
            base_fail(err, "%s: tensor '%s': duplicate key in its header entry", path,
                      keys[n_keys - 1]);
            named = true;
            break;
        }
        i = vend + 1;
    }
    if (n_keys > 1) qsort(keys, n_keys, sizeof *keys, str_ptr_cmp);
    for (size_t j = 1; j < n_keys && !named; j++) {
        if (strcmp(keys[j - 1], keys[j]) == 0) {
            base_fail(err, "%s: tensor '%s': duplicate name in header", path, keys[j]);
            named = true;
        }
    }
    if (!named) base_fail(err, "%s: header has a duplicate key", path);
    for (size_t j = 0; j < n_keys; j++) free(keys[j]);
    free(keys);
    return -1;
}

static void ck_push_meta(io_checkpoint *ck, const char *key, const char *value) {
    if (ck->n_meta == ck->cap_meta) {
        ck->cap_meta = ck->cap_meta ? 2 * ck->cap_meta : 8;
        ck->meta = base_xrealloc(ck->meta, 2 * ck->cap_meta * sizeof *ck->meta);
    }
    ck->meta[2 * ck->n_meta] = base_xstrdup(key);
    ck->meta[2 * ck->n_meta + 1] = base_xstrdup(value);
    ck->n_meta++;
}

static int parse_metadata(io_checkpoint *ck, const char *path, json_t *meta, base_err *err) {
    if (!json_is_object(meta))
        return base_fail(err, "%s: __metadata__ must be an object, got %s", path,
                         io_json_kind(meta));
    const char *key;
    json_t *v;
    json_object_foreach(meta, key, v) {
        if (!json_is_string(v))
            return base_fail(err, "%s: __metadata__ key '%s' must be a string, got %s", path, key,
                             io_json_kind(v));
        ck_push_meta(ck, key, json_string_value(v));
    }
    return 0;
}

/* Parses one entry; on success fills t (name not set) and the span. */
static int parse_entry(const char *path, const char *name, json_t *e, uint64_t data_size,
                       io_tensor *t, st_span *span, base_err *err) {
    if (!json_is_object(e))
        return base_fail(err, "%s: tensor '%s': entry must be an object, got %s", path, name,
                         io_json_kind(e));
    json_t *dt = json_object_get(e, "dtype"), *sh = json_object_get(e, "shape"),
           *off = json_object_get(e, "data_offsets");
    if (!dt || !sh || !off)
        return base_fail(err, "%s: tensor '%s': missing '%s'", path, name,
                         !dt   ? "dtype"
                         : !sh ? "shape"
                               : "data_offsets");
    if (!json_is_string(dt))
        return base_fail(err, "%s: tensor '%s': dtype must be a string, got %s", path, name,
                         io_json_kind(dt));
    if (base_dtype_parse(json_string_value(dt), &t->dtype) != 0)
        return base_fail(err,
                         "%s: tensor '%s': unsupported dtype '%s' (supported: F64 F32 F16 BF16 "
                         "I64 I32 I16 I8 U64 U32 U16 U8 BOOL)",
                         path, name, json_string_value(dt));
    if (!json_is_array(sh))
        return base_fail(err, "%s: tensor '%s': shape must be an array, got %s", path, name,
                         io_json_kind(sh));
    size_t nd = json_array_size(sh);
    if (nd > IO_MAX_DIMS)
        return base_fail(err, "%s: tensor '%s': %zu dimensions, at most %d supported", path, name,
                         nd, IO_MAX_DIMS);
    uint64_t elems = 1;
    t->ndim = (int)nd;
    for (size_t d = 0; d < nd; d++) {
        json_t *v = json_array_get(sh, d);
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return base_fail(err, "%s: tensor '%s': shape[%zu] must be a non-negative integer",
                             path, name, d);
        t->shape[d] = json_integer_value(v);
        if (!base_mul_ok_u64(elems, (uint64_t)t->shape[d], &elems))
            return base_fail(err, "%s: tensor '%s': shape element count overflows 64 bits", path,
                             name);
    }
    if (!base_mul_ok_u64(elems, base_dtype_size(t->dtype), &t->nbytes))
        return base_fail(err, "%s: tensor '%s': byte size overflows 64 bits", path, name);
    if (!json_is_array(off) || json_array_size(off) != 2 ||
        !json_is_integer(json_array_get(off, 0)) || !json_is_integer(json_array_get(off, 1)) ||
        json_integer_value(json_array_get(off, 0)) < 0 ||
        json_integer_value(json_array_get(off, 1)) < 0)
        return base_fail(err,
                         "%s: tensor '%s': data_offsets must be [begin, end], two "
                         "non-negative integers",
                         path, name);
    span->begin = (uint64_t)json_integer_value(json_array_get(off, 0));
    span->end = (uint64_t)json_integer_value(json_array_get(off, 1));
    span->name = name;
    if (span->begin > span->end)
        return base_fail(err, "%s: tensor '%s': data_offsets begin %llu > end %llu", path, name,
                         (unsigned long long)span->begin, (unsigned long long)span->end);
    if (span->end > data_size)
        return base_fail(err,
                         "%s: tensor '%s': data_offsets end %llu past the data section "
                         "(%llu bytes)",
                         path, name, (unsigned long long)span->end, (unsigned long long)data_size);
    if (span->end - span->begin != t->nbytes)
        return base_fail(err, "%s: tensor '%s': span is %llu bytes but shape x %s needs %llu", path,
                         name, (unsigned long long)(span->end - span->begin),
                         base_dtype_name(t->dtype), (unsigned long long)t->nbytes);
    return 0;
}

void io_ck_reserve_tensors(io_checkpoint *ck, size_t more) {
    if (ck->n_tensors + more <= ck->cap_tensors) return;
    ck->cap_tensors = ck->n_tensors + more + ck->cap_tensors;
    ck->tensors = base_xrealloc(ck->tensors, ck->cap_tensors * sizeof *ck->tensors);
}

/* Validates the parsed header and appends its tensors; data_base is NULL in header-only
 * mode. Tensors land in data order so a shard reads front to back. */
static int parse_header(io_checkpoint *ck, const char *path, json_t *root, uint64_t data_size,
                        const uint8_t *data_base, base_err *err) {
    size_t n = json_object_size(root);
    st_span *spans = base_xmalloc(n * sizeof *spans);
    io_tensor *tmp = base_xcalloc(n, sizeof *tmp);
    size_t nt = 0;
    int rc = 0;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            rc = parse_metadata(ck, path, v, err);
        } else {
            rc = parse_entry(path, key, v, data_size, &tmp[nt], &spans[nt], err);
            spans[nt].idx = nt;
            nt++;
        }
        if (rc != 0) break;
    }
    if (rc == 0) {
        qsort(spans, nt, sizeof *spans, span_cmp);
        for (size_t i = 1; i < nt && rc == 0; i++) {
            if (spans[i].begin < spans[i - 1].end)
                rc = base_fail(err,
                               "%s: tensor '%s': data span [%llu, %llu) overlaps tensor "
                               "'%s' [%llu, %llu)",
                               path, spans[i].name, (unsigned long long)spans[i].begin,
                               (unsigned long long)spans[i].end, spans[i - 1].name,
                               (unsigned long long)spans[i - 1].begin,
                               (unsigned long long)spans[i - 1].end);
        }
    }
    if (rc == 0) {
        io_ck_reserve_tensors(ck, nt);
        for (size_t i = 0; i < nt; i++) {
            io_tensor *t = &ck->tensors[ck->n_tensors++];
            *t = tmp[spans[i].idx];
            t->name = base_xstrdup(spans[i].name);
            t->file = path;
            t->data = data_base ? data_base + spans[i].begin : NULL;
        }
    }
    free(spans);
    free(tmp);
    return rc;
}

static int read_exact(int fd, void *buf, size_t n, uint64_t off) {
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t got = pread(fd, p, n, (off_t)off);
        if (got <= 0) {
            if (got < 0 && errno == EINTR) continue;
            return -1;
        }
        p += got;
        n -= (size_t)got;
        off += (uint64_t)got;
    }
    return 0;
}

static io_shard *ck_push_shard(io_checkpoint *ck, const char *path) {
    if (ck->n_shards == ck->cap_shards) {
        ck->cap_shards = ck->cap_shards ? 2 * ck->cap_shards : 4;
        ck->shards = base_xrealloc(ck->shards, ck->cap_shards * sizeof *ck->shards);
    }
    io_shard *s = &ck->shards[ck->n_shards++];
    *s = (io_shard){.path = base_xstrdup(path)};
    return s;
}

/* Header length and bytes of an open file. In map mode *header points into the map, else
 * into *owned (caller frees). */
static int load_header(int fd, io_shard *sh, bool map_data, uint64_t file_size, const char **header,
                       uint64_t *hlen, char **owned, base_err *err) {
    const char *path = sh->path;
    if (file_size < 8)
        return base_fail(err, "%s: truncated: %llu bytes, shorter than the 8-byte header length",
                         path, (unsigned long long)file_size);
    uint8_t len8[8];
    if (map_data) {
        sh->map = mmap(NULL, (size_t)file_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (sh->map == MAP_FAILED) {
            sh->map = NULL;
            return base_fail(err, "%s: mmap failed: %s", path, strerror(errno));
        }
        sh->map_len = (size_t)file_size;
        memcpy(len8, sh->map, 8);
    } else if (read_exact(fd, len8, 8, 0) != 0) {
        return base_fail(err, "%s: read error", path);
    }
    *hlen = 0;
    for (int i = 7; i >= 0; i--) *hlen = (*hlen << 8) | len8[i];
    if (*hlen > file_size - 8)
        return base_fail(err, "%s: header length %llu runs past the end of the file (%llu bytes)",
                         path, (unsigned long long)*hlen, (unsigned long long)file_size);
    if (*hlen > IO_MAX_HEADER_BYTES)
        return base_fail(err, "%s: header length %llu is over the %u-byte limit", path,
                         (unsigned long long)*hlen, IO_MAX_HEADER_BYTES);
    if (map_data) {
        *header = (const char *)sh->map + 8;
        return 0;
    }
    *owned = base_xmalloc(*hlen + 1);
    if (read_exact(fd, *owned, *hlen, 8) != 0) return base_fail(err, "%s: read error", path);
    *header = *owned;
    return 0;
}

int io_ck_add_file(io_checkpoint *ck, const char *path, bool map_data, base_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return base_fail(err, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return base_fail(err, "%s: not a regular file", path);
    }
    io_shard *sh = ck_push_shard(ck, path);
    const char *header = NULL;
    char *owned = NULL;
    uint64_t hlen = 0;
    int rc = load_header(fd, sh, map_data, (uint64_t)st.st_size, &header, &hlen, &owned, err);
    close(fd);
    if (rc != 0) {
        free(owned);
        return -1;
    }
    json_error_t jerr;
    json_t *root = json_loadb(header, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root && json_error_code(&jerr) == json_error_duplicate_key) {
        rc = report_duplicate(sh->path, header, (size_t)hlen, err);
    } else if (!root) {
        rc = base_fail(err, "%s: header is not valid JSON (byte %d: %s)", sh->path, jerr.position,
                       jerr.text);
    } else if (!json_is_object(root)) {
        rc = base_fail(err, "%s: header must be a JSON object, got %s", sh->path,
                       io_json_kind(root));
    } else {
        uint64_t data_size = (uint64_t)st.st_size - 8 - hlen;
        const uint8_t *data_base = map_data ? (const uint8_t *)sh->map + 8 + hlen : NULL;
        rc = parse_header(ck, sh->path, root, data_size, data_base, err);
    }
    json_decref(root);
    free(owned);
    return rc;
}

static int by_name_cmp(const void *a, const void *b) {
    return strcmp((*(const io_tensor *const *)a)->name, (*(const io_tensor *const *)b)->name);
}

int io_ck_index(io_checkpoint *ck, base_err *err) {
    free(ck->by_name);
    ck->by_name = base_xmalloc((ck->n_tensors ? ck->n_tensors : 1) * sizeof *ck->by_name);
    for (size_t i = 0; i < ck->n_tensors; i++) ck->by_name[i] = &ck->tensors[i];
    qsort(ck->by_name, ck->n_tensors, sizeof *ck->by_name, by_name_cmp);
    for (size_t i = 1; i < ck->n_tensors; i++) {
        const io_tensor *a = ck->by_name[i - 1], *b = ck->by_name[i];
        if (strcmp(a->name, b->name) == 0)
            return base_fail(err, "tensor '%s' is in two shards: %s and %s", a->name, a->file,
                             b->file);
    }
    return 0;
}
