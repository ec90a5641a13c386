/* Loading tokenizer.json and tokenizer_config.json into a tok_tokenizer. */
#include "tokenizer/tok_internal.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static char *dup_bytes(const char *s, size_t n) {
    char *d = base_xmalloc(n + 1);
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

static bool get_bool(const json_t *obj, const char *key, bool dflt) {
    const json_t *v = json_object_get(obj, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static const char *get_type(const json_t *obj) {
    const char *t = json_string_value(json_object_get(obj, "type"));
    return t ? t : "(none)";
}

/* Copies a one-character string option (Metaspace's replacement) into out. */
static int get_char_option(const json_t *obj, const char *key, const char *dflt, char out[8],
                           const char *where, base_err *err) {
    const char *s = json_string_value(json_object_get(obj, key));
    if (!s) s = dflt;
    size_t n = strlen(s);
    if (n == 0 || n >= 8 || tok_utf8_check(s, n) != n || tok_utf8_len((unsigned char)s[0]) != n)
        return base_fail(err, "%s: \"%s\" must be one character", where, key);
    memcpy(out, s, n + 1);
    return 0;
}

static int get_prepend_scheme(const json_t *obj, tok_prepend_scheme *out, const char *where,
                              base_err *err) {
    const char *s = json_string_value(json_object_get(obj, "prepend_scheme"));
    if (!s) {
        /* Files from before prepend_scheme existed say add_prefix_space instead. */
        *out = get_bool(obj, "add_prefix_space", true) ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
        return 0;
    }
    if (strcmp(s, "always") == 0)
        *out = TOK_PREPEND_ALWAYS;
    else if (strcmp(s, "first") == 0)
        *out = TOK_PREPEND_FIRST;
    else if (strcmp(s, "never") == 0)
        *out = TOK_PREPEND_NEVER;
    else
        return base_fail(err, "%s: unknown prepend_scheme '%s'", where, s);
    return 0;
}

/* ---- normalizers ---- */

static int parse_normalizer(const json_t *j, tok_normalizer *nm, const char *where, base_err *err) {
    memset(nm, 0, sizeof *nm);
    const char *type = get_type(j);
    static const struct {
        const char *name;
        tok_norm_type type;
    } simple[] = {{"NFC", TOK_NORM_NFC},
                  {"NFD", TOK_NORM_NFD},
                  {"NFKC", TOK_NORM_NFKC},
                  {"NFKD", TOK_NORM_NFKD},
                  {"Lowercase", TOK_NORM_LOWERCASE},
                  {"StripAccents", TOK_NORM_STRIP_ACCENTS}};
    for (size_t i = 0; i < sizeof simple / sizeof simple[0]; i++)
        if (strcmp(type, simple[i].name) == 0) {
            nm->type = simple[i].type;
            return 0;
        }
    if (strcmp(type, "Strip") == 0) {
        nm->type = TOK_NORM_STRIP;
        nm->left = get_bool(j, "strip_left", true);
        nm->right = get_bool(j, "strip_right", true);
        return 0;
    }
    if (strcmp(type, "Replace") == 0 || strcmp(type, "Prepend") == 0) {
        bool replace = type[0] == 'R';
        nm->type = replace ? TOK_NORM_REPLACE : TOK_NORM_PREPEND;
        const json_t *c = json_object_get(j, replace ? "content" : "prepend");
        if (!json_is_string(c))
            return base_fail(err, "%s: %s normalizer needs a string \"%s\"", where, type,
                             replace ? "content" : "prepend");
        nm->content_len = json_string_length(c);
        nm->content = dup_bytes(json_string_value(c), nm->content_len);
        if (replace)
            return tok_pattern_parse(json_object_get(j, "pattern"), &nm->pattern, where, err);
        return 0;
    }
    if (strcmp(type, "Sequence") == 0) {
        nm->type = TOK_NORM_SEQUENCE;
        const json_t *arr = json_object_get(j, "normalizers");
        if (!json_is_array(arr)) return base_fail(err, "%s: Sequence needs \"normalizers\"", where);
        nm->n_items = json_array_size(arr);
        nm->items = base_xcalloc(nm->n_items ? nm->n_items : 1, sizeof *nm->items);
        for (size_t i = 0; i < nm->n_items; i++)
            if (parse_normalizer(json_array_get(arr, i), &nm->items[i], where, err)) return -1;
        return 0;
    }
    return base_fail(err, "%s: normalizer type '%s' is not supported", where, type);
}

void tok_normalizer_free(tok_normalizer *nm) {
    for (size_t i = 0; i < nm->n_items; i++) tok_normalizer_free(&nm->items[i]);
    free(nm->items);
    free(nm->content);
    tok_pattern_free(&nm->pattern);
}

/* ---- pre-tokenizers ---- */

/* GPT-2's split, which ByteLevel applies when use_regex is set. */
static const char *const k_gpt2_regex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int parse_behavior(const json_t *j, tok_split_behavior *out, const char *where,
                          base_err *err) {
    const char *b = json_string_value(json_object_get(j, "behavior"));
    static const struct {
        const char *name;
        tok_split_behavior b;
    } names[] = {{"Removed", TOK_SPLIT_REMOVED},
                 {"Isolated", TOK_SPLIT_ISOLATED},
                 {"MergedWithPrevious", TOK_SPLIT_MERGED_PREV},
                 {"MergedWithNext", TOK_SPLIT_MERGED_NEXT},
                 {"Contiguous", TOK_SPLIT_CONTIGUOUS}};
    if (!b) return base_fail(err, "%s: Split needs \"behavior\"", where);
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(b, names[i].name) == 0) {
            *out = names[i].b;
            return 0;
        }
    return base_fail(err, "%s: unknown Split behavior '%s'", where, b);
}

static int parse_pretok(const json_t *j, tok_pretok *pt, const char *where, base_err *err) {
    memset(pt, 0, sizeof *pt);
    const char *type = get_type(j);
    if (strcmp(type, "Split") == 0) {
        pt->type = TOK_PRE_SPLIT;
        pt->invert = get_bool(j, "invert", false);
        if (parse_behavior(j, &pt->behavior, where, err)) return -1;
        return tok_pattern_parse(json_object_get(j, "pattern"), &pt->pattern, where, err);
    }
    if (strcmp(type, "ByteLevel") == 0) {
        pt->type = TOK_PRE_BYTE_LEVEL;
        pt->add_prefix_space = get_bool(j, "add_prefix_space", false);
        pt->use_regex = get_bool(j, "use_regex", true);
        if (!pt->use_regex) return 0;
        json_t *pat = json_pack("{s:s}", "Regex", k_gpt2_regex);
        int rc = tok_pattern_parse(pat, &pt->pattern, where, err);
        json_decref(pat);
        return rc;
    }
    if (strcmp(type, "Metaspace") == 0) {
        pt->type = TOK_PRE_METASPACE;
        pt->split = get_bool(j, "split", true);
        if (get_char_option(j, "replacement", "\xE2\x96\x81", pt->replacement, where, err) ||
            get_prepend_scheme(j, &pt->prepend, where, err))
            return -1;
        pt->pattern.len = strlen(pt->replacement);
        pt->pattern.str = dup_bytes(pt->replacement, pt->pattern.len);
        return 0;
    }
    if (strcmp(type, "Digits") == 0) {
        pt->type = TOK_PRE_DIGITS;
        pt->individual_digits = get_bool(j, "individual_digits", false);
        return 0;
    }
    if (strcmp(type, "Sequence") == 0) {
        pt->type = TOK_PRE_SEQUENCE;
        const json_t *arr = json_object_get(j, "pretokenizers");
        if (!json_is_array(arr))
            return base_fail(err, "%s: Sequence needs \"pretokenizers\"", where);
        pt->n_items = json_array_size(arr);
        pt->items = base_xcalloc(pt->n_items ? pt->n_items : 1, sizeof *pt->items);
        for (size_t i = 0; i < pt->n_items; i++)
            if (parse_pretok(json_array_get(arr, i), &pt->items[i], where, err)) return -1;
        return 0;
    }
    return base_fail(err, "%s: pre_tokenizer type '%s' is not supported", where, type);
}

void tok_pretok_free(tok_pretok *pt) {
    for (size_t i = 0; i < pt->n_items; i++) tok_pretok_free(&pt->items[i]);
    free(pt->items);
    tok_pattern_free(&pt->pattern);
}

/* ---- decoders ---- */

static bool decoder_strips_end(const tok_decoder *d) {
    if (d->type == TOK_DEC_STRIP && d->stop > 0) return true;
    for (size_t i = 0; i < d->n_items; i++)
        if (decoder_strips_end(&d->items[i])) return true;
    return false;
}

static int parse_decoder(const json_t *j, tok_decoder *d, const char *where, base_err *err) {
    memset(d, 0, sizeof *d);
    const char *type = get_type(j);
    if (strcmp(type, "ByteLevel") == 0)
        d->type = TOK_DEC_BYTE_LEVEL;
    else if (strcmp(type, "ByteFallback") == 0)
        d->type = TOK_DEC_BYTE_FALLBACK;
    else if (strcmp(type, "Fuse") == 0)
        d->type = TOK_DEC_FUSE;
    else if (strcmp(type, "Metaspace") == 0) {
        d->type = TOK_DEC_METASPACE;
        return get_char_option(j, "replacement", "\xE2\x96\x81", d->replacement, where, err) ||
                       get_prepend_scheme(j, &d->prepend, where, err)
                   ? -1
                   : 0;
    } else if (strcmp(type, "Strip") == 0) {
        d->type = TOK_DEC_STRIP;
        const json_t *c = json_object_get(j, "content");
        const char *s = json_is_string(c) ? json_string_value(c) : " ";
        d->content_len = json_is_string(c) ? json_string_length(c) : 1;
        if (d->content_len == 0)
            return base_fail(err, "%s: Strip needs a non-empty content", where);
        d->content = dup_bytes(s, d->content_len);
        d->start = (int)json_integer_value(json_object_get(j, "start"));
        d->stop = (int)json_integer_value(json_object_get(j, "stop"));
        if (d->start < 0 || d->stop < 0)
            return base_fail(err, "%s: Strip start/stop must not be negative", where);
    } else if (strcmp(type, "Replace") == 0) {
        d->type = TOK_DEC_REPLACE;
        const json_t *c = json_object_get(j, "content");
        if (!json_is_string(c))
            return base_fail(err, "%s: Replace needs a string \"content\"", where);
        d->content_len = json_string_length(c);
        d->content = dup_bytes(json_string_value(c), d->content_len);
        return tok_pattern_parse(json_object_get(j, "pattern"), &d->pattern, where, err);
    } else if (strcmp(type, "Sequence") == 0) {
        d->type = TOK_DEC_SEQUENCE;
        const json_t *arr = json_object_get(j, "decoders");
        if (!json_is_array(arr)) return base_fail(err, "%s: Sequence needs \"decoders\"", where);
        d->n_items = json_array_size(arr);
        d->items = base_xcalloc(d->n_items ? d->n_items : 1, sizeof *d->items);
        for (size_t i = 0; i < d->n_items; i++)
            if (parse_decoder(json_array_get(arr, i), &d->items[i], where, err)) return -1;
    } else {
        return base_fail(err, "%s: decoder type '%s' is not supported", where, type);
    }
    return 0;
}

void tok_decoder_free(tok_decoder *d) {
    for (size_t i = 0; i < d->n_items; i++) tok_decoder_free(&d->items[i]);
    free(d->items);
    free(d->content);
    tok_pattern_free(&d->pattern);
}

/* ---- post-processors: for one sequence they reduce to ids before and after it ---- */

static void ids_append(int32_t **arr, size_t *n, const int32_t *add, size_t n_add) {
    *arr = base_xrealloc(*arr, (*n + n_add + 1) * sizeof **arr);
    if (n_add) memcpy(*arr + *n, add, n_add * sizeof *add);
    *n += n_add;
}

static int template_special(tok_tokenizer *tok, const json_t *specials, const char *name,
                            tok_ids *out, const char *where, base_err *err) {
    const json_t *ids = json_object_get(json_object_get(specials, name), "ids");
    if (json_is_array(ids)) {
        for (size_t i = 0; i < json_array_size(ids); i++) {
            json_int_t id = json_integer_value(json_array_get(ids, i));
            if (id < 0 || id >= tok->n_ids || !tok->text[id])
                return base_fail(err, "%s: special token '%s' has id %lld outside the vocabulary",
                                 where, name, (long long)id);
            tok_ids_push(out, (int32_t)id);
        }
        return 0;
    }
    int32_t id = tok_map_get(tok, name, strlen(name));
    if (id < 0)
        return base_fail(err, "%s: special token '%s' is not in the vocabulary", where, name);
    tok_ids_push(out, id);
    return 0;
}

static int parse_template(tok_tokenizer *tok, const json_t *j, tok_ids *pre, tok_ids *post,
                          const char *where, base_err *err) {
    const json_t *single = json_object_get(j, "single");
    const json_t *specials = json_object_get(j, "special_tokens");
    if (!json_is_array(single))
        return base_fail(err, "%s: TemplateProcessing needs a \"single\" template", where);
    bool seen_a = false;
    for (size_t i = 0; i < json_array_size(single); i++) {
        const json_t *item = json_array_get(single, i);
        const json_t *sp = json_object_get(item, "SpecialToken");
        if (sp) {
            const char *name = json_string_value(json_object_get(sp, "id"));
            if (!name) return base_fail(err, "%s: SpecialToken without an id", where);
            if (template_special(tok, specials, name, seen_a ? post : pre, where, err)) return -1;
        } else if (json_object_get(item, "Sequence")) {
            seen_a = true;
        } else {
            return base_fail(err, "%s: template item %zu is neither SpecialToken nor Sequence",
                             where, i);
        }
    }
    return 0;
}

static int parse_post(tok_tokenizer *tok, const json_t *j, const char *where, base_err *err) {
    if (!j || json_is_null(j)) return 0;
    const char *type = get_type(j);
    if (strcmp(type, "ByteLevel") == 0) return 0; /* only moves offsets */
    if (strcmp(type, "Sequence") == 0) {
        const json_t *arr = json_object_get(j, "processors");
        for (size_t i = 0; i < json_array_size(arr); i++)
            if (parse_post(tok, json_array_get(arr, i), where, err)) return -1;
        return 0;
    }
    tok_ids pre = {0}, post = {0};
    int rc = 0;
    if (strcmp(type, "TemplateProcessing") == 0) {
        rc = parse_template(tok, j, &pre, &post, where, err);
    } else if (strcmp(type, "BertProcessing") == 0 || strcmp(type, "RobertaProcessing") == 0) {
        const json_t *cls = json_object_get(j, "cls"), *sep = json_object_get(j, "sep");
        json_int_t cls_id = json_integer_value(json_array_get(cls, 1));
        json_int_t sep_id = json_integer_value(json_array_get(sep, 1));
        bool cls_ok = cls_id >= 0 && cls_id < tok->n_ids,
             sep_ok = sep_id >= 0 && sep_id < tok->n_ids;
        if (!json_is_integer(json_array_get(cls, 1)) || !json_is_integer(json_array_get(sep, 1)))
            rc = base_fail(err, "%s: %s needs \"cls\" and \"sep\" pairs", where, type);
        else if (!cls_ok || !sep_ok)
            rc = base_fail(
                err, "%s: post_processor: %s id %lld is past the %d ids of the vocabulary", where,
                cls_ok ? "sep" : "cls", (long long)(cls_ok ? sep_id : cls_id), tok->n_ids);
        else {
            tok_ids_push(&pre, (int32_t)cls_id);
            tok_ids_push(&post, (int32_t)sep_id);
        }
    } else {
        rc = base_fail(err, "%s: post_processor type '%s' is not supported", where, type);
    }
    if (rc == 0) {
        /* A later processor wraps what the earlier ones made. */
        int32_t *prefix = NULL;
        size_t n_prefix = 0;
        ids_append(&prefix, &n_prefix, pre.data, pre.len);
        ids_append(&prefix, &n_prefix, tok->prefix, tok->n_prefix);
        free(tok->prefix);
        tok->prefix = prefix;
        tok->n_prefix = n_prefix;
        ids_append(&tok->suffix, &tok->n_suffix, post.data, post.len);
    }
    free(pre.data);
    free(post.data);
    return rc;
}

/* ---- vocabulary and added tokens ---- */

static int set_token(tok_tokenizer *tok, json_int_t id, const char *s, size_t n, const char *where,
                     base_err *err) {
    if (id < 0 || id >= tok->n_ids) return base_fail(err, "%s: bad id %lld", where, (long long)id);
    if (tok->text[id]) {
        if (tok->tlen[id] == n && memcmp(tok->text[id], s, n) == 0) return 0;
        free(tok->text[id]);
    }
    tok->text[id] = dup_bytes(s, n);
    tok->tlen[id] = (uint32_t)n;
    return 0;
}

/* Ids index the tables load_vocab allocates, so a file must not choose their size: an id of
 * 2^31 - 2 in a four-token file cost 7 seconds and 16 GiB of address space. Ids must be below
 * twice the number of tokens the file lists (model.vocab entries plus added_tokens), which
 * keeps the tables proportional to the file and leaves room for holes (real vocabularies
 * are dense, or nearly: tiktoken conversions skip a few ids before their special tokens), and
 * below the model's vocab_size when there is a model (its embedding has that many rows, often
 * padded past the tokenizer; an id past it has no row). */
typedef struct id_limit {
    json_int_t listed; /* tokens the file lists */
    json_int_t n;      /* every id is below this */
    int vocab_size;    /* the model's, 0 when unknown */
} id_limit;

static int past_limit(const id_limit *lim, json_int_t id, const char *what, const char *where,
                      base_err *err) {
    if (lim->vocab_size > 0 && id >= lim->vocab_size)
        return base_fail(err, "%s: %s has id %lld, past the model's vocab_size %d", where, what,
                         (long long)id, lim->vocab_size);
    return base_fail(err, "%s: %s has id %lld, past twice the %lld tokens the file lists", where,
                     what, (long long)id, (long long)lim->listed);
}

static int load_vocab(tok_tokenizer *tok, const json_t *vocab, const json_t *added, int vocab_size,
                      const char *where, base_err *err) {
    id_limit lim = {(json_int_t)(json_object_size(vocab) + json_array_size(added)), 0, vocab_size};
    lim.n = 2 * lim.listed;
    if (vocab_size > 0 && vocab_size < lim.n) lim.n = vocab_size;
    if (lim.n > INT32_MAX) lim.n = INT32_MAX; /* n_ids is an int32_t */
    json_int_t max_id = -1;
    const char *key;
    const json_t *val;
    size_t klen;
    char what[160];
    json_object_keylen_foreach((json_t *)vocab, key, klen, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0)
            return base_fail(err, "%s: model.vocab['%s'] is not a valid id", where, key);
        if (json_integer_value(val) >= lim.n) {
            snprintf(what, sizeof what, "model.vocab['%s']", key);
            return past_limit(&lim, json_integer_value(val), what, where, err);
        }
        if (json_integer_value(val) > max_id) max_id = json_integer_value(val);
    }
    for (size_t i = 0; i < json_array_size(added); i++) {
        const json_t *a = json_array_get(added, i);
        const json_t *id = json_object_get(a, "id");
        const char *content = json_string_value(json_object_get(a, "content"));
        if (!json_is_integer(id) || json_integer_value(id) < 0 || !content)
            return base_fail(err, "%s: added_tokens[%zu] needs an id and a content", where, i);
        if (json_integer_value(id) >= lim.n) {
            snprintf(what, sizeof what, "added_tokens[%zu] '%s'", i, content);
            return past_limit(&lim, json_integer_value(id), what, where, err);
        }
        if (json_integer_value(id) > max_id) max_id = json_integer_value(id);
    }
    tok->n_ids = (int32_t)(max_id + 1);
    size_t n = (size_t)tok->n_ids;
    tok->text = base_xcalloc(n ? n : 1, sizeof *tok->text);
    tok->tlen = base_xcalloc(n ? n : 1, sizeof *tok->tlen);
    tok->kind = base_xcalloc(n ? n : 1, sizeof *tok->kind);
    json_object_keylen_foreach((json_t *)vocab, key, klen, val) {
        if (set_token(tok, json_integer_value(val), key, klen, where, err)) return -1;
    }
    for (int32_t id = 0; id < tok->n_ids; id++)
        if (tok->text[id]) tok_map_put(tok, id);

    tok->n_added = json_array_size(added);
    tok->added = base_xcalloc(tok->n_added ? tok->n_added : 1, sizeof *tok->added);
    for (size_t i = 0; i < tok->n_added; i++) {
        const json_t *a = json_array_get(added, i);
        const json_t *c = json_object_get(a, "content");
        tok_added *t = &tok->added[i];
        t->id = (int32_t)json_integer_value(json_object_get(a, "id"));
        t->len = json_string_length(c);
        t->content = dup_bytes(json_string_value(c), t->len);
        t->special = get_bool(a, "special", false);
        t->lstrip = get_bool(a, "lstrip", false);
        t->rstrip = get_bool(a, "rstrip", false);
        t->single_word = get_bool(a, "single_word", false);
        t->normalized = get_bool(a, "normalized", !t->special);
        if (set_token(tok, t->id, t->content, t->len, where, err)) return -1;
        tok->kind[t->id] |= TOK_KIND_ADDED | (t->special ? TOK_KIND_SPECIAL : 0);
        tok_map_put(tok, t->id);
    }
    return 0;
}

