/* The .npy reader: the header is a Python dict literal, parsed here by a small recursive
 * reader that accepts exactly what numpy writes ('descr', 'fortran_order', 'shape'). */
#include "io/io_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct npy_cur {
    const char *s;
    size_t i, n;
} npy_cur;

static void cur_ws(npy_cur *c) {
    while (c->i < c->n && (c->s[c->i] == ' ' || c->s[c->i] == '\t' || c->s[c->i] == '\n')) c->i++;
}

static bool cur_eat(npy_cur *c, char ch) {
    cur_ws(c);
    if (c->i < c->n && c->s[c->i] == ch) {
        c->i++;
        return true;
    }
    return false;
}

/* A quoted Python string without escapes (numpy never writes any) into out[cap]. */
static bool cur_str(npy_cur *c, char *out, size_t cap) {
    cur_ws(c);
    if (c->i >= c->n || (c->s[c->i] != '\'' && c->s[c->i] != '"')) return false;
    char q = c->s[c->i++];
    size_t len = 0;
    while (c->i < c->n && c->s[c->i] != q) {
        if (c->s[c->i] == '\\' || len + 1 >= cap) return false;
        out[len++] = c->s[c->i++];
    }
    out[len] = 0;
    return cur_eat(c, q);
}

static bool cur_word(npy_cur *c, const char *w) {
    cur_ws(c);
    size_t l = strlen(w);
    if (c->n - c->i < l || memcmp(c->s + c->i, w, l) != 0) return false;
    c->i += l;
    return true;
}

static bool cur_shape(npy_cur *c, int64_t *shape, int *ndim) {
    if (!cur_eat(c, '(')) return false;
    *ndim = 0;
    while (!cur_eat(c, ')')) {
        cur_ws(c);
        if (*ndim == IO_MAX_DIMS || c->i >= c->n || c->s[c->i] < '0' || c->s[c->i] > '9')
            return false;
        int64_t v = 0;
        while (c->i < c->n && c->s[c->i] >= '0' && c->s[c->i] <= '9') {
            if (v > (INT64_MAX - 9) / 10) return false;
            v = v * 10 + (c->s[c->i++] - '0');
        }
        shape[(*ndim)++] = v;
        if (!cur_eat(c, ',')) {
            if (!cur_eat(c, ')')) return false;
            break;
        }
    }
    return true;
}

typedef struct npy_header {
    char descr[16];
    int fortran; /* -1 = absent */
    int ndim;    /* -1 = absent */
    int64_t shape[IO_MAX_DIMS];
} npy_header;

static int parse_dict(const char *path, npy_cur *c, npy_header *h, base_err *err) {
    h->descr[0] = 0;
    h->fortran = h->ndim = -1;
    if (!cur_eat(c, '{')) return base_fail(err, "%s: .npy header is not a dict", path);
    while (!cur_eat(c, '}')) {
        char key[32];
        if (!cur_str(c, key, sizeof key) || !cur_eat(c, ':'))
            return base_fail(err, "%s: malformed .npy header", path);
        bool ok;
        if (strcmp(key, "descr") == 0)
            ok = cur_str(c, h->descr, sizeof h->descr);
        else if (strcmp(key, "fortran_order") == 0) {
            h->fortran = cur_word(c, "True") ? 1 : cur_word(c, "False") ? 0 : -1;
            ok = h->fortran >= 0;
        } else if (strcmp(key, "shape") == 0)
            ok = cur_shape(c, h->shape, &h->ndim);
        else
            return base_fail(err, "%s: .npy header has unknown key '%s'", path, key);
        if (!ok) return base_fail(err, "%s: .npy header: bad value for '%s'", path, key);
        if (!cur_eat(c, ',')) {
            if (!cur_eat(c, '}')) return base_fail(err, "%s: malformed .npy header", path);
            break;
        }
    }
    if (!h->descr[0] || h->fortran < 0 || h->ndim < 0)
        return base_fail(err, "%s: .npy header lacks '%s'", path,
                         !h->descr[0]     ? "descr"
                         : h->fortran < 0 ? "fortran_order"
                                          : "shape");
    return 0;
}

/* Header bounds for versions 1 (16-bit length) and 2, 3 (32-bit length). */
static int npy_locate(const char *path, const uint8_t *b, size_t len, size_t *hoff, size_t *hlen,
                      base_err *err) {
    if (len < 10 || memcmp(b, "\x93NUMPY", 6) != 0)
        return base_fail(err, "%s: not a .npy file (bad magic)", path);
    if (b[6] == 1) {
        *hoff = 10;
        *hlen = (size_t)b[8] | (size_t)b[9] << 8;
    } else if (b[6] == 2 || b[6] == 3) {
        if (len < 12) return base_fail(err, "%s: truncated .npy header", path);
        *hoff = 12;
        *hlen = (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 | (size_t)b[11] << 24;
    } else {
        return base_fail(err, "%s: unsupported .npy version %d.%d", path, b[6], b[7]);
    }
    if (*hlen > len - *hoff) return base_fail(err, "%s: truncated .npy header", path);
    return 0;
}

int io_npy_read_f32(const char *path, float **data, int64_t *shape, int *ndim, base_err *err) {
    char *buf;
    size_t len;
    *data = NULL;
    if (base_read_file(path, &buf, &len, err) != 0) return -1;
    const uint8_t *b = (const uint8_t *)buf;
    size_t hoff = 0, hlen = 0;
    npy_header h = {.ndim = 0};
    int rc = npy_locate(path, b, len, &hoff, &hlen, err);
    if (rc == 0) {
        npy_cur c = {buf + hoff, 0, hlen};
        rc = parse_dict(path, &c, &h, err);
    }
    size_t item = 0;
    if (rc == 0) {
        item = strcmp(h.descr, "<f4") == 0 ? 4 : strcmp(h.descr, "<f8") == 0 ? 8 : 0;
        if (!item)
            rc = base_fail(err, "%s: .npy dtype '%s' not supported (only <f4 and <f8)", path,
                           h.descr);
        else if (h.fortran)
            rc = base_fail(err, "%s: .npy in Fortran order not supported (only C order)", path);
    }
    uint64_t count = 1, nbytes = 0;
    for (int d = 0; rc == 0 && d < h.ndim; d++) {
        if (!base_mul_ok_u64(count, (uint64_t)h.shape[d], &count))
            rc = base_fail(err, "%s: .npy shape overflows", path);
    }
    if (rc == 0 && (!base_mul_ok_u64(count, item, &nbytes) || nbytes != len - hoff - hlen))
        rc = base_fail(err, "%s: .npy data is %zu bytes, shape needs %llu", path, len - hoff - hlen,
                       (unsigned long long)nbytes);
    if (rc == 0) {
        const uint8_t *src = b + hoff + hlen;
        float *out = base_xmalloc((size_t)count * sizeof(float));
        for (uint64_t i = 0; i < count; i++) {
            if (item == 4) {
                memcpy(&out[i], src + 4 * i, 4);
            } else {
                double v;
                memcpy(&v, src + 8 * i, 8);
                out[i] = (float)v;
            }
        }
        *data = out;
        *ndim = h.ndim;
        memcpy(shape, h.shape, (size_t)h.ndim * sizeof *shape);
    }
    free(buf);
    return rc;
}
