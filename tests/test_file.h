/* Writing a test's input files: a text file in a folder, the test ending when it cannot. */
#ifndef MLXCEL_TEST_FILE_H
#define MLXCEL_TEST_FILE_H

#include "base/base.h"

#include <stdio.h>
#include <stdlib.h>

static inline void test_write_file(const char *dir, const char *name, const char *text) {
    char *path = base_path_join(dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
    free(path);
}

#endif