static void build_tries(tok_tokenizer *tok) {
    for (size_t i = 0; i < tok->n_added; i++) {
        const tok_added *a = &tok->added[i];
        if (a->normalized && tok->normalizer) {
            tok_buf nb = {0};
            base_err ignore;
            if (tok_normalize(tok->normalizer, a->content, a->len, &nb, NULL, &ignore) == 0)
                tok_trie_add(&tok->trie_norm, nb.data, nb.len, (int32_t)i);
            free(nb.data);
        } else {
            tok_trie_add(&tok->trie_raw, a->content, a->len, (int32_t)i);
        }
    }
}

/* ---- tokenizer_config.json ---- */

/* bos_token and friends are a string, an AddedToken object or null. */
static const char *config_token(const json_t *cfg, const char *key) {
    const json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_is_string(v) ? json_string_value(v) : "";
}

static void load_config(tok_tokenizer *tok, const json_t *cfg) {
    tok->bos = base_xstrdup(config_token(cfg, "bos_token"));
    tok->eos = base_xstrdup(config_token(cfg, "eos_token"));
    tok->bos_id = tok->bos[0] ? tok_map_get(tok, tok->bos, strlen(tok->bos)) : -1;
    tok->eos_id = tok->eos[0] ? tok_map_get(tok, tok->eos, strlen(tok->eos)) : -1;
    const json_t *extra = json_object_get(cfg, "additional_special_tokens");
    for (size_t i = 0; i < json_array_size(extra); i++) {
        const json_t *e = json_array_get(extra, i);
        if (json_is_object(e)) e = json_object_get(e, "content");
        if (!json_is_string(e)) continue;
        int32_t id = tok_map_get(tok, json_string_value(e), json_string_length(e));
        if (id >= 0) tok->kind[id] |= TOK_KIND_SPECIAL;
    }
    /* transformers rebuilds the post-processor of these classes from add_bos_token and
     * add_eos_token, whatever tokenizer.json says. */
    const char *cls = json_string_value(json_object_get(cfg, "tokenizer_class"));
    static const char *const rebuilt[] = {"LlamaTokenizer",     "LlamaTokenizerFast",
                                          "GemmaTokenizer",     "GemmaTokenizerFast",
                                          "CodeLlamaTokenizer", "CodeLlamaTokenizerFast"};
    bool rebuild = false;
    for (size_t i = 0; cls && i < sizeof rebuilt / sizeof rebuilt[0]; i++)
        rebuild |= strcmp(cls, rebuilt[i]) == 0;
    if (!rebuild ||
        (!json_object_get(cfg, "add_bos_token") && !json_object_get(cfg, "add_eos_token")))
        return;
    tok->n_prefix = tok->n_suffix = 0;
    if (get_bool(cfg, "add_bos_token", true) && tok->bos_id >= 0)
        ids_append(&tok->prefix, &tok->n_prefix, &tok->bos_id, 1);
    if (get_bool(cfg, "add_eos_token", false) && tok->eos_id >= 0)
        ids_append(&tok->suffix, &tok->n_suffix, &tok->eos_id, 1);
}

