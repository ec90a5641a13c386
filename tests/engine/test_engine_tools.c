/* Tool calls and reasoning in generated text: each wire format parsed whole and as it streams
 * in (every prefix), malformed output left as content, the forced-call grammars accepting
 * the calls they are for and only those, and <think> split from the answer. */
#include "engine/engine.h"
#include "test.h"

#include <string.h>

static const char *g_tools_json =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": "
    "{\"type\": \"integer\"}, \"unit\": {\"type\": \"string\", \"enum\": [\"c\", \"f\"]}}, "
    "\"required\": [\"city\"]}}}, {\"type\": \"function\", \"function\": {\"name\": \"ping\"}}]";

typedef struct expect {
    const char *content; /* text[0, content_len) then text[rest_start, len) */
    int n_calls;
    const char *calls[2][2]; /* name, arguments */
} expect;

static void check_scan(engine_tool_format f, const char *text, bool forced, const json_t *tools,
                       const expect *x) {
    engine_tool_scan s;
    size_t len = strlen(text);
    engine_tools_scan(f, text, len, true, forced, tools, &s);
    char content[1024];
    snprintf(content, sizeof content, "%.*s%.*s", (int)s.content_len, text,
             (int)(len - s.rest_start), text + s.rest_start);
    CHECK_MSG(strcmp(content, x->content) == 0, "%s: %s: content [%s]", engine_tool_format_name(f),
              text, content);
    CHECK_MSG(s.n_calls == x->n_calls, "%s: %s: %d calls", engine_tool_format_name(f), text,
              s.n_calls);
    for (int i = 0; i < s.n_calls && i < x->n_calls; i++) {
        CHECK_MSG(strcmp(s.calls[i].name, x->calls[i][0]) == 0, "%s: name %s", text,
                  s.calls[i].name);
        CHECK_MSG(strcmp(s.calls[i].arguments, x->calls[i][1]) == 0, "%s: arguments %s", text,
                  s.calls[i].arguments);
    }
    engine_tool_scan_free(&s);
    /* streamed: no prefix shows more content than the whole does, calls only grow, and no
     * shown content ends inside a marker that the whole text turns into a call */
    int calls = 0;
    size_t shown = 0;
    for (size_t n = 0; n <= len; n++) {
        engine_tools_scan(f, text, n, false, forced, tools, &s);
        CHECK_MSG(s.content_len >= shown || !x->n_calls, "%s: prefix %zu shows less", text, n);
        if (s.content_len > shown) shown = s.content_len;
        CHECK_MSG(s.n_calls >= calls && s.n_calls <= x->n_calls, "%s: prefix %zu: %d calls", text,
                  n, s.n_calls);
        calls = s.n_calls;
        engine_tool_scan_free(&s);
    }
    if (x->n_calls) CHECK_MSG(shown <= strlen(x->content), "%s: streamed %zu bytes", text, shown);
}

