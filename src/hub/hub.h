/* hub: models by name. A model is named by a directory, a Hugging Face repo id `owner/name`,
 * or a bare `name` (meaning `mlx-community/name`). A repo id is looked up in mlxcel's store
 * (a finished download), then in an existing Hugging Face cache (read only), and is downloaded
 * from the Hub into the store when neither has it.
 *
 * The store ($MLXCEL_CACHE_DIR, default ~/.cache/mlxcel) holds `models/<owner>/<name>/` with
 * the runtime's files only. A file arrives as `<file>.incomplete` (resumed with an HTTP Range
 * request when a download was cut), is checked by size and, for LFS files, by sha256, and only
 * then renamed into place; a model directory is used only once its `.complete` marker exists,
 * which is written after every file is in place. */
#ifndef MLXCEL_HUB_H
#define MLXCEL_HUB_H

#include "base/base.h"

#define HUB_PATH_MAX 4096
/* The Hub's own limit on owner and repo names is 96 characters. */
#define HUB_NAME_MAX        96
#define HUB_DEFAULT_OWNER   "mlx-community"
#define HUB_COMPLETE_MARKER ".complete"

/* ---- SHA-256 (FIPS 180-4) ---- */

typedef struct hub_sha256 {
    uint32_t h[8];
    uint64_t n_bytes; /* bytes hashed so far */
    uint8_t block[64];
    size_t fill; /* bytes waiting in block */
} hub_sha256;

void hub_sha256_init(hub_sha256 *s);
void hub_sha256_update(hub_sha256 *s, const void *data, size_t n);
/* Writes the digest as 64 lowercase hex digits and a NUL. */
void hub_sha256_final(hub_sha256 *s, char hex[65]);
int hub_sha256_file(const char *path, char hex[65], base_err *err);

/* ---- names ---- */

typedef struct hub_repo_id {
    char owner[HUB_NAME_MAX + 1];
    char name[HUB_NAME_MAX + 1];
} hub_repo_id;

/* Parses `owner/name` or a bare `name` (owner mlx-community). Both parts must be 1 to 96 of
 * [A-Za-z0-9._-] and neither "." nor ".."; anything else (absolute paths, backslashes, more
 * than one '/', empty parts) is refused, so that a name can never reach outside the store. */
int hub_repo_parse(const char *text, hub_repo_id *id, base_err *err);
/* True for a name the store may create: one path component of [A-Za-z0-9._-], not "." or
 * "..". Used for file names from the Hub's listing too. */
bool hub_component_ok(const char *s);

/* ---- options ---- */

typedef struct hub_options {
    char store[HUB_PATH_MAX];    /* $MLXCEL_CACHE_DIR, else $XDG_CACHE_HOME/mlxcel, else
                                    ~/.cache/mlxcel */
    char hf_cache[HUB_PATH_MAX]; /* $HF_HUB_CACHE, else $HF_HOME/hub, else
                                    $XDG_CACHE_HOME/huggingface/hub, else
                                    ~/.cache/huggingface/hub */
    char endpoint[1024];         /* $HF_ENDPOINT without a trailing '/', else
                                    https://huggingface.co */
    const char *token;           /* $HF_TOKEN (not owned), or NULL */
    const char *revision;        /* "main" */
    bool offline;                /* $HF_HUB_OFFLINE=1; the CLI's --offline sets it too */
    bool progress;               /* a progress bar on stderr; on when stderr is a terminal */
} hub_options;

/* Fills o from the environment; fails only when no cache directory can be found. */
int hub_options_from_env(hub_options *o, base_err *err);

/* ---- resolving a model ---- */

/* The directory that holds the model `name_or_dir`: an existing directory as given, else the
 * store's finished copy of the repo, else its snapshot in the Hugging Face cache (which must
 * hold config.json and the safetensors), else a fresh download (an error when o->offline).
 * *dir is malloc'd; the caller frees it. */
int hub_resolve(const char *name_or_dir, const hub_options *o, char **dir, base_err *err);

/* The store's directory of a repo (whether or not it exists); the caller frees it. */
char *hub_store_dir(const hub_options *o, const hub_repo_id *id);
/* The Hugging Face cache's usable snapshot of a repo (caller frees), or NULL. */
char *hub_hf_snapshot(const hub_options *o, const hub_repo_id *id);

/* Downloads the runtime's files of a repo into the store (resuming an unfinished download)
 * and returns the model's directory in *dir (caller frees). Fails when built without libcurl. */
int hub_download(const hub_repo_id *id, const hub_options *o, char **dir, base_err *err);

/* ---- the local models ---- */

typedef enum { HUB_SOURCE_STORE = 0, HUB_SOURCE_HF_CACHE } hub_source;

typedef struct hub_model {
    char *name;     /* "owner/name" */
    char *dir;      /* the model's directory (a snapshot for the Hugging Face cache) */
    uint64_t bytes; /* bytes on disk: the store's files, or the cache repo's blobs */
    hub_source source;
    bool complete; /* false for a store download that has not finished */
} hub_model;

/* Every model in the store and every usable one in the Hugging Face cache, sorted by name
 * then source. The caller frees the array with hub_models_free. */
int hub_list(const hub_options *o, hub_model **models, size_t *n, base_err *err);
void hub_models_free(hub_model *models, size_t n);

/* Deletes a model (finished or not) from the store. Symbolic links inside it are removed,
 * never followed. A model that only the Hugging Face cache holds is an error: that cache is
 * never modified. */
int hub_remove(const char *name, const hub_options *o, base_err *err);

#endif