/* ---- entry points ---- */

static int load_parts(tok_tokenizer *tok, const json_t *root, const json_t *cfg, int vocab_size,
                      base_err *err) {
    const char *w = tok->name;
    const json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) return base_fail(err, "%s: no \"model\" object", w);
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (mtype && strcmp(mtype, "BPE") != 0)
        return base_fail(err, "%s: model type '%s' is not supported (only BPE)", w, mtype);
    if (!mtype && !json_object_get(model, "merges"))
        return base_fail(err, "%s: model without a type or merges is not supported (only BPE)", w);
    const json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab)) return base_fail(err, "%s: model.vocab must be an object", w);
    const json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_array(added) && !json_is_null(added))
        return base_fail(err, "%s: added_tokens must be an array", w);
    if (load_vocab(tok, vocab, added, vocab_size, w, err)) return -1;
    if (tok_bpe_init(tok, model, err)) return -1;

    const json_t *j = json_object_get(root, "normalizer");
    if (j && !json_is_null(j)) {
        tok->normalizer = base_xcalloc(1, sizeof *tok->normalizer);
        if (parse_normalizer(j, tok->normalizer, w, err)) return -1;
    }
    j = json_object_get(root, "pre_tokenizer");
    if (j && !json_is_null(j)) {
        tok->pretok = base_xcalloc(1, sizeof *tok->pretok);
        if (parse_pretok(j, tok->pretok, w, err)) return -1;
    }
    j = json_object_get(root, "decoder");
    if (j && !json_is_null(j)) {
        tok->decoder = base_xcalloc(1, sizeof *tok->decoder);
        if (parse_decoder(j, tok->decoder, w, err)) return -1;
        tok->decoder_end_strip = decoder_strips_end(tok->decoder);
    }
    if (parse_post(tok, json_object_get(root, "post_processor"), w, err)) return -1;
    build_tries(tok);
    load_config(tok, cfg);
    return 0;
}

