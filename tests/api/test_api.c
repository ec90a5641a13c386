/* The public C API on the demo model, through include/mlxcel.h alone: streamed pieces add up
 * to the blocking result, a stop string cuts the text before it, cancel from another thread
 * ends a request with one "cancelled" final call, the chat path renders through the model's
 * template, and bad input gives one clear line naming what is wrong. */
#include "mlxcel.h"
#include "test.h"

#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>

#define PROMPT "Once upon a time"

typedef struct stream {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char text[8192]; /* (len + 1) */
    size_t len;
    int n_pieces;      /* calls with finish NONE */
    int n_final;       /* must end at exactly 1 */
    int n_after_final; /* calls after the final one: must stay 0 */
    mlxcel_finish finish;
    int n_prompt, n_generated;
    /* cancel test: the first piece waits until the other thread has cancelled */
    bool hold_first;
    bool got_first, cancelled;
} stream;

static void stream_init(stream *s) {
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
}

static void stream_destroy(stream *s) {
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
}

static void on_event(void *ctx, const mlxcel_event *ev) {
    stream *s = ctx;
    pthread_mutex_lock(&s->mu);
    if (s->n_final) s->n_after_final++;
    if (s->len + ev->text_len < sizeof s->text) {
        memcpy(s->text + s->len, ev->text, ev->text_len);
        s->len += ev->text_len;
        s->text[s->len] = '\0';
    }
    if (ev->finish == MLXCEL_FINISH_NONE) {
        s->n_pieces++;
        if (s->hold_first && !s->got_first) {
            s->got_first = true;
            pthread_cond_broadcast(&s->cv);
            while (!s->cancelled) pthread_cond_wait(&s->cv, &s->mu);
        }
    } else {
        s->finish = ev->finish;
        s->n_prompt = ev->n_prompt;
        s->n_generated = ev->n_generated;
        s->n_final++;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
}

/* A request that never gets its final call is a failure, not a hang: the engine may still
 * hold s, so the test ends here. */
static void stream_wait(stream *s) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 30;
    pthread_mutex_lock(&s->mu);
    while (!s->n_final)
        if (pthread_cond_timedwait(&s->cv, &s->mu, &until)) {
            fprintf(stderr, "no final call within 30 s\n");
            exit(1);
        }
    pthread_mutex_unlock(&s->mu);
}

static mlxcel_request greedy(const char *prompt, int max_tokens) {
    mlxcel_request r = mlxcel_request_default();
    r.prompt = prompt;
    r.max_tokens = max_tokens;
    r.temperature = 0;
    return r;
}

static void test_stream_equals_blocking(mlxcel_engine *e) {
    mlxcel_request r = greedy(PROMPT, 24);
    char err[256] = "";
    char *text = NULL;
    CHECK_MSG(mlxcel_generate(e, &r, &text, err, sizeof err) == 0, "%s", err);
    stream s;
    stream_init(&s);
    uint64_t id = 0;
    int rc = mlxcel_submit(e, &r, on_event, &s, &id, err, sizeof err);
    CHECK_MSG(rc == 0, "%s", err);
    if (rc == 0) stream_wait(&s);
    CHECK(id > 0);
    CHECK(text && strcmp(s.text, text) == 0);
    CHECK(strlen(text) > 0);
    CHECK(s.n_pieces > 0);
    CHECK(s.n_final == 1);
    CHECK(s.finish == MLXCEL_FINISH_LENGTH || s.finish == MLXCEL_FINISH_STOP);
    CHECK(s.n_prompt > 0);
    CHECK(s.n_generated > 0 && s.n_generated <= 24);
    mlxcel_free(text);
    stream_destroy(&s);
}