static void test_formats(const json_t *tools) {
    const expect weather = {"Let me look. ", 1, {{"get_weather", "{\"city\":\"Paris\"}"}}};
    check_scan(ENGINE_TOOLS_HERMES,
               "Let me look. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
               "\"Paris\"}}\n</tool_call>",
               false, tools, &weather);
    const expect two = {"", 2, {{"get_weather", "{\"city\":\"Oslo\"}"}, {"ping", "{}"}}};
    check_scan(ENGINE_TOOLS_HERMES,
               "<tool_call>{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": "
               "\\\"Oslo\\\"}\"}</tool_call>\n<tool_call>{\"name\": \"ping\"}</tool_call>\n",
               false, tools, &two);
    const expect coder = {"", 1, {{"get_weather", "{\"city\":\"12\",\"days\":3,\"unit\":\"c\"}"}}};
    check_scan(ENGINE_TOOLS_QWEN3_CODER,
               "<tool_call>\n<function=get_weather>\n<parameter=city>\n12\n</parameter>\n"
               "<parameter=days>\n3\n</parameter>\n<parameter=unit>\nc\n</parameter>\n"
               "</function>\n</tool_call>",
               false, tools, &coder);
    const expect llama = {"", 2, {{"get_weather", "{\"city\":\"Rome\"}"}, {"ping", "{}"}}};
    check_scan(ENGINE_TOOLS_LLAMA3_JSON,
               "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}; "
               "{\"name\": \"ping\", \"parameters\": {}}",
               false, tools, &llama);
    const expect llama_plain = {" ", 1, {{"ping", "{}"}}};
    check_scan(ENGINE_TOOLS_LLAMA3_JSON, " {\"name\": \"ping\", \"parameters\": {}}", false, tools,
               &llama_plain);
    const expect mistral = {"Sure", 2, {{"get_weather", "{\"city\":\"Bern\"}"}, {"ping", "{}"}}};
    check_scan(ENGINE_TOOLS_MISTRAL,
               "Sure[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": "
               "\"Bern\"}}, {\"name\": \"ping\", \"arguments\": {}}]",
               false, tools, &mistral);
    const expect mistral_v11 = {"", 1, {{"ping", "{\"x\":1}"}}};
    check_scan(ENGINE_TOOLS_MISTRAL, "[TOOL_CALLS]ping[ARGS]{\"x\": 1}", false, tools,
               &mistral_v11);
    const expect forced = {"", 1, {{"ping", "{}"}}};
    check_scan(ENGINE_TOOLS_MISTRAL, "[{\"name\": \"ping\", \"arguments\": {}}]", true, tools,
               &forced);
    /* text after the calls stays content */
    const expect after = {"a b", 1, {{"ping", "{}"}}};
    check_scan(ENGINE_TOOLS_HERMES, "a <tool_call>{\"name\": \"ping\"}</tool_call>b", false, tools,
               &after);
}