int tok_load_json(const char *tokenizer_json, size_t len, const char *config_json,
                  size_t config_len, const char *name, int vocab_size, tok_tokenizer **out,
                  base_err *err) {
    *out = NULL;
    json_error_t jerr;
    json_t *root = json_loadb(tokenizer_json, len, JSON_ALLOW_NUL, &jerr);
    if (!root)
        return base_fail(err, "%s: bad JSON at line %d column %d: %s", name, jerr.line, jerr.column,
                         jerr.text);
    json_t *cfg = NULL;
    if (config_json) {
        cfg = json_loadb(config_json, config_len, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &jerr);
        if (!cfg) {
            json_decref(root);
            return base_fail(err, "%s: tokenizer_config.json: bad JSON at line %d column %d: %s",
                             name, jerr.line, jerr.column, jerr.text);
        }
    }
    tok_tokenizer *tok = base_xcalloc(1, sizeof *tok);
    tok->name = base_xstrdup(name);
    tok->bpe.unk_id = -1;
    int rc = json_is_object(root) ? load_parts(tok, root, cfg, vocab_size, err)
                                  : base_fail(err, "%s: top level is not an object", name);
    json_decref(root);
    json_decref(cfg);
    if (rc) {
        tok_free(tok);
        return -1;
    }
    *out = tok;
    return 0;
}

