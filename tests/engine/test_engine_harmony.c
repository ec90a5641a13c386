/* GPT-OSS Harmony output split into reasoning, content and tool calls (engine_harmony.c):
 * representative outputs whole, then streamed at every split point, byte by byte and in
 * random chunks (each part only grows, so the deltas add up to the whole); malformed output
 * kept as content; random marker soup never shrinks a part. Then GPT-OSS's tokenizer (its
 * Harmony special tokens) with a template in the Harmony layout: the parser is chosen from
 * the template and the tools and reasoning effort are rendered. */
#include "engine/engine_test_harmony.h"
#include "test.h"

#include <string.h>

typedef struct want {
    const char *text;
    bool reasoning, tools;
    const char *r, *c;
    int n_calls;
    const char *calls[2][2]; /* name, arguments */
} want;

static void split(const want *w, size_t n, bool final, engine_harmony_split *h) {
    engine_harmony_split_text(w->text, n, final, w->reasoning, w->tools, h);
}

/* b extends a: a's parts are prefixes of b's, a's calls b's first. */
static bool grows(const engine_harmony_split *a, const engine_harmony_split *b) {
    if (a->reasoning_len > b->reasoning_len || a->content_len > b->content_len ||
        a->n_calls > b->n_calls || memcmp(a->reasoning, b->reasoning, a->reasoning_len) != 0 ||
        memcmp(a->content, b->content, a->content_len) != 0)
        return false;
    for (int i = 0; i < a->n_calls; i++)
        if (strcmp(a->calls[i].name, b->calls[i].name) != 0 ||
            strcmp(a->calls[i].arguments, b->calls[i].arguments) != 0)
            return false;
    return true;
}

static void check_whole(const want *w) {
    engine_harmony_split h;
    split(w, strlen(w->text), true, &h);
    CHECK_MSG(strcmp(h.reasoning, w->r) == 0, "%s: reasoning [%s]", w->text, h.reasoning);
    CHECK_MSG(strcmp(h.content, w->c) == 0, "%s: content [%s]", w->text, h.content);
    CHECK_MSG(h.n_calls == w->n_calls, "%s: %d calls", w->text, h.n_calls);
    for (int i = 0; i < h.n_calls && i < w->n_calls; i++) {
        CHECK_MSG(strcmp(h.calls[i].name, w->calls[i][0]) == 0, "%s: name %s", w->text,
                  h.calls[i].name);
        CHECK_MSG(strcmp(h.calls[i].arguments, w->calls[i][1]) == 0, "%s: arguments %s", w->text,
                  h.calls[i].arguments);
    }
    engine_harmony_split_free(&h);
}

/* Streamed through the prefixes ending at cuts (ascending), then whole: every split extends
 * the one before, so what was sent is never taken back and the last adds up to the whole.
 * Returns whether it held. */
static bool stream_holds(const want *w, const size_t *cuts, int n_cuts) {
    engine_harmony_split prev, cur;
    split(w, 0, false, &prev);
    bool ok = true;
    for (int i = 0; i <= n_cuts; i++) {
        if (i < n_cuts)
            split(w, cuts[i], false, &cur);
        else
            split(w, strlen(w->text), true, &cur);
        ok = ok && grows(&prev, &cur);
        engine_harmony_split_free(&prev);
        prev = cur;
    }
    engine_harmony_split_free(&prev);
    return ok;
}

static void check_stream(const want *w) {
    size_t len = strlen(w->text), cuts[4096];
    for (size_t k = 0; k <= len; k++) /* two chunks, split at k */
        CHECK_MSG(stream_holds(w, &k, 1), "%s: split at %zu", w->text, k);
    for (size_t k = 1; k < len; k++) cuts[k - 1] = k;
    CHECK_MSG(stream_holds(w, cuts, (int)len - 1), "%s: byte by byte", w->text);
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    for (int round = 0; round < 50; round++) {
        int n = 0;
        for (size_t at = 1 + test_rand_u32(&rng) % 12; at < len; at += 1 + test_rand_u32(&rng) % 12)
            cuts[n++] = at;
        CHECK_MSG(stream_holds(w, cuts, n), "%s: random chunks, round %d", w->text, round);
    }
}

#define ANALYSIS "<|channel|>analysis<|message|>Need the weather.<|end|>"
#define CALL_W   "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"

