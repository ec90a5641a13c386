/* Downloads from the Hugging Face Hub over its HTTP API with libcurl:
 *   GET {endpoint}/api/models/{owner}/{name}/tree/{revision}?recursive=true
 *       lists the files (pages chained by a Link: <...>; rel="next" header);
 *   GET {endpoint}/{owner}/{name}/resolve/{revision}/{file}
 *       fetches one (LFS files redirect to a CDN; `Range: bytes=N-` resumes).
 * Only the files the runtime reads are fetched. */
#include "hub/hub.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef MLXCEL_HAVE_CURL

#include <curl/curl.h>
#include <fcntl.h>
#include <jansson.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define HUB_ATTEMPTS        3
#define HUB_LISTING_MAX     (64u << 20)
#define HUB_PARTIAL_SUFFIX  ".incomplete"
#define HUB_CONNECT_TIMEOUT 10L
/* A transfer slower than 1 byte/s for this long is dead, not slow. */
#define HUB_STALL_SECONDS 30L

static const char *const k_wanted[] = {
    "config.json",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    NULL,
};

typedef struct hub_file {
    char *name;      /* a plain file name at the repo's top level */
    uint64_t size;   /* bytes, as the listing says */
    char sha256[65]; /* the LFS oid in hex, or "" for a file kept in git */
} hub_file;

typedef struct file_list {
    hub_file *v; /* (cap) */
    size_t n, cap;
} file_list;

static void files_free(file_list *l) {
    for (size_t i = 0; i < l->n; i++) free(l->v[i].name);
    free(l->v);
}

static bool wanted(const char *path) {
    if (strchr(path, '/')) return false;
    for (const char *const *w = k_wanted; *w; w++)
        if (strcmp(path, *w) == 0) return true;
    size_t n = strlen(path), s = strlen(".safetensors");
    return n > s && strcmp(path + n - s, ".safetensors") == 0;
}

/* A listing path that would step outside the model's directory. */
static bool path_unsafe(const char *path) {
    if (path[0] == '/' || path[0] == 0 || strchr(path, '\\')) return true;
    for (const char *p = path;;) {
        size_t len = strcspn(p, "/");
        if (len == 0 || (len == 2 && p[0] == '.' && p[1] == '.')) return true;
        if (!p[len]) return false;
        p += len + 1;
    }
}

static bool is_hex64(const char *s) {
    if (strlen(s) != 64) return false;
    for (int i = 0; i < 64; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
    return true;
}

/* ---- HTTP ---- */

typedef struct http_req {
    CURL *curl;
    struct curl_slist *headers;
    char errbuf[CURL_ERROR_SIZE];
} http_req;

static void http_init(http_req *r, const hub_options *o) {
    memset(r, 0, sizeof *r);
    r->curl = curl_easy_init();
    CURL *c = r->curl;
    curl_easy_setopt(c, CURLOPT_USERAGENT, "mlxcel/0.1.0");
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#else
    curl_easy_setopt(c, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, HUB_CONNECT_TIMEOUT);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, HUB_STALL_SECONDS);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, r->errbuf);
    if (o->token) {
        /* libcurl drops a custom Authorization header when a redirect leaves the host, so
         * the token never reaches the CDN. */
        char *h = base_xmalloc(strlen(o->token) + 32);
        sprintf(h, "Authorization: Bearer %s", o->token);
        r->headers = curl_slist_append(r->headers, h);
        free(h);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, r->headers);
    }
}

static void http_free(http_req *r) {
    curl_slist_free_all(r->headers);
    curl_easy_cleanup(r->curl);
}

static const char *http_error(http_req *r, CURLcode rc) {
    return r->errbuf[0] ? r->errbuf : curl_easy_strerror(rc);
}

/* What an HTTP error status means for a user. */
static const char *status_hint(long status) {
    if (status == 401 || status == 403) return " (a private or gated repo needs HF_TOKEN)";
    if (status == 404) return " (no such repo, revision or file on the Hub)";
    return "";
}

/* ---- the listing ---- */

typedef struct listing_io {
    char *body; /* (len + 1) */
    size_t len;
    bool too_big;
    char next[2048]; /* the Link header's rel="next" URL, or "" */
} listing_io;