int tok_load(const char *dir, int vocab_size, tok_tokenizer **out, base_err *err) {
    *out = NULL;
    char *path = base_path_join(dir, "tokenizer.json");
    char *cfg_path = base_path_join(dir, "tokenizer_config.json");
    char *data = NULL, *cfg = NULL;
    size_t len = 0, cfg_len = 0;
    int rc = base_read_file(path, &data, &len, err);
    if (rc == 0 && base_file_exists(cfg_path)) rc = base_read_file(cfg_path, &cfg, &cfg_len, err);
    if (rc == 0) rc = tok_load_json(data, len, cfg, cfg_len, path, vocab_size, out, err);
    free(data);
    free(cfg);
    free(path);
    free(cfg_path);
    return rc;
}

void tok_free(tok_tokenizer *tok) {
    if (!tok) return;
    for (int32_t i = 0; i < tok->n_ids; i++) free(tok->text[i]);
    free(tok->text);
    free(tok->tlen);
    free(tok->kind);
    free(tok->map.slot);
    free(tok->map.hash);
    for (size_t i = 0; i < tok->n_added; i++) free(tok->added[i].content);
    free(tok->added);
    tok_trie_free(&tok->trie_raw);
    tok_trie_free(&tok->trie_norm);
    if (tok->normalizer) tok_normalizer_free(tok->normalizer);
    if (tok->pretok) tok_pretok_free(tok->pretok);
    if (tok->decoder) tok_decoder_free(tok->decoder);
    free(tok->normalizer);
    free(tok->pretok);
    free(tok->decoder);
    free(tok->prefix);
    free(tok->suffix);
    tok_bpe_free(&tok->bpe);
    free(tok->bos);
    free(tok->eos);
    free(tok->name);
    free(tok);
}