/* Malformed output: the text is content, nothing is lost, nothing crashes. */
static void test_malformed(const json_t *tools) {
    static const struct {
        engine_tool_format f;
        const char *text;
    } bad[] = {
        {ENGINE_TOOLS_HERMES, "x <tool_call>{\"name\": \"ping\""},
        {ENGINE_TOOLS_HERMES, "<tool_call>not json</tool_call>"},
        {ENGINE_TOOLS_HERMES, "<tool_call>{\"arguments\": {}}</tool_call>"},
        {ENGINE_TOOLS_HERMES, "<tool_call>{\"name\": \"ping\", \"arguments\": [1]}</tool_call>"},
        {ENGINE_TOOLS_HERMES, "<tool_call>{\"name\": \"ping\", \"arguments\": \"{\"}</tool_call>"},
        {ENGINE_TOOLS_HERMES, "the end <tool_"},
        {ENGINE_TOOLS_QWEN3_CODER, "<tool_call><function=>\n</function></tool_call>"},
        {ENGINE_TOOLS_QWEN3_CODER, "<tool_call><function=f><parameter=a>1</function></tool_call>"},
        {ENGINE_TOOLS_QWEN3_CODER, "<tool_call><function=f>"},
        {ENGINE_TOOLS_LLAMA3_JSON, "{\"name\": 3}"},
        {ENGINE_TOOLS_LLAMA3_JSON, "{\"name\": \"ping\", \"parameters\": {}"},
        {ENGINE_TOOLS_LLAMA3_JSON, "<|python_tag|>brave_search.call(query=\"x\")"},
        {ENGINE_TOOLS_LLAMA3_JSON, "<|python_t"},
        {ENGINE_TOOLS_MISTRAL, "[TOOL_CALLS] [{\"name\": \"ping\"}, 3]"},
        {ENGINE_TOOLS_MISTRAL, "[TOOL_CALLS] []"},
        {ENGINE_TOOLS_MISTRAL, "[TOOL_CALLS]na me[ARGS]{}"},
        {ENGINE_TOOLS_MISTRAL, "[TOOL_CALLS]ping[ARGS]{\"a\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        expect x = {bad[i].text, 0, {{0}}};
        check_scan(bad[i].f, bad[i].text, false, tools, &x);
    }
    /* plain text with no marker, and text that names the marker only partly mid-way */
    expect plain = {"Hello <tool world", 0, {{0}}};
    check_scan(ENGINE_TOOLS_HERMES, plain.content, false, tools, &plain);
    /* a streamed prefix holds back what may be a marker */
    engine_tool_scan s;
    engine_tools_scan(ENGINE_TOOLS_HERMES, "Hi <tool_c", 10, false, false, tools, &s);
    CHECK(s.content_len == 3 && !s.in_call);
    engine_tool_scan_free(&s);
}

/* The forced grammar accepts a call of the format and refuses one that breaks the schema. */
static void check_grammar(engine_tool_format f, const json_t *tools, const char *only,
                          bool parallel, const char *good, const char *bad) {
    char *gbnf = NULL;
    base_err err;
    int rc = engine_tools_grammar(f, tools, only, parallel, &gbnf, &err);
    CHECK_MSG(rc == 0, "%s: %s", engine_tool_format_name(f), err.msg);
    if (rc) return;
    gram_grammar *g = NULL;
    rc = gram_parse(gbnf, strlen(gbnf), &g, &err);
    CHECK_MSG(rc == 0, "%s: %s\n%s", engine_tool_format_name(f), err.msg, gbnf);
    if (rc) {
        free(gbnf);
        return;
    }
    const char *bytes[] = {"x"};
    size_t lens[] = {1};
    gram_vocab *v = gram_vocab_new(bytes, lens, 1);
    gram_matcher *m = gram_matcher_new(g, v);
    gram_state *st = gram_state_new(m);
    CHECK_MSG(gram_state_accept_bytes(st, good, strlen(good), &err) == 0 && gram_state_can_end(st),
              "%s: refuses %s", engine_tool_format_name(f), good);
    gram_state_free(st);
    st = gram_state_new(m);
    bool refused =
        gram_state_accept_bytes(st, bad, strlen(bad), &err) != 0 || !gram_state_can_end(st);
    CHECK_MSG(refused, "%s: accepts %s", engine_tool_format_name(f), bad);
    gram_state_free(st);
    gram_matcher_free(m);
    gram_vocab_free(v);
    gram_free(g);
    /* what the grammar writes, the scan of forced output takes back */
    engine_tool_scan s;
    engine_tools_scan(f, good, strlen(good), true, true, tools, &s);
    CHECK_MSG(s.n_calls >= 1 && s.content_len == 0, "%s: forced scan of %s: %d calls",
              engine_tool_format_name(f), good, s.n_calls);
    engine_tool_scan_free(&s);
    free(gbnf);
}

static void test_grammar(const json_t *tools) {
    check_grammar(
        ENGINE_TOOLS_HERMES, tools, NULL, true,
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n"
        "</tool_call>\n<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"days\": 1}}\n"
        "</tool_call>");
    check_grammar(ENGINE_TOOLS_HERMES, tools, "ping", false,
                  "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>",
                  "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>\n"
                  "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>");
    check_grammar(ENGINE_TOOLS_QWEN3_CODER, tools, "get_weather", false,
                  "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
                  "<parameter=unit>\nf\n</parameter>\n</function>\n</tool_call>",
                  "<tool_call>\n<function=get_weather>\n<parameter=unit>\nk\n</parameter>\n"
                  "</function>\n</tool_call>");
    check_grammar(ENGINE_TOOLS_LLAMA3_JSON, tools, NULL, true,
                  "{\"name\": \"ping\", \"parameters\": {}}; {\"name\": \"get_weather\", "
                  "\"parameters\": {\"city\": \"x\", \"days\": 2}}",
                  "{\"name\": \"pong\", \"parameters\": {}}");
    check_grammar(ENGINE_TOOLS_MISTRAL, tools, NULL, false,
                  "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"x\"}}]",
                  "[{\"name\": \"get_weather\", \"arguments\": {\"city\": 3}}]");
    char *gbnf = NULL;
    base_err err;
    CHECK(engine_tools_grammar(ENGINE_TOOLS_HERMES, tools, "nope", true, &gbnf, &err) != 0);
    json_t *bad = json_loads("[{\"type\": \"function\", \"function\": {\"name\": \"f\", "
                             "\"parameters\": {\"type\": \"object\", \"properties\": {\"a\": "
                             "{\"type\": \"string\", \"pattern\": \"x+\"}}}}}]",
                             0, NULL);
    CHECK(engine_tools_grammar(ENGINE_TOOLS_HERMES, bad, NULL, true, &gbnf, &err) != 0 &&
          strstr(err.msg, "pattern"));
    CHECK(engine_tools_grammar(ENGINE_TOOLS_QWEN3_CODER, bad, NULL, true, &gbnf, &err) != 0);
    json_decref(bad);
}

static void test_formats_named(void) {
    engine_tool_format f;
    base_err err;
    CHECK(engine_tool_format_from_name("qwen3_coder", &f, &err) == 0 &&
          f == ENGINE_TOOLS_QWEN3_CODER);
    CHECK(engine_tool_format_from_name("pythonic", &f, &err) != 0 && strstr(err.msg, "pythonic"));
    CHECK(engine_tool_format_detect("{{ '<tool_call>' }}") == ENGINE_TOOLS_HERMES);
    CHECK(engine_tool_format_detect("<tool_call><function=") == ENGINE_TOOLS_QWEN3_CODER);
    CHECK(engine_tool_format_detect("'[TOOL_CALLS]'") == ENGINE_TOOLS_MISTRAL);
    CHECK(engine_tool_format_detect("<|python_tag|>") == ENGINE_TOOLS_LLAMA3_JSON);
    CHECK(engine_tool_format_detect(NULL) == ENGINE_TOOLS_HERMES);
}

static void check_think(const char *text, bool inside, const char *reasoning, const char *content) {
    engine_think_split t;
    size_t len = strlen(text);
    engine_think_split_text(text, len, inside, true, &t);
    CHECK_MSG(strlen(reasoning) == t.reasoning_len &&
                  memcmp(text + t.reasoning_start, reasoning, t.reasoning_len) == 0,
              "%s: reasoning [%.*s]", text, (int)t.reasoning_len, text + t.reasoning_start);
    CHECK_MSG(strcmp(text + t.content_start, content) == 0, "%s: content [%s]", text,
              text + t.content_start);
    /* streamed: the parts only grow and never show a tag */
    size_t r = 0, c = len;
    for (size_t n = 0; n <= len; n++) {
        engine_think_split_text(text, n, inside, false, &t);
        CHECK(t.reasoning_len >= r && t.reasoning_len <= strlen(reasoning));
        CHECK(!memmem(text + t.reasoning_start, t.reasoning_len, "</", 2));
        r = t.reasoning_len;
        if (t.content_start < n && c == len) c = t.content_start;
    }
    CHECK_MSG(c >= len - strlen(content), "%s: content shown from %zu", text, c);
}

static void test_think(void) {
    check_think("<think>\nhmm\n</think>\n\nHello", false, "\nhmm\n", "Hello");
    check_think("hmm</think>Hi", true, "hmm", "Hi");
    check_think("Hello <think>x</think>", false, "", "Hello <think>x</think>");
    check_think("still thinking", true, "still thinking", "");
    check_think("<thin", false, "", "<thin");
    CHECK(engine_prompt_opens_think("<|im_start|>assistant\n<think>\n"));
    CHECK(!engine_prompt_opens_think("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    engine_reasoning_format rf;
    base_err err;
    CHECK(engine_reasoning_format_from_name("deepseek", &rf, &err) == 0 &&
          rf == ENGINE_REASONING_DEEPSEEK);
    CHECK(engine_reasoning_format_from_name("deepseek-legacy", &rf, &err) != 0);
}

int main(void) {
    json_t *tools = json_loads(g_tools_json, 0, NULL);
    CHECK(tools != NULL);
    test_formats(tools);
    test_malformed(tools);
    test_grammar(tools);
    test_formats_named();
    test_think();
    json_decref(tools);
    TEST_MAIN_END();
}