static size_t listing_write(char *p, size_t size, size_t n, void *ctx) {
    listing_io *io = ctx;
    size_t len = size * n;
    if (io->len + len > HUB_LISTING_MAX) {
        io->too_big = true;
        return 0;
    }
    io->body = base_xrealloc(io->body, io->len + len + 1);
    memcpy(io->body + io->len, p, len);
    io->len += len;
    io->body[io->len] = 0;
    return len;
}

/* Finds `<url>; rel="next"` among the comma-separated links of a Link header. */
static void parse_link_next(const char *value, char *out, size_t size) {
    for (const char *p = strchr(value, '<'); p; p = strchr(p, '<')) {
        const char *end = strchr(p, '>');
        if (!end) return;
        const char *params_end = strchr(end, ',');
        if (!params_end) params_end = end + strlen(end);
        const char *rel = strstr(end, "rel=\"next\"");
        if (rel && rel < params_end && (size_t)(end - p - 1) < size) {
            memcpy(out, p + 1, (size_t)(end - p - 1));
            out[end - p - 1] = 0;
            return;
        }
        p = params_end;
    }
}

static size_t listing_header(char *p, size_t size, size_t n, void *ctx) {
    listing_io *io = ctx;
    size_t len = size * n;
    if (len > 5 && strncasecmp(p, "link:", 5) == 0) {
        char value[4096];
        size_t v = len - 5 < sizeof value - 1 ? len - 5 : sizeof value - 1;
        memcpy(value, p + 5, v);
        value[v] = 0;
        parse_link_next(value, io->next, sizeof io->next);
    }
    return len;
}

/* Adds one listing entry to files when the runtime needs it. */
static int take_entry(json_t *e, const char *repo, file_list *files, base_err *err) {
    const char *type = json_string_value(json_object_get(e, "type"));
    const char *path = json_string_value(json_object_get(e, "path"));
    if (!type || !path) return base_fail(err, "%s: listing entry without type or path", repo);
    if (path_unsafe(path))
        return base_fail(err, "%s: the listing names an unsafe path '%s'", repo, path);
    if (strcmp(type, "file") != 0 || !wanted(path)) return 0;
    if (!hub_component_ok(path))
        return base_fail(err, "%s: file name '%s' has characters outside A-Z a-z 0-9 . _ -", repo,
                         path);
    json_t *size = json_object_get(e, "size");
    json_t *lfs = json_object_get(e, "lfs");
    const char *oid = json_string_value(json_object_get(lfs, "oid"));
    if (!json_is_integer(size) || json_integer_value(size) < 0)
        return base_fail(err, "%s: %s: listing has no valid 'size'", repo, path);
    if (lfs && (!oid || !is_hex64(oid)))
        return base_fail(err, "%s: %s: 'lfs.oid' is not a sha256 in hex", repo, path);
    if (files->n == files->cap) {
        files->cap = files->cap ? files->cap * 2 : 16;
        files->v = base_xrealloc(files->v, files->cap * sizeof *files->v);
    }
    hub_file *f = &files->v[files->n++];
    f->name = base_xstrdup(path);
    f->size = (uint64_t)json_integer_value(size);
    snprintf(f->sha256, sizeof f->sha256, "%s", oid ? oid : "");
    return 0;
}

