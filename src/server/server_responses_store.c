/* The past responses that previous_response_id continues and GET /v1/responses/{id} shows: a
 * list in the order they were put, bounded in count and age, so that the oldest is the one
 * dropped first. Entries are deep copies so that no JSON value is shared between the threads of
 * two requests. */
#include "server/server_responses.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct entry {
    char id[48];
    json_t *items;    /* owned: the conversation */
    json_t *response; /* owned: the response object as it was answered */
    double at;        /* base_now() when put */
} entry;

struct server_store {
    pthread_mutex_t mu;
    entry *e; /* (n) oldest first; (max) allocated */
    int n, max;
    double ttl_s;
};

server_store *server_store_new(int max, double ttl_s) {
    server_store *st = base_xcalloc(1, sizeof *st);
    pthread_mutex_init(&st->mu, NULL);
    st->e = base_xcalloc((size_t)max, sizeof *st->e);
    st->max = max;
    st->ttl_s = ttl_s;
    return st;
}

void server_store_free(server_store *st) {
    if (!st) return;
    for (int i = 0; i < st->n; i++) json_decref(st->e[i].items), json_decref(st->e[i].response);
    pthread_mutex_destroy(&st->mu);
    free(st->e);
    free(st);
}

/* Drops (mu held) the k entries from the i-th. */
static void drop_at(server_store *st, int i, int k) {
    for (int j = i; j < i + k; j++) json_decref(st->e[j].items), json_decref(st->e[j].response);
    memmove(st->e + i, st->e + i + k, (size_t)(st->n - i - k) * sizeof *st->e);
    st->n -= k;
}

/* Drops (mu held) the first k entries. */
static void drop_first(server_store *st, int k) {
    drop_at(st, 0, k);
}

/* Drops (mu held) the entries past their age: they are the oldest, at the front. */
static void expire(server_store *st, double now) {
    int k = 0;
    while (k < st->n && now - st->e[k].at > st->ttl_s) k++;
    drop_first(st, k);
}

void server_store_put(server_store *st, const char *id, json_t *items, json_t *response) {
    json_t *copy = json_deep_copy(items), *resp = json_deep_copy(response);
    json_decref(items);
    json_decref(response);
    double now = base_now();
    pthread_mutex_lock(&st->mu);
    expire(st, now);
    if (st->n == st->max) drop_first(st, 1);
    entry *e = &st->e[st->n++];
    snprintf(e->id, sizeof e->id, "%s", id);
    e->items = copy;
    e->response = resp;
    e->at = now;
    pthread_mutex_unlock(&st->mu);
}

/* The entry of id (mu held), or -1. */
static int find(server_store *st, const char *id) {
    expire(st, base_now());
    for (int i = 0; i < st->n; i++)
        if (strcmp(st->e[i].id, id) == 0) return i;
    return -1;
}

json_t *server_store_get(server_store *st, const char *id, bool response) {
    pthread_mutex_lock(&st->mu);
    int i = find(st, id);
    json_t *out = i < 0 ? NULL : json_deep_copy(response ? st->e[i].response : st->e[i].items);
    pthread_mutex_unlock(&st->mu);
    return out;
}

bool server_store_delete(server_store *st, const char *id) {
    pthread_mutex_lock(&st->mu);
    int i = find(st, id);
    if (i >= 0) drop_at(st, i, 1);
    pthread_mutex_unlock(&st->mu);
    return i >= 0;
}
