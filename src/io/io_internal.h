/* io's private declarations shared by its source files. */
#ifndef MLXCEL_IO_INTERNAL_H
#define MLXCEL_IO_INTERNAL_H

#include "io/io.h"

#include <jansson.h>

/* A header larger than this is not a checkpoint we would ever write or read: refusing it
 * keeps a corrupt length from asking for gigabytes before the JSON parser sees a byte. */
#define IO_MAX_HEADER_BYTES (100u * 1000u * 1000u)

typedef struct io_shard {
    char *path;
    void *map; /* (map_len) bytes of the whole file; NULL when only the header was read */
    size_t map_len;
} io_shard;

struct io_checkpoint {
    size_t n_shards, cap_shards;
    io_shard *shards; /* (n_shards) */
    size_t n_tensors, cap_tensors;
    io_tensor *tensors;        /* (n_tensors) names owned here, in shard order then file order */
    const io_tensor **by_name; /* (n_tensors) into tensors, sorted by name, for find */
    size_t n_meta, cap_meta;
    char **meta; /* (2 * n_meta) key, value pairs from every shard's __metadata__ */
    size_t n_owned;
    void **owned; /* (n_owned) data of tensors io_checkpoint_replace added */
};

/* "an object", "a string", ...: the JSON type of v for error messages. */
const char *io_json_kind(const json_t *v);

/* Reads and validates one file's header and appends its tensors and metadata to ck. With
 * map_data the file is mmapped and tensor data pointers are set; without it only the header
 * bytes are read and the data pointers stay NULL. */
int io_ck_add_file(io_checkpoint *ck, const char *path, bool map_data, base_err *err);
/* Room in ck->tensors for `more` tensors past n_tensors. */
void io_ck_reserve_tensors(io_checkpoint *ck, size_t more);
/* Builds the name index once every file is added (it points into tensors) and rejects a
 * name held by two shards. */
int io_ck_index(io_checkpoint *ck, base_err *err);

#endif
