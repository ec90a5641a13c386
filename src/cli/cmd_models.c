/* `mlxcel list` and `mlxcel rm`, and the -m resolution of the model commands. */
#include "cli/cmd_models.h"
#include "hub/hub.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

bool cli_take_model(cli_parser *p, const char **model, bool *offline) {
    if (cli_take(p, "-m", "--model", model)) return true;
    if (cli_flag(p, NULL, "--offline")) {
        *offline = true;
        return true;
    }
    return false;
}

int cli_model_resolve(const char **model, bool offline, char *dir, size_t dir_size, base_err *err) {
    /* What cannot be a repo id is a path: the loader then names the file missing there. */
    hub_repo_id id;
    if (!base_dir_exists(*model) && hub_repo_parse(*model, &id, NULL)) return 0;
    hub_options o;
    if (hub_options_from_env(&o, err)) return -1;
    o.offline |= offline;
    char *found;
    if (hub_resolve(*model, &o, &found, err)) return -1;
    size_t n = strlen(found);
    int rc = n < dir_size ? 0 : base_fail(err, "%s: path longer than %zu bytes", found, dir_size);
    if (rc == 0) {
        memcpy(dir, found, n + 1);
        *model = dir;
    }
    free(found);
    return rc;
}

static const char *g_list_help =
    "usage: mlxcel list [--json]\n"
    "\n"
    "Lists the models in mlxcel's store ($MLXCEL_CACHE_DIR, default ~/.cache/mlxcel) and the\n"
    "usable ones in the Hugging Face cache ($HF_HUB_CACHE or $HF_HOME/hub), with their size on\n"
    "disk. A store download that was cut short shows as partial; running the model resumes it.\n"
    "\n"
    "options:\n"
    "      --json               one JSON array of {name, source, complete, bytes, path}\n"
    "\n"
    "example:\n"
    "  mlxcel list\n";

static const char *source_name(const hub_model *m) {
    if (m->source == HUB_SOURCE_HF_CACHE) return "hf-cache";
    return m->complete ? "store" : "partial";
}

static void print_json(const hub_model *m, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_pack("{s:s, s:s, s:b, s:I, s:s}", "name", m[i].name, "source",
                                           source_name(&m[i]), "complete", m[i].complete, "bytes",
                                           (json_int_t)m[i].bytes, "path", m[i].dir));
    char *s = json_dumps(a, JSON_COMPACT | JSON_PRESERVE_ORDER);
    printf("%s\n", s);
    free(s);
    json_decref(a);
}

static void print_table(const hub_options *o, const hub_model *m, size_t n) {
    if (n == 0) {
        printf("no models in %s%s%s\n", o->store, o->hf_cache[0] ? " or " : "", o->hf_cache);
        return;
    }
    int width = 4;
    for (size_t i = 0; i < n; i++)
        if ((int)strlen(m[i].name) > width) width = (int)strlen(m[i].name);
    printf("%-*s  %10s  %-8s  %s\n", width, "NAME", "SIZE", "SOURCE", "PATH");
    for (size_t i = 0; i < n; i++) {
        char size[32];
        double b = (double)m[i].bytes;
        if (b >= 1 << 30)
            snprintf(size, sizeof size, "%.2f GiB", b / (1 << 30));
        else if (b >= 1 << 20)
            snprintf(size, sizeof size, "%.1f MiB", b / (1 << 20));
        else
            snprintf(size, sizeof size, "%.1f KiB", b / 1024);
        printf("%-*s  %10s  %-8s  %s\n", width, m[i].name, size, source_name(&m[i]), m[i].dir);
    }
}

int cli_cmd_list(int argc, char **argv) {
    bool json = false;
    cli_parser p;
    cli_parser_init(&p, "list", argc, argv);
    while (cli_next(&p)) {
        if (cli_flag(&p, "-h", "--help")) {
            fputs(g_list_help, stdout);
            return CLI_OK;
        }
        if (cli_flag(&p, NULL, "--json")) {
            json = true;
            continue;
        }
        cli_unknown(&p);
    }
    if (cli_done(&p)) return CLI_USAGE;
    base_err err;
    hub_options o;
    hub_model *models;
    size_t n;
    if (hub_options_from_env(&o, &err) || hub_list(&o, &models, &n, &err)) return cli_fail(&err);
    if (json)
        print_json(models, n);
    else
        print_table(&o, models, n);
    hub_models_free(models, n);
    return CLI_OK;
}

static const char *g_rm_help =
    "usage: mlxcel rm NAME...\n"
    "\n"
    "Deletes models (owner/name, or a name meaning mlx-community/name) from mlxcel's store,\n"
    "finished or partial. The Hugging Face cache is never modified.\n"
    "\n"
    "example:\n"
    "  mlxcel rm mlx-community/Llama-3.2-1B-Instruct-4bit\n";

int cli_cmd_rm(int argc, char **argv) {
    const char **names = base_xcalloc((size_t)argc, sizeof *names);
    int n_names = 0;
    cli_parser p;
    cli_parser_init(&p, "rm", argc, argv);
    while (cli_next(&p)) {
        if (cli_flag(&p, "-h", "--help")) {
            fputs(g_rm_help, stdout);
            free(names);
            return CLI_OK;
        }
        if (cli_arg(&p)[0] != '-') {
            names[n_names++] = cli_arg(&p);
            continue;
        }
        cli_unknown(&p);
    }
    if (p.status == CLI_OK && n_names == 0) cli_usage(&p, "rm: give the NAME of a model");
    base_err err;
    hub_options o;
    int rc = cli_done(&p);
    if (rc == CLI_OK && hub_options_from_env(&o, &err)) rc = cli_fail(&err);
    for (int i = 0; i < n_names && (rc == CLI_OK || i > 0); i++) {
        if (hub_remove(names[i], &o, &err))
            rc = cli_fail(&err);
        else
            printf("removed %s\n", names[i]);
    }
    free(names);
    return rc;
}
