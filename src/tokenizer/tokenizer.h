/* tokenizer: Hugging Face tokenizer.json (BPE models, byte-level as in Llama 3 / Qwen / GPT-2
 * and SentencePiece-style with byte fallback as in Llama 2 / Mistral / Gemma), the normalizers,
 * pre-tokenizers, added tokens, post-processors and decoders those files use, and an incremental
 * detokenizer for streaming. Reads only its own files.
 *
 * Where the Rust `tokenizers` crate and the JavaScript `@huggingface/tokenizers` disagree, the
 * JavaScript one (our conformance reference) is followed; the choices are noted where made.
 * Decoding never applies `clean_up_tokenization_spaces`: text is returned exactly as the
 * decoder chain produces it, so that streamed pieces always add up to a full decode. */
#ifndef MLXCEL_TOKENIZER_H
#define MLXCEL_TOKENIZER_H

#include "base/base.h"

typedef struct tok_tokenizer tok_tokenizer;

/* dir holds tokenizer.json and optionally tokenizer_config.json (bos/eos strings,
 * add_bos_token / add_eos_token for the Llama and Gemma tokenizer classes, additional special
 * tokens). Every id must lie below twice the number of tokens tokenizer.json lists
 * (model.vocab entries plus added_tokens) and below vocab_size, the model's (config.json's,
 * which may pad past the tokenizer; 0 when there is no model). *out: free with tok_free. */
int tok_load(const char *dir, int vocab_size, tok_tokenizer **out, base_err *err);
/* Same, from the two files' contents (config_json may be NULL); `name` labels error messages. */
int tok_load_json(const char *tokenizer_json, size_t len, const char *config_json,
                  size_t config_len, const char *name, int vocab_size, tok_tokenizer **out,
                  base_err *err);
void tok_free(tok_tokenizer *tok);

/* Number of ids, including added tokens (largest id + 1). */
int tok_vocab_size(const tok_tokenizer *tok);

/* Encodes UTF-8 text (invalid UTF-8 is an error naming the byte offset). ids: caller frees (may
 * be NULL when *n is 0). add_special: apply the post-processor (e.g. BOS) as Hugging Face does
 * with add_special_tokens=True. Thread-safe. */
int tok_encode(const tok_tokenizer *tok, const char *text, size_t len, bool add_special,
               int32_t **ids, size_t *n, base_err *err);

/* Decodes ids to text (invalid UTF-8 from byte tokens becomes U+FFFD). text: caller frees;
 * NUL-terminated. skip_special: drop special tokens. An id outside the vocabulary is an error. */
int tok_decode(const tok_tokenizer *tok, const int32_t *ids, size_t n, bool skip_special,
               char **text, size_t *len, base_err *err);
/* tok_decode of ids that continue a text (generated after a prompt): what a decoder strips at
 * the start of a text, SentencePiece's leading space, is kept, so that the continuation joins
 * its prompt as the decode of the two together would. */
int tok_decode_continued(const tok_tokenizer *tok, const int32_t *ids, size_t n, bool skip_special,
                         char **text, size_t *len, base_err *err);

/* The bytes token `id` stands for in the middle of a text: the decoder chain without the
 * repair of ill-formed UTF-8, so a byte-fallback token gives its one byte (what OpenAI's
 * logprobs "bytes" carry). *bytes is caller-freed. */
int tok_token_bytes(const tok_tokenizer *tok, int32_t id, char **bytes, size_t *len, base_err *err);
int32_t tok_token_id(const tok_tokenizer *tok, const char *token); /* -1 if absent */
const char *tok_token_text(const tok_tokenizer *tok, int32_t id);  /* raw vocab string or NULL */
bool tok_is_special(const tok_tokenizer *tok, int32_t id);

/* BOS/EOS as tokenizer_config.json names them ("" when absent), and their ids (-1). */
const char *tok_bos_token(const tok_tokenizer *tok);
int32_t tok_bos_id(const tok_tokenizer *tok);
const char *tok_eos_token(const tok_tokenizer *tok);
int32_t tok_eos_id(const tok_tokenizer *tok);

/* The ids the post-processor puts before and after one sequence (what tok_encode's
 * add_special adds: BOS, CLS, SEP, EOS as the tokenizer has them); owned by the tokenizer. */
void tok_special_ends(const tok_tokenizer *tok, const int32_t **prefix, size_t *n_prefix,
                      const int32_t **suffix, size_t *n_suffix);

/* Incremental detokenizer for streaming: push one id, get the newly complete text. A piece
 * holds only whole UTF-8 characters; text that a later token could still change (a split
 * multi-byte character, a trailing character a Strip decoder would remove at the end) is held
 * back. The concatenation of every piece and the flush equals tok_decode of all the ids.
 * One stream belongs to one thread; the tokenizer must outlive it. */
typedef struct tok_stream tok_stream;
tok_stream *tok_stream_new(const tok_tokenizer *tok, bool skip_special);
/* *piece: caller frees, NUL-terminated, possibly empty. */
int tok_stream_push(tok_stream *s, int32_t id, char **piece, size_t *len, base_err *err);
/* The stream continues a text, as tok_decode_continued: call before the first push. */
void tok_stream_continue(tok_stream *s);
/* Emits what was held back and resets the stream for a new sequence. */
int tok_stream_flush(tok_stream *s, char **piece, size_t *len, base_err *err);
void tok_stream_free(tok_stream *s);

#endif