/* ---- lookups ---- */

int tok_vocab_size(const tok_tokenizer *tok) {
    return tok->n_ids;
}

int32_t tok_token_id(const tok_tokenizer *tok, const char *token) {
    return tok_map_get(tok, token, strlen(token));
}

const char *tok_token_text(const tok_tokenizer *tok, int32_t id) {
    return id >= 0 && id < tok->n_ids ? tok->text[id] : NULL;
}

bool tok_is_special(const tok_tokenizer *tok, int32_t id) {
    return id >= 0 && id < tok->n_ids && (tok->kind[id] & TOK_KIND_SPECIAL);
}

const char *tok_bos_token(const tok_tokenizer *tok) {
    return tok->bos ? tok->bos : "";
}

int32_t tok_bos_id(const tok_tokenizer *tok) {
    return tok->bos_id;
}

void tok_special_ends(const tok_tokenizer *tok, const int32_t **prefix, size_t *n_prefix,
                      const int32_t **suffix, size_t *n_suffix) {
    *prefix = tok->prefix;
    *n_prefix = tok->n_prefix;
    *suffix = tok->suffix;
    *n_suffix = tok->n_suffix;
}

const char *tok_eos_token(const tok_tokenizer *tok) {
    return tok->eos ? tok->eos : "";
}

int32_t tok_eos_id(const tok_tokenizer *tok) {
    return tok->eos_id;
}