static int list_files(http_req *r, const hub_options *o, const char *repo, file_list *files,
                      base_err *err) {
    size_t ulen = strlen(o->endpoint) + strlen(repo) + strlen(o->revision) + 64;
    char *url = base_xmalloc(ulen);
    snprintf(url, ulen, "%s/api/models/%s/tree/%s?recursive=true", o->endpoint, repo, o->revision);
    int rc = 0;
    while (url && rc == 0) {
        listing_io io = {0};
        curl_easy_setopt(r->curl, CURLOPT_URL, url);
        curl_easy_setopt(r->curl, CURLOPT_WRITEFUNCTION, listing_write);
        curl_easy_setopt(r->curl, CURLOPT_WRITEDATA, &io);
        curl_easy_setopt(r->curl, CURLOPT_HEADERFUNCTION, listing_header);
        curl_easy_setopt(r->curl, CURLOPT_HEADERDATA, &io);
        curl_easy_setopt(r->curl, CURLOPT_TIMEOUT, 120L);
        r->errbuf[0] = 0;
        CURLcode cc = curl_easy_perform(r->curl);
        long status = 0;
        curl_easy_getinfo(r->curl, CURLINFO_RESPONSE_CODE, &status);
        json_t *root = NULL;
        if (io.too_big)
            rc = base_fail(err, "%s: the file listing is over %u bytes", url, HUB_LISTING_MAX);
        else if (cc != CURLE_OK)
            rc = base_fail(err, "%s: %s", url, http_error(r, cc));
        else if (status != 200)
            rc = base_fail(err, "%s: HTTP %ld%s", url, status, status_hint(status));
        else
            root = json_loadb(io.body ? io.body : "", io.len, 0, NULL);
        if (rc == 0 && !json_is_array(root))
            rc = base_fail(err, "%s: the file listing is not a JSON array", url);
        size_t i;
        json_t *e;
        json_array_foreach(root, i, e) {
            if (rc == 0) rc = take_entry(e, repo, files, err);
        }
        json_decref(root);
        free(io.body);
        free(url);
        url = NULL;
        /* A next page elsewhere than the endpoint would carry the token to another host. */
        size_t n = strlen(o->endpoint);
        if (rc == 0 && io.next[0]) {
            if (strncmp(io.next, o->endpoint, n) != 0 || io.next[n] != '/')
                rc = base_fail(err, "%s: the listing's next page '%s' is not on %s", repo, io.next,
                               o->endpoint);
            else
                url = base_xstrdup(io.next);
        }
    }
    curl_easy_setopt(r->curl, CURLOPT_HEADERFUNCTION, NULL);
    curl_easy_setopt(r->curl, CURLOPT_TIMEOUT, 0L);
    return rc;
}

/* ---- one file ---- */

typedef struct fetch_io {
    CURL *curl;
    FILE *f;           /* the partial file, opened for appending */
    const char *name;  /* the file's name, for the progress bar */
    uint64_t start;    /* bytes the partial file held when the request began */
    uint64_t total;    /* the file's size */
    long status;       /* the status of the response whose body is arriving */
    bool in_body;      /* the current response's body has begun */
    bool write_failed; /* a disk write failed (errno kept in write_errno) */
    int write_errno;
    bool bad_range; /* a 206 whose Content-Range does not start where we asked */
    char content_range[128];
    bool progress;
    double last_draw;
    double t0; /* base_now() when the request began: the speed counts this request's bytes */
} fetch_io;

static size_t fetch_header(char *p, size_t size, size_t n, void *ctx) {
    fetch_io *io = ctx;
    size_t len = size * n;
    /* Each response of a redirect chain starts with its status line. */
    if (len > 5 && strncmp(p, "HTTP/", 5) == 0) {
        io->in_body = false;
        io->content_range[0] = 0;
    } else if (len > 14 && strncasecmp(p, "content-range:", 14) == 0) {
        size_t v =
            len - 14 < sizeof io->content_range - 1 ? len - 14 : sizeof io->content_range - 1;
        memcpy(io->content_range, p + 14, v);
        io->content_range[v] = 0;
    }
    return len;
}

/* The first body bytes of a response: a 200 to a Range request means the server sent the whole
 * file, so the partial file starts over. */
static bool begin_body(fetch_io *io) {
    io->in_body = true;
    curl_easy_getinfo(io->curl, CURLINFO_RESPONSE_CODE, &io->status);
    if (io->status == 200 && io->start > 0) {
        if (fflush(io->f) || ftruncate(fileno(io->f), 0)) {
            io->write_failed = true;
            io->write_errno = errno;
            return false;
        }
        io->start = 0;
    } else if (io->status == 206) {
        unsigned long long first;
        if (sscanf(io->content_range, " bytes %llu-", &first) != 1 || first != io->start) {
            io->bad_range = true;
            return false;
        }
    }
    return true;
}

static size_t fetch_write(char *p, size_t size, size_t n, void *ctx) {
    fetch_io *io = ctx;
    size_t len = size * n;
    if (!io->in_body && !begin_body(io)) return 0;
    if (io->status != 200 && io->status != 206) return len;
    if (fwrite(p, 1, len, io->f) != len) {
        io->write_failed = true;
        io->write_errno = errno;
        return 0;
    }
    return len;
}

static void format_bytes(uint64_t b, char *out, size_t size) {
    if (b >= (1ull << 30))
        snprintf(out, size, "%.2f GiB", (double)b / (1ull << 30));
    else if (b >= (1ull << 20))
        snprintf(out, size, "%.1f MiB", (double)b / (1ull << 20));
    else
        snprintf(out, size, "%.1f KiB", (double)b / 1024);
}