static const want g_good[] = {
    {"<|channel|>analysis<|message|>User asks 2+2. Easy.<|end|><|start|>assistant<|channel|>final"
     "<|message|>2 + 2 = 4.",
     true,
     true,
     "User asks 2+2. Easy.",
     "2 + 2 = 4.",
     0,
     {{0}}},
    /* the stop token kept in the text ends the final message as the end of text does */
    {"<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>final<|message|>Hi!"
     "<|return|>",
     true,
     true,
     "Hm.",
     "Hi!",
     0,
     {{0}}},
    {ANALYSIS CALL_W "<|message|>{\"city\": \"Paris\", \"days\": 2}",
     true,
     true,
     "Need the weather.",
     "",
     1,
     {{"get_weather", "{\"city\":\"Paris\",\"days\":2}"}}},
    /* two calls, the second with its recipient before the channel (as GPT-OSS's template
     * writes past calls) and the bare content type */
    {ANALYSIS CALL_W "<|message|>{\"city\": \"Oslo\"}<|call|><|start|>assistant to=functions.ping"
                     "<|channel|>commentary json<|message|>{}<|call|>",
     true,
     true,
     "Need the weather.",
     "",
     2,
     {{"get_weather", "{\"city\":\"Oslo\"}"}, {"ping", "{}"}}},
    /* a preamble on the commentary channel is for the user */
    {"<|channel|>analysis<|message|>Plan.<|end|><|start|>assistant<|channel|>commentary<|message|>"
     "Looking it up.<|end|><|start|>assistant<|channel|>commentary to=functions.ping <|constrain|>"
     "json<|message|>{}",
     true,
     true,
     "Plan.",
     "Looking it up.",
     1,
     {{"ping", "{}"}}},
    /* the first message's recipient comes straight after the prompt's <|start|>assistant */
    {" to=functions.ping<|channel|>commentary json<|message|>{\"n\": [1, 2]}",
     true,
     true,
     "",
     "",
     1,
     {{"ping", "{\"n\":[1,2]}"}}},
    {"to=functions.ping<|channel|>commentary json<|message|>{}",
     true,
     true,
     "",
     "",
     1,
     {{"ping", "{}"}}},
    /* --reasoning-format none: the analysis stays in the content as written */
    {"<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>4",
     false,
     true,
     "",
     "<|channel|>analysis<|message|>Easy.<|end|>4",
     0,
     {{0}}},
    /* a request without tools gets a call as the text it is */
    {ANALYSIS CALL_W "<|message|>{}",
     true,
     false,
     "Need the weather.",
     CALL_W "<|message|>{}",
     0,
     {{0}}},
    /* cut short by max_tokens while thinking */
    {"<|channel|>analysis<|message|>Thinking about it",
     true,
     true,
     "Thinking about it",
     "",
     0,
     {{0}}},
    {"No channels at all.", true, true, "", "No channels at all.", 0, {{0}}},
};

/* Malformed output: whatever does not parse is content, as written. */
static const want g_bad[] = {
    {"<|channel|>analysis<|mess", true, true, "", "<|channel|>analysis<|mess", 0, {{0}}},
    {ANALYSIS CALL_W "<|message|>{\"city\": ",
     true,
     true,
     "Need the weather.",
     CALL_W "<|message|>{\"city\": ",
     0,
     {{0}}},
    {ANALYSIS CALL_W "<|message|>{city: Paris}<|call|>",
     true,
     true,
     "Need the weather.",
     CALL_W "<|message|>{city: Paris}<|call|>",
     0,
     {{0}}},
    {ANALYSIS CALL_W "<|message|>[1]",
     true,
     true,
     "Need the weather.",
     CALL_W "<|message|>[1]",
     0,
     {{0}}},
    {"<|channel|>analysis to=browser.search<|message|>{\"query\": \"x\"}<|call|>",
     true,
     true,
     "",
     "<|channel|>analysis to=browser.search<|message|>{\"query\": \"x\"}<|call|>",
     0,
     {{0}}},
    {"<|channel|>commentary to=functions.<|message|>{}",
     true,
     true,
     "",
     "<|channel|>commentary to=functions.<|message|>{}",
     0,
     {{0}}},
    {"<|channel|>commentary to=functions.we$ather<|message|>{}",
     true,
     true,
     "",
     "<|channel|>commentary to=functions.we$ather<|message|>{}",
     0,
     {{0}}},
    {"<|channel|>secret<|message|>x<|end|><|start|>assistant<|channel|>final<|message|>y",
     true,
     true,
     "",
     "<|channel|>secret<|message|>x<|end|>y",
     0,
     {{0}}},
    {"<|start|>user<|message|>hi<|end|>",
     true,
     true,
     "",
     "<|start|>user<|message|>hi<|end|>",
     0,
     {{0}}},
    {"<|channel|>final<|message|>the answer<|", true, true, "", "the answer<|", 0, {{0}}},
    {"<|channel|>final<|message|>a<|end|> between <|start|>assistant<|channel|>final<|message|>b",
     true,
     true,
     "",
     "a between b",
     0,
     {{0}}},
};

