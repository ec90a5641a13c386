/* Writers: safetensors and float32 .npy. Both write beside the target and rename, so a
 * failed or interrupted write never leaves a half file under the real name. */
#include "io/io_internal.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct tmp_file {
    char *tmp_path;
    FILE *f;
} tmp_file;

static int tmp_open(tmp_file *t, const char *path, base_err *err) {
    size_t n = strlen(path);
    t->tmp_path = base_xmalloc(n + 5);
    memcpy(t->tmp_path, path, n);
    memcpy(t->tmp_path + n, ".tmp", 5);
    t->f = fopen(t->tmp_path, "wb");
    if (!t->f) {
        base_fail(err, "%s: %s", t->tmp_path, strerror(errno));
        free(t->tmp_path);
        return -1;
    }
    return 0;
}

/* ok: everything was written; then flush, sync and rename, else remove the temporary. */
static int tmp_finish(tmp_file *t, const char *path, bool ok, base_err *err) {
    int rc = ok ? 0 : base_fail(err, "%s: write failed: %s", path, strerror(errno));
    if (rc == 0 && (fflush(t->f) != 0 || fsync(fileno(t->f)) != 0))
        rc = base_fail(err, "%s: write failed: %s", path, strerror(errno));
    if (fclose(t->f) != 0 && rc == 0)
        rc = base_fail(err, "%s: write failed: %s", path, strerror(errno));
    if (rc == 0 && rename(t->tmp_path, path) != 0)
        rc = base_fail(err, "%s: rename from %s failed: %s", path, t->tmp_path, strerror(errno));
    if (rc != 0) unlink(t->tmp_path);
    free(t->tmp_path);
    return rc;
}

static int check_shape(const char *path, const char *name, int ndim, const int64_t *shape,
                       size_t elem, uint64_t *nbytes, base_err *err) {
    if (ndim < 0 || ndim > IO_MAX_DIMS)
        return base_fail(err, "%s: tensor '%s': ndim %d outside [0, %d]", path, name, ndim,
                         IO_MAX_DIMS);
    uint64_t n = elem;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0)
            return base_fail(err, "%s: tensor '%s': negative dimension %lld", path, name,
                             (long long)shape[d]);
        if (!base_mul_ok_u64(n, (uint64_t)shape[d], &n))
            return base_fail(err, "%s: tensor '%s': size overflows 64 bits", path, name);
    }
    *nbytes = n;
    return 0;
}

/* Builds the header JSON; nbytes receives each tensor's size. Caller frees the text. */
static char *st_header(const char *path, const io_tensor_out *tensors, size_t n,
                       const char *const *metadata_kv, size_t n_meta, uint64_t *nbytes,
                       base_err *err) {
    json_t *root = json_object();
    if (n_meta > 0) {
        json_t *meta = json_object();
        for (size_t i = 0; i < n_meta; i++)
            json_object_set_new(meta, metadata_kv[2 * i], json_string(metadata_kv[2 * i + 1]));
        json_object_set_new(root, "__metadata__", meta);
    }
    uint64_t off = 0;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const io_tensor_out *t = &tensors[i];
        const char *name = t->name ? t->name : "(null)";
        if (!t->name || strcmp(name, "__metadata__") == 0 || json_object_get(root, name))
            rc =
                base_fail(err, "%s: tensor '%s': name missing, reserved or used twice", path, name);
        else if ((unsigned)t->dtype >= BASE_DTYPE_COUNT)
            rc = base_fail(err, "%s: tensor '%s': unknown dtype %d", path, name, (int)t->dtype);
        else
            rc = check_shape(path, name, t->ndim, t->shape, base_dtype_size(t->dtype), &nbytes[i],
                             err);
        if (rc == 0 && !t->data && nbytes[i] > 0)
            rc = base_fail(err, "%s: tensor '%s': data is NULL", path, name);
        if (rc == 0 && (nbytes[i] > INT64_MAX || off + nbytes[i] > INT64_MAX))
            rc = base_fail(err, "%s: tensor '%s': offsets overflow", path, name);
        if (rc != 0) break;
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        json_t *entry =
            json_pack("{s:s, s:o, s:[I,I]}", "dtype", base_dtype_name(t->dtype), "shape", shape,
                      "data_offsets", (json_int_t)off, (json_int_t)(off + nbytes[i]));
        json_object_set_new(root, name, entry);
        off += nbytes[i];
    }
    char *text = rc == 0 ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return text;
}

int io_safetensors_write(const char *path, const io_tensor_out *tensors, size_t n,
                         const char *const *metadata_kv, size_t n_meta, base_err *err) {
    uint64_t *nbytes = base_xcalloc(n ? n : 1, sizeof *nbytes);
    char *header = st_header(path, tensors, n, metadata_kv, n_meta, nbytes, err);
    if (!header) {
        free(nbytes);
        return -1;
    }
    /* Spaces pad the header to a multiple of 8 so the data section starts 8-byte aligned,
     * the same layout the reference writer produces. */
    size_t hlen = strlen(header), padded = (hlen + 7) & ~(size_t)7;
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    tmp_file tf;
    int rc = tmp_open(&tf, path, err);
    if (rc == 0) {
        bool ok = fwrite(len8, 1, 8, tf.f) == 8 && fwrite(header, 1, hlen, tf.f) == hlen;
        for (size_t i = hlen; i < padded && ok; i++) ok = fputc(' ', tf.f) != EOF;
        for (size_t i = 0; i < n && ok; i++)
            ok = fwrite(tensors[i].data, 1, nbytes[i], tf.f) == nbytes[i];
        rc = tmp_finish(&tf, path, ok, err);
    }
    free(header);
    free(nbytes);
    return rc;
}

/* ---- .npy ---- */

#define NPY_ALIGN 64

int io_npy_write_f32(const char *path, const float *data, const int64_t *shape, int ndim,
                     base_err *err) {
    uint64_t nbytes;
    if (check_shape(path, "array", ndim, shape, sizeof(float), &nbytes, err) != 0) return -1;
    if (!data && nbytes > 0) return base_fail(err, "%s: data is NULL", path);
    char dims[IO_MAX_DIMS * 24 + 4];
    size_t dl = 0;
    dims[dl++] = '(';
    for (int d = 0; d < ndim; d++)
        dl += (size_t)snprintf(dims + dl, sizeof dims - dl, d ? ", %lld" : "%lld",
                               (long long)shape[d]);
    if (ndim == 1) dims[dl++] = ',';
    dims[dl++] = ')';
    dims[dl] = 0;
    char header[512];
    int hl = snprintf(header, sizeof header,
                      "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }", dims);
    /* magic (6) + version (2) + length (2) + dict + spaces + '\n' is a multiple of 64 */
    size_t total = ((size_t)hl + 11 + NPY_ALIGN - 1) / NPY_ALIGN * NPY_ALIGN;
    size_t dict_len = total - 10;
    memset(header + hl, ' ', dict_len - 1 - (size_t)hl);
    header[dict_len - 1] = '\n';
    uint8_t pre[10] = {
        0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (uint8_t)(dict_len & 0xff), (uint8_t)(dict_len >> 8)};
    tmp_file tf;
    if (tmp_open(&tf, path, err) != 0) return -1;
    bool ok = fwrite(pre, 1, 10, tf.f) == 10 && fwrite(header, 1, dict_len, tf.f) == dict_len &&
              (nbytes == 0 || fwrite(data, 1, nbytes, tf.f) == nbytes);
    return tmp_finish(&tf, path, ok, err);
}