/* "0:42", or "1:02:03" past an hour */
static void format_duration(double sec, char *out, size_t size) {
    long s = sec < 0 ? 0 : sec > 359999 ? 359999 : (long)(sec + 0.5);
    if (s >= 3600)
        snprintf(out, size, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
    else
        snprintf(out, size, "%ld:%02ld", s / 60, s % 60);
}

/* The file's bar, with the speed of this request and the time left at that speed. */
static void draw_progress(const fetch_io *io, uint64_t done) {
    char a[32], b[32], speed[32] = "", left[32] = "";
    format_bytes(done, a, sizeof a);
    format_bytes(io->total, b, sizeof b);
    double sec = base_now() - io->t0, rate = sec > 0 ? (double)(done - io->start) / sec : 0;
    if (rate > 0) {
        format_bytes((uint64_t)rate, speed, sizeof speed);
        strcat(speed, "/s");
        format_duration(done < io->total ? (double)(io->total - done) / rate : 0, left,
                        sizeof left);
    }
    int width = 30, filled = io->total ? (int)((double)done / (double)io->total * width) : width;
    char bar[31];
    for (int i = 0; i < width; i++) bar[i] = i < filled ? '#' : '.';
    bar[width] = 0;
    fprintf(stderr, "\r  %-34.34s [%s] %3d%% %10s / %s %12s %s%s \033[K", io->name, bar,
            io->total ? (int)(100.0 * (double)done / (double)io->total) : 100, a, b, speed,
            *left ? "left " : "", left);
    fflush(stderr);
}

static int fetch_progress(void *ctx, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                          curl_off_t ulnow) {
    fetch_io *io = ctx;
    double now = base_now();
    if (io->progress && io->in_body && now - io->last_draw > 0.1) {
        io->last_draw = now;
        draw_progress(io, io->start + (uint64_t)dlnow);
    }
    return 0;
}

static int64_t file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) ? (int64_t)st.st_size : -1;
}

/* One GET of `url` from byte `start` into the partial file. Returns 0 when a full response
 * arrived, 1 when the transfer broke (worth retrying), -1 on an error that a retry will not
 * fix. */