/* Random texts from Harmony's pieces: no split of any prefix takes back what an earlier one
 * gave, whatever the order. */
static void test_soup(void) {
    static const char *const pieces[] = {"<|start|>",
                                         "assistant",
                                         "<|channel|>",
                                         "analysis",
                                         "final",
                                         "commentary",
                                         " to=functions.f",
                                         " to=x",
                                         "<|constrain|>json",
                                         "<|message|>",
                                         "<|end|>",
                                         "<|call|>",
                                         "<|return|>",
                                         "{\"a\": 1}",
                                         "{",
                                         "}",
                                         " text ",
                                         "<|",
                                         "|>",
                                         "to="};
    uint64_t rng = 12345;
    char text[512];
    for (int round = 0; round < 300; round++) {
        size_t n = 0;
        for (int k = 1 + (int)(test_rand_u32(&rng) % 14); k > 0; k--) {
            const char *p = pieces[test_rand_u32(&rng) % (sizeof pieces / sizeof *pieces)];
            memcpy(text + n, p, strlen(p));
            n += strlen(p);
        }
        text[n] = 0;
        size_t cuts[512];
        for (size_t k = 1; k < n; k++) cuts[k - 1] = k;
        want w = {text, round % 2 == 0, round % 3 != 0, NULL, NULL, 0, {{0}}};
        CHECK_MSG(stream_holds(&w, cuts, (int)n - 1), "soup [%s]", text);
    }
}

static const char *g_tools_json =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"The "
    "weather\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": "
    "\"string\"}}}}}]";

static void test_template(void) {
    char dir[1024];
    engine_prompter *p = test_open_harmony(dir, sizeof dir);
    if (!p) return;
    base_err err = {0};
    CHECK(p->tool_format == ENGINE_TOOLS_HARMONY);
    json_t *messages =
        json_loads("[{\"role\": \"user\", \"content\": \"Weather in Oslo?\"}]", 0, NULL);
    json_t *vars = json_pack("{s:o,s:s}", "tools", json_loads(g_tools_json, 0, NULL),
                             "reasoning_effort", "high");
    engine_chat_options o = {.add_generation_prompt = true, .extra = vars};
    char *prompt = NULL;
    CHECK(engine_prompter_render(p, messages, &o, &prompt, &err) == 0);
    CHECK_MSG(prompt && strstr(prompt, "Reasoning: high") &&
                  strstr(prompt, "type get_weather = (_: {\"type\": \"object\""),
              "prompt [%s]", prompt ? prompt : err.msg);
    int32_t *ids = NULL;
    int n = 0;
    CHECK(prompt && engine_prompter_encode_rendered(p, prompt, 0, &ids, &n, &err) == 0);
    /* the markers are the single special tokens of OpenAI's harmony format guide */
    CHECK_MSG(n > 2 && ids[0] == 200006 && ids[1] == 17360 && ids[2] == 200008 &&
                  ids[n - 2] == 200006,
              "%d ids: %d %d %d .. %d", n, n ? ids[0] : -1, n > 1 ? ids[1] : -1,
              n > 2 ? ids[2] : -1, n > 1 ? ids[n - 2] : -1);
    free(ids);
    free(prompt);
    /* a call's analysis, sent back as reasoning_content, reaches the template as thinking */
    json_t *history = json_loads(
        "[{\"role\": \"user\", \"content\": \"Weather?\"}, {\"role\": \"assistant\", "
        "\"content\": null, \"reasoning_content\": \"Need the weather.\", \"tool_calls\": "
        "[{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
        "\"arguments\": \"{\\\"city\\\": \\\"Oslo\\\"}\"}}]}, {\"role\": \"tool\", "
        "\"tool_call_id\": \"c1\", \"content\": \"snow\"}]",
        0, NULL);
    prompt = NULL;
    CHECK(history && engine_prompter_render(p, history, &o, &prompt, &err) == 0);
    CHECK_MSG(prompt && strstr(prompt, ANALYSIS "<|start|>assistant to=functions.get_weather"
                                                "<|channel|>commentary json<|message|>{\"city\": "
                                                "\"Oslo\"}<|call|>"),
              "history [%s]", prompt ? prompt : err.msg);
    free(prompt);
    json_decref(history);
    json_decref(vars);
    json_decref(messages);
    engine_prompter_close(p);
}

