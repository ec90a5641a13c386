/* UTF-8 repair for text that goes into JSON: jansson refuses to build a string from bytes that
 * are not well-formed UTF-8, so a file name, a URL or a message cut at a byte limit must be
 * mended first or the response would not be built at all. */
#include "base/base.h"

#include <string.h>

/* The length of the well-formed sequence (RFC 3629: no overlong forms, no surrogates, nothing
 * past U+10FFFF) at s[0..n), or 0 when s does not start one. */
static size_t sequence_length(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    size_t len = c >= 0xC2 && c <= 0xDF   ? 2
                 : c >= 0xE0 && c <= 0xEF ? 3
                 : c >= 0xF0 && c <= 0xF4 ? 4
                                          : 0;
    if (!len || len > n) return 0;
    /* the second byte's range carries the overlong, surrogate and upper-bound rules */
    unsigned char lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
    unsigned char hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    return len;
}

size_t base_utf8_clean(char *dst, size_t cap, const char *src, size_t n) {
    static const char replacement[] = "\xEF\xBF\xBD"; /* U+FFFD */
    const unsigned char *s = (const unsigned char *)src;
    size_t out = 0;
    if (!cap) return 0;
    for (size_t i = 0; i < n;) {
        size_t len = sequence_length(s + i, n - i);
        const char *piece = len ? src + i : replacement;
        size_t piece_len = len ? len : 3;
        if (out + piece_len + 1 > cap) break;
        memcpy(dst + out, piece, piece_len);
        out += piece_len;
        i += len ? len : 1;
    }
    dst[out] = 0;
    return out;
}

char *base_utf8_dup(const char *s) {
    size_t n = strlen(s), cap = 3 * n + 1;
    char *d = base_xmalloc(cap);
    base_utf8_clean(d, cap, s, n);
    return d;
}

bool base_utf8_valid(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t len = sequence_length((const unsigned char *)s + i, n - i);
        if (!len) return false;
        i += len;
    }
    return true;
}