static int fetch_range(http_req *r, const char *url, const char *part, const hub_file *hf,
                       uint64_t start, const hub_options *o, base_err *err) {
    FILE *f = fopen(part, "ab");
    if (!f) return base_fail(err, "%s: %s", part, strerror(errno));
    fetch_io io = {.curl = r->curl,
                   .f = f,
                   .name = hf->name,
                   .start = start,
                   .total = hf->size,
                   .progress = o->progress,
                   .t0 = base_now()};
    char range[48];
    snprintf(range, sizeof range, "%llu-", (unsigned long long)start);
    curl_easy_setopt(r->curl, CURLOPT_URL, url);
    curl_easy_setopt(r->curl, CURLOPT_RANGE, start > 0 ? range : NULL);
    curl_easy_setopt(r->curl, CURLOPT_WRITEFUNCTION, fetch_write);
    curl_easy_setopt(r->curl, CURLOPT_WRITEDATA, &io);
    curl_easy_setopt(r->curl, CURLOPT_HEADERFUNCTION, fetch_header);
    curl_easy_setopt(r->curl, CURLOPT_HEADERDATA, &io);
    curl_easy_setopt(r->curl, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(r->curl, CURLOPT_XFERINFOFUNCTION, fetch_progress);
    curl_easy_setopt(r->curl, CURLOPT_XFERINFODATA, &io);
    r->errbuf[0] = 0;
    CURLcode cc = curl_easy_perform(r->curl);
    curl_easy_setopt(r->curl, CURLOPT_NOPROGRESS, 1L);
    curl_easy_setopt(r->curl, CURLOPT_RANGE, NULL);
    if (fclose(f) && !io.write_failed) {
        io.write_failed = true;
        io.write_errno = errno;
    }
    long status = 0;
    curl_easy_getinfo(r->curl, CURLINFO_RESPONSE_CODE, &status);
    bool whole = cc == CURLE_OK && (status == 200 || status == 206);
    if (o->progress && whole) draw_progress(&io, hf->size);
    if (o->progress && (whole || io.last_draw > 0)) fputc('\n', stderr);
    if (io.write_failed) return base_fail(err, "%s: %s", part, strerror(io.write_errno));
    if (io.bad_range)
        return base_fail(err, "%s: asked for bytes from %llu, the server sent range '%s'", url,
                         (unsigned long long)start, io.content_range);
    if (cc != CURLE_OK) {
        base_fail(err, "%s: %s", url, http_error(r, cc));
        return 1;
    }
    if (status == 416) {
        /* The partial file does not fit the server's copy: start over next time. */
        unlink(part);
        return base_fail(err,
                         "%s: the server refused to resume at byte %llu (HTTP 416); the "
                         "partial file was deleted",
                         url, (unsigned long long)start);
    }
    if (status != 200 && status != 206) {
        base_fail(err, "%s: HTTP %ld%s", url, status, status_hint(status));
        return status >= 500 ? 1 : -1;
    }
    return 0;
}

/* Checks a finished partial file by size and sha256; a mismatch deletes it. */
static int verify(const char *part, const hub_file *hf, base_err *err) {
    int64_t got = file_size(part);
    if (got != (int64_t)hf->size) {
        unlink(part);
        return base_fail(err,
                         "%s: downloaded %lld bytes, the Hub lists %llu; the download was "
                         "deleted",
                         hf->name, (long long)got, (unsigned long long)hf->size);
    }
    if (!hf->sha256[0]) return 0;
    char hex[65];
    if (hub_sha256_file(part, hex, err)) return -1;
    if (strcmp(hex, hf->sha256) != 0) {
        unlink(part);
        return base_fail(err, "%s: sha256 %s differs from the Hub's %s; the download was deleted",
                         hf->name, hex, hf->sha256);
    }
    return 0;
}

static void pause_before_retry(int attempt) {
    struct timespec ts = {.tv_sec = 0, .tv_nsec = 500000000L};
    for (int i = 0; i < attempt; i++) nanosleep(&ts, NULL);
}

static int fetch_file(http_req *r, const hub_options *o, const char *repo, const char *dir,
                      const hub_file *hf, base_err *err) {
    char *final = base_path_join(dir, hf->name);
    /* A file in place was verified before its rename. */
    if (file_size(final) == (int64_t)hf->size) {
        free(final);
        return 0;
    }
    size_t plen = strlen(final) + sizeof HUB_PARTIAL_SUFFIX;
    char *part = base_xmalloc(plen);
    snprintf(part, plen, "%s%s", final, HUB_PARTIAL_SUFFIX);
    size_t ulen = strlen(o->endpoint) + strlen(repo) + strlen(o->revision) + strlen(hf->name) + 32;
    char *url = base_xmalloc(ulen);
    snprintf(url, ulen, "%s/%s/resolve/%s/%s", o->endpoint, repo, o->revision, hf->name);
    int rc = 0;
    for (int attempt = 1;; attempt++) {
        int64_t have = file_size(part);
        if (have > (int64_t)hf->size) unlink(part);
        if (have < 0 || have > (int64_t)hf->size) have = 0;
        if ((uint64_t)have == hf->size) {
            FILE *f = fopen(part, "ab");
            if (!f || fclose(f)) rc = base_fail(err, "%s: %s", part, strerror(errno));
            break;
        }
        rc = fetch_range(r, url, part, hf, (uint64_t)have, o, err);
        if (rc != 1) break;
        if (attempt == HUB_ATTEMPTS) {
            int64_t kept = file_size(part);
            rc = base_fail_wrap(err,
                                "%s: interrupted %d times, %lld of %llu bytes kept in %s (run "
                                "again to resume)",
                                hf->name, attempt, (long long)(kept > 0 ? kept : 0),
                                (unsigned long long)hf->size, part);
            break;
        }
        pause_before_retry(attempt);
    }
    if (rc == 0) rc = verify(part, hf, err);
    if (rc == 0 && rename(part, final))
        rc = base_fail(err, "%s: rename to %s: %s", part, final, strerror(errno));
    free(url);
    free(part);
    free(final);
    return rc;
}

/* ---- the model ---- */

static int mkdir_p(const char *path, base_err *err) {
    char *p = base_xstrdup(path);
    int rc = 0;
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s) continue;
        char c = *s;
        *s = 0;
        if (mkdir(p, 0755) && errno != EEXIST)
            rc = base_fail(err, "%s: %s", p, strerror(errno));
        else if (!base_dir_exists(p))
            rc = base_fail(err, "%s: not a directory", p);
        *s = c;
        if (rc || !c) break;
    }
    free(p);
    return rc;
}

