/* Helpers shared by the io tests: a scratch directory under /tmp and raw file writers for
 * building broken inputs byte by byte. */
#ifndef MLXCEL_IO_TEST_UTIL_H
#define MLXCEL_IO_TEST_UTIL_H

#include "io/io.h"
#include "test.h"

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Makes a fresh directory /tmp/mlxcel_io_XXXXXX; the path is written into buf[64]. */
static inline const char *iot_mkdtemp(char *buf) {
    snprintf(buf, 64, "/tmp/mlxcel_io_XXXXXX");
    if (!mkdtemp(buf)) {
        perror("mkdtemp");
        exit(1);
    }
    return buf;
}

/* Removes a directory tree made by a test. */
static inline void iot_rm_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
        char *p = base_path_join(dir, de->d_name);
        if (base_dir_exists(p))
            iot_rm_tree(p);
        else
            unlink(p);
        free(p);
    }
    closedir(d);
    rmdir(dir);
}

static inline void iot_write_bytes(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f || (len && fwrite(data, 1, len, f) != len) || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

/* A safetensors file from a header text and data_len zero bytes, with a given length field. */
static inline void iot_write_st_len(const char *path, uint64_t len_field, const char *header,
                                    size_t data_len) {
    size_t hl = strlen(header);
    uint8_t *buf = calloc(8 + hl + data_len + 1, 1);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(len_field >> (8 * i));
    memcpy(buf + 8, header, hl);
    iot_write_bytes(path, buf, 8 + hl + data_len);
    free(buf);
}

static inline void iot_write_st(const char *path, const char *header, size_t data_len) {
    iot_write_st_len(path, strlen(header), header, data_len);
}

static inline bool iot_has(const base_err *err, const char *s) {
    return strstr(err->msg, s) != NULL;
}

#endif
