/* Decoding: the decoder chain over token strings, and the incremental detokenizer.
 *
 * The chain works on raw bytes and leaves ill-formed UTF-8 in place; one lossy pass at the end
 * turns it into U+FFFD. Token text is valid UTF-8, so a byte run's unfinished sequence always
 * ends where the next token starts, and one pass over the whole output replaces exactly what
 * the reference's per-run decoding replaces.
 *
 * The stream decodes a short window: the ids whose text is not fully emitted yet. Everything
 * in the chain is concatenative at token boundaries except where a step looks at the start or
 * the end of the text (Metaspace's first token, Strip); the window marks its edges so those
 * steps act only where the full text really starts or ends. */
#include "tokenizer/tok_internal.h"

#include <stdlib.h>
#include <string.h>

/* Inverse of the byte-level map (see byte_to_cp in tok_encode.c); -1 for other characters. */
static int cp_to_byte(int32_t cp) {
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255)) return cp;
    if (cp >= 256 && cp < 256 + 33) return cp - 256;
    if (cp >= 256 + 33 && cp < 256 + 67) return 127 + (cp - 256 - 33);
    if (cp == 256 + 67) return 173;
    return -1;
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* The byte of a "<0xHH>" token, or -1. */
static int fallback_byte(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int hi = hex_digit(s[3]), lo = hex_digit(s[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

/* Appends the bytes a byte-level token stands for; a token with a character outside the map
 * is kept as it is. */
static void byte_level_token(tok_pieces *out, const char *s, size_t n) {
    size_t i = 0, l;
    while (i < n && cp_to_byte(tok_utf8_cp(s + i, &l)) >= 0) i += l;
    if (i < n) {
        tok_pieces_extend(out, s, n);
        return;
    }
    for (i = 0; i < n; i += l) {
        char b = (char)cp_to_byte(tok_utf8_cp(s + i, &l));
        tok_pieces_extend(out, &b, 1);
    }
}

static bool strip_edge_open(uint8_t flags, uint8_t edge) {
    return (flags & TOK_PIECE_GROUPED) && (flags & edge);
}

static void decode_step(const tok_decoder *d, const tok_pieces *in, tok_pieces *out, bool at_start,
                        pcre2_match_data *md, tok_buf *tmp) {
    const uint8_t edges = TOK_PIECE_EDGE_L | TOK_PIECE_EDGE_R;
    bool open_run = false; /* the last output piece is a run still taking tokens */
    for (size_t i = 0; i < in->n; i++) {
        const char *s = tok_piece(in, i);
        size_t n = in->plen[i];
        uint8_t f = in->flags[i];
        switch (d->type) {
        case TOK_DEC_REPLACE: {
            tok_pieces_push(out, "", 0, f);
            size_t at = 0, ms, me;
            while (tok_pattern_find(&d->pattern, s, n, at, md, &ms, &me)) {
                tok_pieces_extend(out, s + at, ms - at);
                tok_pieces_extend(out, d->content, d->content_len);
                at = me;
            }
            tok_pieces_extend(out, s + at, n - at);
            break;
        }
        case TOK_DEC_BYTE_FALLBACK: {
            int b = fallback_byte(s, n);
            if (b < 0) {
                tok_pieces_push(out, s, n, f);
                open_run = false;
                break;
            }
            char c = (char)b;
            if (!open_run) tok_pieces_push(out, "", 0, TOK_PIECE_GROUPED | (f & TOK_PIECE_EDGE_L));
            tok_pieces_extend(out, &c, 1);
            out->flags[out->n - 1] |= f & TOK_PIECE_EDGE_R;
            open_run = true;
            break;
        }
        case TOK_DEC_FUSE:
            if (!open_run) tok_pieces_push(out, "", 0, TOK_PIECE_GROUPED);
            tok_pieces_extend(out, s, n);
            out->flags[out->n - 1] |= f & edges;
            open_run = true;
            break;
        case TOK_DEC_BYTE_LEVEL:
            if (f & TOK_PIECE_ADDED) {
                tok_pieces_push(out, s, n, f);
                open_run = false;
                break;
            }
            if (!open_run) tok_pieces_push(out, "", 0, TOK_PIECE_GROUPED | (f & TOK_PIECE_EDGE_L));
            byte_level_token(out, s, n);
            out->flags[out->n - 1] |= f & TOK_PIECE_EDGE_R;
            open_run = true;
            break;
        case TOK_DEC_STRIP: {
            size_t a = 0, b = n, c = d->content_len;
            for (int k = 0; k < d->start && !strip_edge_open(f, TOK_PIECE_EDGE_L); k++) {
                if (b - a < c || memcmp(s + a, d->content, c) != 0) break;
                a += c;
            }
            for (int k = 0; k < d->stop && !strip_edge_open(f, TOK_PIECE_EDGE_R); k++) {
                if (b - a < c || memcmp(s + b - c, d->content, c) != 0) break;
                b -= c;
            }
            tok_pieces_push(out, s + a, b - a, f);
            break;
        }
        case TOK_DEC_METASPACE: {
            size_t rl = strlen(d->replacement);
            tmp->len = 0;
            for (size_t k = 0; k < n;) {
                if (n - k >= rl && memcmp(s + k, d->replacement, rl) == 0) {
                    tok_buf_putc(tmp, ' ');
                    k += rl;
                } else {
                    tok_buf_putc(tmp, s[k++]);
                }
            }
            size_t skip = i == 0 && at_start && d->prepend != TOK_PREPEND_NEVER && tmp->len &&
                          tmp->data[0] == ' ';
            tok_pieces_push(out, tmp->data + skip, tmp->len - skip, f);
            break;
        }
        case TOK_DEC_SEQUENCE:
            break; /* handled by decode_chain */
        }
    }
}

static void decode_chain(const tok_decoder *d, tok_pieces **in, tok_pieces **spare, bool at_start,
                         pcre2_match_data *md, tok_buf *tmp) {
    if (d->type == TOK_DEC_SEQUENCE) {
        for (size_t i = 0; i < d->n_items; i++)
            decode_chain(&d->items[i], in, spare, at_start, md, tmp);
        return;
    }
    tok_pieces_clear(*spare);
    decode_step(d, *in, *spare, at_start, md, tmp);
    tok_pieces *t = *in;
    *in = *spare;
    *spare = t;
}

static int check_id(const tok_tokenizer *tok, int32_t id, base_err *err) {
    if (id < 0 || id >= tok->n_ids || !tok->text[id])
        return base_fail(err, "detokenize: token id %d is not in the vocabulary (size %d)", id,
                         tok->n_ids);
    return 0;
}

int tok_decode_raw(const tok_tokenizer *tok, const int32_t *ids, size_t n, bool skip_special,
                   bool at_start, bool at_end, tok_buf *out, base_err *err) {
    tok_pieces a = {0}, b = {0};
    for (size_t i = 0; i < n; i++) {
        if (check_id(tok, ids[i], err)) {
            tok_pieces_free(&a);
            return -1;
        }
        if (skip_special && (tok->kind[ids[i]] & TOK_KIND_SPECIAL)) continue;
        uint8_t f = (tok->kind[ids[i]] & TOK_KIND_ADDED) ? TOK_PIECE_ADDED : 0;
        tok_pieces_push(&a, tok->text[ids[i]], tok->tlen[ids[i]], f);
    }
    if (a.n && !at_start) a.flags[0] |= TOK_PIECE_EDGE_L;
    if (a.n && !at_end) a.flags[a.n - 1] |= TOK_PIECE_EDGE_R;
    tok_buf_put(out, "", 0);
    if (!tok->decoder) {
        /* Without a decoder the reference joins tokens with spaces. */
        for (size_t i = 0; i < a.n; i++) {
            if (i > 0 || !at_start) tok_buf_putc(out, ' ');
            tok_buf_put(out, tok_piece(&a, i), a.plen[i]);
        }
        tok_pieces_free(&a);
        return 0;
    }
    tok_pieces *in = &a, *spare = &b;
    tok_buf tmp = {0};
    pcre2_match_data *md = pcre2_match_data_create(16, NULL);
    decode_chain(tok->decoder, &in, &spare, at_start, md, &tmp);
    for (size_t i = 0; i < in->n; i++) tok_buf_put(out, tok_piece(in, i), in->plen[i]);
    pcre2_match_data_free(md);
    free(tmp.data);
    tok_pieces_free(&a);
    tok_pieces_free(&b);
    return 0;
}

static int decode_text(const tok_tokenizer *tok, const int32_t *ids, size_t n, bool skip_special,
                       bool at_start, char **text, size_t *len, base_err *err) {
    *text = NULL;
    *len = 0;
    tok_buf raw = {0}, out = {0};
    if (tok_decode_raw(tok, ids, n, skip_special, at_start, true, &raw, err)) {
        free(raw.data);
        return -1;
    }
    tok_buf_put(&out, "", 0);
    tok_utf8_lossy(&out, raw.data, raw.len, NULL);
    free(raw.data);
    *text = out.data;
    *len = out.len;
    return 0;
}

int tok_decode(const tok_tokenizer *tok, const int32_t *ids, size_t n, bool skip_special,
               char **text, size_t *len, base_err *err) {
    return decode_text(tok, ids, n, skip_special, true, text, len, err);
}

int tok_decode_continued(const tok_tokenizer *tok, const int32_t *ids, size_t n, bool skip_special,
                         char **text, size_t *len, base_err *err) {
    return decode_text(tok, ids, n, skip_special, false, text, len, err);
}

int tok_token_bytes(const tok_tokenizer *tok, int32_t id, char **bytes, size_t *len,
                    base_err *err) {
    *bytes = NULL;
    *len = 0;
    tok_buf raw = {0};
    if (tok_decode_raw(tok, &id, 1, false, false, false, &raw, err)) {
        free(raw.data);
        return -1;
    }
    *bytes = raw.data;
    *len = raw.len;
    return 0;
}

/* ---- the incremental detokenizer ---- */

struct tok_stream {
    const tok_tokenizer *tok;
    bool skip_special;
    tok_ids win;    /* ids whose text is not all emitted yet */
    bool at_start;  /* win[0] is the sequence's first id */
    size_t emitted; /* bytes of the window's raw text already emitted */
    tok_buf raw, closed, scratch;
};

tok_stream *tok_stream_new(const tok_tokenizer *tok, bool skip_special) {
    tok_stream *s = base_xcalloc(1, sizeof *s);
    s->tok = tok;
    s->skip_special = skip_special;
    s->at_start = true;
    return s;
}

void tok_stream_continue(tok_stream *s) {
    s->at_start = false;
}

void tok_stream_free(tok_stream *s) {
    if (!s) return;
    free(s->win.data);
    free(s->raw.data);
    free(s->closed.data);
    free(s->scratch.data);
    free(s);
}

static void give_piece(const char *s, size_t n, char **piece, size_t *len) {
    tok_buf out = {0};
    tok_buf_put(&out, "", 0);
    tok_utf8_lossy(&out, s, n, NULL);
    *piece = out.data;
    *len = out.len;
}

int tok_stream_push(tok_stream *s, int32_t id, char **piece, size_t *len, base_err *err) {
    *piece = NULL;
    *len = 0;
    const tok_tokenizer *tok = s->tok;
    if (check_id(tok, id, err)) return -1;
    if (s->skip_special && (tok->kind[id] & TOK_KIND_SPECIAL)) {
        give_piece("", 0, piece, len);
        return 0;
    }
    tok_ids_push(&s->win, id);
    s->raw.len = 0;
    if (tok_decode_raw(tok, s->win.data, s->win.len, false, s->at_start, false, &s->raw, err))
        return -1;
    size_t complete;
    s->scratch.len = 0;
    tok_utf8_lossy(&s->scratch, s->raw.data + s->emitted, s->raw.len - s->emitted, &complete);
    size_t stable = s->emitted + complete;
    if (tok->decoder_end_strip) {
        /* What a Strip would remove if the text ended here stays back until it is safe. */
        s->closed.len = 0;
        if (tok_decode_raw(tok, s->win.data, s->win.len, false, s->at_start, true, &s->closed, err))
            return -1;
        if (s->closed.len < stable) stable = s->closed.len;
    }
    give_piece(s->raw.data + s->emitted, stable - s->emitted, piece, len);
    s->emitted = stable;
    if (s->emitted == s->raw.len && s->emitted > 0) {
        s->win.len = 0;
        s->emitted = 0;
        s->at_start = false;
    }
    return 0;
}

int tok_stream_flush(tok_stream *s, char **piece, size_t *len, base_err *err) {
    *piece = NULL;
    *len = 0;
    s->closed.len = 0;
    if (tok_decode_raw(s->tok, s->win.data, s->win.len, false, s->at_start, true, &s->closed, err))
        return -1;
    give_piece(s->closed.data + s->emitted, s->closed.len - s->emitted, piece, len);
    s->win.len = 0;
    s->emitted = 0;
    s->at_start = true;
    return 0;
}