static int check_model_files(const char *repo, const file_list *files, base_err *err) {
    bool config = false, weights = false;
    for (size_t i = 0; i < files->n; i++) {
        config |= strcmp(files->v[i].name, "config.json") == 0;
        size_t n = strlen(files->v[i].name), s = strlen(".safetensors");
        weights |= n > s && strcmp(files->v[i].name + n - s, ".safetensors") == 0;
    }
    if (!config || !weights)
        return base_fail(err, "%s: the repo has no %s at its top level (not a model mlxcel runs)",
                         repo, config ? "*.safetensors" : "config.json");
    return 0;
}

static int write_marker(const char *dir, const char *repo, const hub_options *o, base_err *err) {
    char *tmp = base_path_join(dir, HUB_COMPLETE_MARKER ".tmp");
    char *marker = base_path_join(dir, HUB_COMPLETE_MARKER);
    FILE *f = fopen(tmp, "w");
    int rc = 0;
    if (!f || fprintf(f, "%s %s\n", repo, o->revision) < 0 || fclose(f))
        rc = base_fail(err, "%s: %s", tmp, strerror(errno));
    if (rc == 0 && rename(tmp, marker)) rc = base_fail(err, "%s: %s", marker, strerror(errno));
    free(tmp);
    free(marker);
    return rc;
}

static int download_into(const char *dir, const char *repo, const hub_options *o, base_err *err) {
    http_req r;
    http_init(&r, o);
    file_list files = {0};
    int rc = r.curl ? list_files(&r, o, repo, &files, err)
                    : base_fail(err, "%s: cannot start libcurl", repo);
    if (rc == 0) rc = check_model_files(repo, &files, err);
    uint64_t total = 0;
    for (size_t i = 0; i < files.n; i++) total += files.v[i].size;
    if (rc == 0 && o->progress) {
        char b[32];
        format_bytes(total, b, sizeof b);
        fprintf(stderr, "downloading %s: %zu files, %s, into %s\n", repo, files.n, b, dir);
    }
    for (size_t i = 0; i < files.n && rc == 0; i++)
        rc = fetch_file(&r, o, repo, dir, &files.v[i], err);
    if (rc == 0) rc = write_marker(dir, repo, o, err);
    files_free(&files);
    http_free(&r);
    return rc;
}

int hub_download(const hub_repo_id *id, const hub_options *o, char **dir, base_err *err) {
    char repo[2 * HUB_NAME_MAX + 2];
    snprintf(repo, sizeof repo, "%s/%s", id->owner, id->name);
    char *d = hub_store_dir(o, id);
    if (mkdir_p(d, err)) {
        free(d);
        return -1;
    }
    /* One download of a model at a time; a second process gives up rather than interleave
     * writes to the same partial files. */
    char *lock_path = base_path_join(d, ".lock");
    int lock = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    int rc = 0;
    if (lock < 0)
        rc = base_fail(err, "%s: %s", lock_path, strerror(errno));
    else if (flock(lock, LOCK_EX | LOCK_NB))
        rc = base_fail(err, "%s: another mlxcel is downloading %s (it holds %s)", repo, repo,
                       lock_path);
    char *marker = base_path_join(d, HUB_COMPLETE_MARKER);
    if (rc == 0 && !base_file_exists(marker)) {
        curl_global_init(CURL_GLOBAL_DEFAULT);
        rc = download_into(d, repo, o, err);
        curl_global_cleanup();
    }
    free(marker);
    if (lock >= 0) close(lock);
    free(lock_path);
    if (rc) {
        free(d);
        return -1;
    }
    *dir = d;
    return 0;
}

#else

int hub_download(const hub_repo_id *id, const hub_options *o, char **dir, base_err *err) {
    return base_fail(err,
                     "%s/%s is in neither the store (%s) nor the Hugging Face cache, and this "
                     "mlxcel was built without download support (libcurl); download it another "
                     "way and pass its directory to -m",
                     id->owner, id->name, o->store);
}

#endif
