/* tokenizer_config.json: the chat template and the special-token variables. */
#include "chat/chat_internal.h"

#include <stdlib.h>
#include <string.h>

static const char *const g_special[] = {"bos_token", "eos_token", "unk_token", "pad_token",
                                        "sep_token", "cls_token", "mask_token"};

/* The template from a `chat_template` value: a string, or [{name, template}, ...] where the
 * one named "default" is taken. */
static int template_of(const json_t *v, const char *path, char **source, base_err *err) {
    if (json_is_string(v)) {
        *source = base_xstrdup(json_string_value(v));
        return 0;
    }
    if (!json_is_array(v))
        return base_fail(err, "%s: chat_template must be a string or a list", path);
    size_t i;
    json_t *item;
    json_array_foreach(v, i, item) {
        const char *name = json_string_value(json_object_get(item, "name"));
        const char *tpl = json_string_value(json_object_get(item, "template"));
        if (name && tpl && strcmp(name, "default") == 0) {
            *source = base_xstrdup(tpl);
            return 0;
        }
    }
    return base_fail(err, "%s: chat_template list has no template named \"default\"", path);
}

static int load_json(const char *path, json_t **out, base_err *err) {
    json_error_t je;
    /* Configs carry integers past 64 bits (model_max_length = 1e30 written out). */
    *out = json_load_file(path, JSON_DECODE_INT_AS_REAL, &je);
    if (!*out) return base_fail(err, "%s: line %d: %s", path, je.line, je.text);
    if (!json_is_object(*out)) {
        json_decref(*out);
        return base_fail(err, "%s: expected a JSON object", path);
    }
    return 0;
}

/* chat_template.jinja, or chat_template.json's "chat_template", when the config has none. */
static int load_side_template(const char *dir, char **source, base_err *err) {
    char *path = base_path_join(dir, "chat_template.jinja");
    int rc = 0;
    if (base_file_exists(path)) {
        rc = base_read_file(path, source, NULL, err);
        free(path);
        return rc;
    }
    free(path);
    path = base_path_join(dir, "chat_template.json");
    if (base_file_exists(path)) {
        json_t *j;
        rc = load_json(path, &j, err);
        if (!rc) {
            json_t *v = json_object_get(j, "chat_template");
            if (v) rc = template_of(v, path, source, err);
            json_decref(j);
        }
    }
    free(path);
    return rc;
}

int chat_config_load(const char *dir, char **source, json_t **special_vars, base_err *err) {
    *source = NULL;
    *special_vars = NULL;
    char *path = base_path_join(dir, "tokenizer_config.json");
    json_t *cfg;
    if (load_json(path, &cfg, err)) {
        free(path);
        return -1;
    }
    json_t *vars = json_object();
    int rc = 0;
    for (size_t i = 0; i < sizeof g_special / sizeof g_special[0] && !rc; i++) {
        json_t *v = json_object_get(cfg, g_special[i]);
        if (json_is_object(v)) v = json_object_get(v, "content");
        if (!v || json_is_null(v)) continue;
        if (!json_is_string(v)) {
            rc = base_fail(err, "%s: %s must be a string or an object with \"content\"", path,
                           g_special[i]);
            break;
        }
        json_object_set(vars, g_special[i], v);
    }
    json_t *tpl = json_object_get(cfg, "chat_template");
    if (!rc && tpl && !json_is_null(tpl))
        rc = template_of(tpl, path, source, err);
    else if (!rc)
        rc = load_side_template(dir, source, err);
    json_decref(cfg);
    free(path);
    if (rc) {
        free(*source);
        *source = NULL;
        json_decref(vars);
        return -1;
    }
    *special_vars = vars;
    return 0;
}
