/* Files, paths, checked allocation and the clock. */
#include "base/base.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

int base_read_file(const char *path, char **data, size_t *len, base_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return base_fail(err, "%s: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) {
        fclose(f);
        return base_fail(err, "%s: out of memory", path);
    }
    for (;;) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                fclose(f);
                return base_fail(err, "%s: out of memory", path);
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    bool failed = ferror(f);
    fclose(f);
    if (failed) {
        free(buf);
        return base_fail(err, "%s: read error", path);
    }
    buf[n] = 0;
    *data = buf;
    if (len) *len = n;
    return 0;
}

char *base_path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    bool slash = a > 0 && dir[a - 1] != '/';
    char *s = base_xmalloc(a + b + 2);
    memcpy(s, dir, a);
    if (slash) s[a++] = '/';
    memcpy(s + a, name, b + 1);
    return s;
}

bool base_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

bool base_dir_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static void *oom(size_t n) {
    fprintf(stderr, "mlxcel: error: out of memory allocating %zu bytes\n", n);
    abort();
}

void *base_xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    return p ? p : oom(n);
}

void *base_xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    return p ? p : oom(n * size);
}

void *base_xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    return q ? q : oom(n);
}

char *base_xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    return memcpy(base_xmalloc(n), s, n);
}

double base_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
