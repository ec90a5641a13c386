/* OpenAI's Responses API: the request side (server_responses.c), the shapes of the answer
 * (server_responses_out.c) and the store of past responses that previous_response_id reads
 * (server_responses_store.c). */
#ifndef MLXCEL_SERVER_RESPONSES_H
#define MLXCEL_SERVER_RESPONSES_H

#include "server/server_internal.h"

/* Past responses kept for previous_response_id: at most this many, each for this long. The
 * store lives in memory only, so both bound what a client can make the server hold. */
#define SERVER_RESPONSES_MAX   256
#define SERVER_RESPONSES_TTL_S 3600.0

/* Thread-safe: requests put and get from their own connection threads. */
server_store *server_store_new(int max, double ttl_s);
void server_store_free(server_store *st);
/* Keeps response id: its conversation (its input items then its output items) and the
 * response object as answered, both stolen; drops the expired entries and, past max, the
 * oldest. */
void server_store_put(server_store *st, const char *id, json_t *items, json_t *response);
/* A deep copy of the conversation of id, or with `response` of its response object (caller
 * decrefs); NULL when it is unknown, expired, evicted or deleted. */
json_t *server_store_get(server_store *st, const char *id, bool response);
/* Forgets id; false when it was not kept. */
bool server_store_delete(server_store *st, const char *id);

/* What the writer of one answer needs besides the sequence. */
typedef struct server_responses_req {
    const char *model_id; /* copied */
    json_t *echo;  /* stolen: the request's fields a response repeats (instructions, tools...) */
    json_t *input; /* stolen: the conversation's items before the answer */
    server_store *store; /* where the answer is kept once complete; NULL: not kept */
} server_responses_req;

/* The writer of one answer in the Responses API's shapes. */
server_writer server_responses_writer(const server_responses_req *r);

/* A Responses request body put as the OpenAI chat request that means the same (*chat: caller
 * decrefs), with the fields the response repeats (*echo) and the conversation's items (*input,
 * previous_response_id's first); both caller decrefs. On failure err names the field at fault. */
int server_responses_to_chat(json_t *body, const server_options *o, server_store *store,
                             json_t **chat, json_t **echo, json_t **input, base_err *err);

#endif
