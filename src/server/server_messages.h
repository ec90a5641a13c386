/* Anthropic's Messages API: the request side (server_messages.c) and the shapes of the answer
 * (server_messages_out.c). */
#ifndef MLXCEL_SERVER_MESSAGES_H
#define MLXCEL_SERVER_MESSAGES_H

#include "server/server_internal.h"

/* The writer of one answer in Anthropic's shapes: a message naming model_id (copied), whose
 * stop_reason tells max_tokens from the end of the context by max_tokens. */
server_writer server_messages_writer(const char *model_id, int max_tokens);

/* An Anthropic request body (/v1/messages, or /v1/messages/count_tokens when counting) put
 * as the OpenAI chat request that means the same (*chat: caller decrefs); a thinking budget
 * goes into o. On failure err names the field at fault. */
int server_messages_to_chat(json_t *body, bool counting, server_options *o, json_t **chat,
                            base_err *err);

#endif
