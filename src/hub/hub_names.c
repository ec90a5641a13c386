/* Repo ids, and where the caches are. */
#include "hub/hub.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

bool hub_component_ok(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > HUB_NAME_MAX || strcmp(s, ".") == 0 || strcmp(s, "..") == 0) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-';
        if (!ok) return false;
    }
    return true;
}

int hub_repo_parse(const char *text, hub_repo_id *id, base_err *err) {
    const char *slash = strchr(text, '/');
    const char *owner = HUB_DEFAULT_OWNER, *name = text;
    size_t owner_len = strlen(owner);
    if (slash) {
        owner = text;
        owner_len = (size_t)(slash - text);
        name = slash + 1;
    }
    if (owner_len == 0 || owner_len > HUB_NAME_MAX)
        return base_fail(err,
                         "'%s': a repo id is owner/name with a non-empty owner of at most %d "
                         "characters",
                         text, HUB_NAME_MAX);
    memcpy(id->owner, owner, owner_len);
    id->owner[owner_len] = 0;
    if (strchr(name, '/')) return base_fail(err, "'%s': a repo id has one '/' (owner/name)", text);
    if (!hub_component_ok(id->owner) || !hub_component_ok(name))
        return base_fail(err,
                         "'%s': owner and name must be 1 to %d of A-Z a-z 0-9 . _ - and not "
                         "'.' or '..'",
                         text, HUB_NAME_MAX);
    snprintf(id->name, sizeof id->name, "%s", name);
    return 0;
}

/* Copies `value`, then `suffix`, into out; false when it does not fit. */
static bool set_path(char *out, size_t size, const char *value, const char *suffix) {
    int n = snprintf(out, size, "%s%s", value, suffix);
    return n > 0 && (size_t)n < size;
}

/* $XDG_CACHE_HOME, else ~/.cache, then /leaf. */
static bool user_cache(char *out, size_t size, const char *leaf) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char buf[HUB_PATH_MAX];
    if (xdg && xdg[0] == '/')
        snprintf(buf, sizeof buf, "%s/%s", xdg, leaf);
    else if (home && home[0])
        snprintf(buf, sizeof buf, "%s/.cache/%s", home, leaf);
    else
        return false;
    return set_path(out, size, buf, "");
}

static bool env_set(const char *name) {
    const char *v = getenv(name);
    return v && v[0];
}

int hub_options_from_env(hub_options *o, base_err *err) {
    memset(o, 0, sizeof *o);
    bool ok = env_set("MLXCEL_CACHE_DIR")
                  ? set_path(o->store, sizeof o->store, getenv("MLXCEL_CACHE_DIR"), "")
                  : user_cache(o->store, sizeof o->store, "mlxcel");
    if (!ok) return base_fail(err, "no model store: set MLXCEL_CACHE_DIR (or HOME)");
    if (env_set("HF_HUB_CACHE"))
        ok = set_path(o->hf_cache, sizeof o->hf_cache, getenv("HF_HUB_CACHE"), "");
    else if (env_set("HF_HOME"))
        ok = set_path(o->hf_cache, sizeof o->hf_cache, getenv("HF_HOME"), "/hub");
    else
        ok = user_cache(o->hf_cache, sizeof o->hf_cache, "huggingface/hub");
    /* Without any Hugging Face cache there is simply nothing to reuse. */
    if (!ok) o->hf_cache[0] = 0;
    const char *endpoint =
        env_set("HF_ENDPOINT") ? getenv("HF_ENDPOINT") : "https://huggingface.co";
    if (!set_path(o->endpoint, sizeof o->endpoint, endpoint, ""))
        return base_fail(err, "HF_ENDPOINT: longer than %zu characters", sizeof o->endpoint - 1);
    size_t n = strlen(o->endpoint);
    while (n > 0 && o->endpoint[n - 1] == '/') o->endpoint[--n] = 0;
    o->token = env_set("HF_TOKEN") ? getenv("HF_TOKEN") : NULL;
    o->revision = "main";
    const char *off = getenv("HF_HUB_OFFLINE");
    /* The truthy spellings huggingface_hub accepts. */
    o->offline = off && (strcmp(off, "1") == 0 || strcasecmp(off, "on") == 0 ||
                         strcasecmp(off, "yes") == 0 || strcasecmp(off, "true") == 0);
    o->progress = isatty(STDERR_FILENO);
    return 0;
}