/* Length of the UTF-8 character starting at p. */
static size_t utf8_len(const char *p) {
    unsigned char c = (unsigned char)*p;
    return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

static void test_stop_string(mlxcel_engine *e) {
    mlxcel_request r = greedy(PROMPT, 32);
    char err[256] = "";
    char *full = NULL;
    CHECK_MSG(mlxcel_generate(e, &r, &full, err, sizeof err) == 0, "%s", err);
    if (!full || strlen(full) < 4) {
        CHECK_MSG(0, "greedy text too short for a stop string: '%s'", full ? full : "");
        mlxcel_free(full);
        return;
    }
    /* two whole characters from the middle of the text */
    size_t at = strlen(full) / 2;
    while (at > 0 && ((unsigned char)full[at] & 0xC0) == 0x80) at--;
    size_t n = utf8_len(full + at);
    n += utf8_len(full + at + n);
    char stop[16] = "";
    memcpy(stop, full + at, n);
    size_t expect = (size_t)(strstr(full, stop) - full);
    const char *stops[] = {stop};
    r.stop = stops;
    r.n_stop = 1;
    stream s;
    stream_init(&s);
    int rc = mlxcel_submit(e, &r, on_event, &s, NULL, err, sizeof err);
    CHECK_MSG(rc == 0, "%s", err);
    if (rc == 0) stream_wait(&s);
    CHECK_MSG(s.len == expect && strncmp(s.text, full, expect) == 0,
              "stop '%s': got '%s', want the first %zu bytes of '%s'", stop, s.text, expect, full);
    CHECK(s.finish == MLXCEL_FINISH_STOP);
    CHECK(s.n_final == 1);
    mlxcel_free(full);
    stream_destroy(&s);
}

typedef struct canceller {
    mlxcel_engine *e;
    stream *s;
    uint64_t id;
} canceller;

static void *cancel_thread(void *arg) {
    canceller *c = arg;
    pthread_mutex_lock(&c->s->mu);
    while (!c->s->got_first) pthread_cond_wait(&c->s->cv, &c->s->mu);
    pthread_mutex_unlock(&c->s->mu);
    mlxcel_cancel(c->e, c->id);
    pthread_mutex_lock(&c->s->mu);
    c->s->cancelled = true;
    pthread_cond_broadcast(&c->s->cv);
    pthread_mutex_unlock(&c->s->mu);
    return NULL;
}

static void test_cancel(mlxcel_engine *e) {
    mlxcel_request r = greedy(PROMPT, 0);
    stream s;
    stream_init(&s);
    s.hold_first = true;
    canceller c = {.e = e, .s = &s};
    char err[256] = "";
    /* the callback holds the engine until the other thread has cancelled, so the request
     * cannot run to its length limit first */
    pthread_mutex_lock(&s.mu);
    int rc = mlxcel_submit(e, &r, on_event, &s, &c.id, err, sizeof err);
    CHECK_MSG(rc == 0, "%s", err);
    if (rc) {
        pthread_mutex_unlock(&s.mu);
        stream_destroy(&s);
        return;
    }
    pthread_t t;
    pthread_create(&t, NULL, cancel_thread, &c);
    pthread_mutex_unlock(&s.mu);
    stream_wait(&s);
    pthread_join(t, NULL);
    CHECK(s.finish == MLXCEL_FINISH_CANCELLED);
    CHECK(s.n_final == 1);
    CHECK(s.n_after_final == 0);
    mlxcel_cancel(e, c.id); /* after the end: ignored */
    stream_destroy(&s);
}

static void test_chat_template(mlxcel_engine *e) {
    /* the demo model's template: "{{ bos_token }}[INST] {content} [/INST]" for a user turn;
     * the text path adds the BOS itself */
    mlxcel_message msgs[] = {{"user", "Tell me a story"}};
    mlxcel_request chat = greedy(NULL, 16);
    chat.messages = msgs;
    chat.n_messages = 1;
    mlxcel_request raw = greedy("[INST] Tell me a story [/INST]", 16);
    stream a, b;
    stream_init(&a);
    stream_init(&b);
    char err[256] = "";
    int rc_a = mlxcel_submit(e, &chat, on_event, &a, NULL, err, sizeof err);
    CHECK_MSG(rc_a == 0, "%s", err);
    int rc_b = mlxcel_submit(e, &raw, on_event, &b, NULL, err, sizeof err);
    CHECK_MSG(rc_b == 0, "%s", err);
    if (rc_a == 0) stream_wait(&a);
    if (rc_b == 0) stream_wait(&b);
    CHECK_MSG(a.n_prompt == b.n_prompt, "chat prompt %d tokens, rendered by hand %d", a.n_prompt,
              b.n_prompt);
    CHECK_MSG(strcmp(a.text, b.text) == 0, "chat '%s' vs rendered by hand '%s'", a.text, b.text);
    CHECK(a.n_final == 1 && a.n_generated > 0);
    msgs[0].content = NULL;
    CHECK(mlxcel_submit(e, &chat, on_event, &a, NULL, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "messages[0].content"), "%s", err);
    stream_destroy(&a);
    stream_destroy(&b);
}

static void test_bad_requests(mlxcel_engine *e) {
    mlxcel_request r = greedy(NULL, 4);
    stream s;
    stream_init(&s);
    char err[256] = "";
    char *text = (char *)"untouched";
    CHECK(mlxcel_submit(e, &r, on_event, &s, NULL, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "prompt") && strstr(err, "NULL"), "%s", err);
    err[0] = '\0';
    CHECK(mlxcel_generate(e, &r, &text, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "prompt"), "%s", err);
    CHECK(strcmp(text, "untouched") == 0);
    CHECK(s.n_final == 0 && s.n_pieces == 0); /* a refused request gets no calls */
    stream_destroy(&s);
}

static void test_open_errors(const char *model) {
    mlxcel_options o = mlxcel_options_default();
    o.device = "cpu";
    mlxcel_engine *e = (mlxcel_engine *)&o; /* any non-NULL value: failure must clear it */
    char err[512] = "";
    CHECK(mlxcel_open("/nonexistent/mlxcel-model", &o, &e, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "/nonexistent/mlxcel-model"), "%s", err);
    CHECK(e == NULL);
    o.device = "tpu";
    err[0] = '\0';
    CHECK(mlxcel_open(model, &o, &e, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "device") && strstr(err, "tpu"), "%s", err);
    CHECK(e == NULL);
    CHECK(mlxcel_open(NULL, &o, &e, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "model_dir"), "%s", err);
    /* a short buffer still gets a terminated, truncated line */
    char tiny[8];
    CHECK(mlxcel_open(model, &o, &e, tiny, sizeof tiny) == -1);
    CHECK(strlen(tiny) == sizeof tiny - 1);
}

int main(void) {
    CHECK(strcmp(mlxcel_version(), MLXCEL_VERSION_STRING) == 0);
    char model[4096];
    snprintf(model, sizeof model, "%s/models/demo", test_source_dir());
    test_open_errors(model);
    mlxcel_options o = mlxcel_options_default();
    o.device = "cpu";
    o.n_threads = 2;
    o.ctx_size = 256;
    o.n_parallel = 2;
    mlxcel_engine *e = NULL;
    char err[512] = "";
    CHECK_MSG(mlxcel_open(model, &o, &e, err, sizeof err) == 0, "%s", err);
    if (!e) TEST_MAIN_END();
    test_stream_equals_blocking(e);
    test_stop_string(e);
    test_cancel(e);
    test_chat_template(e);
    test_bad_requests(e);
    mlxcel_close(e);
    mlxcel_close(NULL);
    TEST_MAIN_END();
}