static void test_names(void) {
    engine_tool_format f = ENGINE_TOOLS_HERMES;
    base_err err = {0};
    CHECK(engine_tool_format_from_name("harmony", &f, &err) == 0 && f == ENGINE_TOOLS_HARMONY);
    f = ENGINE_TOOLS_HERMES;
    CHECK(engine_tool_format_from_name("openai", &f, &err) == 0 && f == ENGINE_TOOLS_HARMONY);
    CHECK(strcmp(engine_tool_format_name(ENGINE_TOOLS_HARMONY), "harmony") == 0);
    CHECK(engine_tool_format_special(ENGINE_TOOLS_HARMONY));
    CHECK(engine_tool_format_detect("{{ '<tool_call>' }}") == ENGINE_TOOLS_HERMES);
    CHECK(engine_tool_format_detect("<|start|>assistant<|channel|>final<|message|>") ==
          ENGINE_TOOLS_HARMONY);
}

/* A forced call's grammar names Harmony's special tokens: over a vocabulary of single bytes
 * and those tokens it takes the call (after an analysis or not) and ends at <|call|>, and a
 * vocabulary without them refuses it by name. */
static void test_forced_grammar(void) {
    static const char *const specials[] = {"<|channel|>", "<|constrain|>", "<|message|>",
                                           "<|end|>",     "<|start|>",     "<|call|>"};
    enum { CHANNEL = 256, CONSTRAIN, MESSAGE, END, START, CALL, N };
    char byte[256][2];
    const char *bytes[N] = {0}, *special[N] = {0};
    size_t lens[N] = {0};
    for (int i = 0; i < 256; i++) {
        byte[i][0] = (char)i;
        bytes[i] = byte[i];
        lens[i] = 1;
    }
    for (int i = CHANNEL; i < N; i++) special[i] = specials[i - CHANNEL];
    gram_vocab *v = gram_vocab_new_special(bytes, lens, special, N);
    json_t *tools = json_loads(g_tools_json, 0, NULL);
    char *gbnf = NULL;
    base_err err = {0};
    CHECK_MSG(
        engine_tools_grammar(ENGINE_TOOLS_HARMONY, tools, "get_weather", false, &gbnf, &err) == 0,
        "%s", err.msg);
    gram_grammar *g = NULL;
    CHECK_MSG(gbnf && gram_parse_vocab(gbnf, strlen(gbnf), v, &g, &err) == 0, "%s", err.msg);
    static const char *const analysis[] = {"", "<|channel|>analysis<|message|>Need it.<|end|>"
                                               "<|start|>assistant"};
    for (int k = 0; g && k < 2; k++) {
        char text[256];
        snprintf(text, sizeof text,
                 "%s<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
                 "{\"city\": \"Oslo\"}<|call|>",
                 analysis[k]);
        gram_matcher *m = gram_matcher_new(g, v);
        gram_state *st = gram_state_new(m);
        bool ok = true;
        for (const char *c = text; ok && *c;) { /* a marker by its token, the rest byte by byte */
            int id = -1;
            for (int i = CHANNEL; i < N && id < 0; i++)
                if (!strncmp(c, special[i], strlen(special[i]))) id = i;
            ok = gram_state_accept(st, id >= 0 ? id : (unsigned char)*c, &err) == 0;
            c += id >= 0 ? strlen(special[id]) : 1;
        }
        CHECK_MSG(ok && gram_state_done(st), "call %d: %s", k, ok ? "not done" : err.msg);
        gram_state_free(st);
        gram_matcher_free(m);
    }
    gram_free(g);
    g = NULL;
    /* the markers' text in bytes is no call */
    gram_vocab *plain = gram_vocab_new(bytes, lens, 256);
    CHECK(gbnf && gram_parse_vocab(gbnf, strlen(gbnf), plain, &g, &err) == -1 &&
          strstr(err.msg, "'<|channel|>' is not the text of one token"));
    gram_vocab_free(plain);
    free(gbnf);
    json_decref(tools);
    gram_vocab_free(v);
}

int main(void) {
    for (size_t i = 0; i < sizeof g_good / sizeof *g_good; i++) {
        check_whole(&g_good[i]);
        check_stream(&g_good[i]);
    }
    for (size_t i = 0; i < sizeof g_bad / sizeof *g_bad; i++) {
        check_whole(&g_bad[i]);
        check_stream(&g_bad[i]);
    }
    test_soup();
    test_names();
    test_forced_grammar();
    test_template();
    TEST_MAIN_END();
}
