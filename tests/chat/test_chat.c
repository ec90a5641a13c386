/* The chat-template engine against Jinja semantics: each expected string is worked out by
 * hand from how Python Jinja (with transformers' trim_blocks and lstrip_blocks) renders it. */
#include "chat/chat.h"
#include "test.h"
#include "test_file.h"

#include <pthread.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static base_err g_err;

/* Rendered text (caller frees) or NULL with g_err filled. */
static char *render(const char *src, const char *vars_json) {
    g_err.msg[0] = 0;
    chat_template *t;
    if (chat_template_parse(src, &t, &g_err)) return NULL;
    json_error_t je;
    json_t *vars = vars_json ? json_loads(vars_json, 0, &je) : NULL;
    char *out = NULL;
    size_t len;
    if (chat_template_render(t, vars, &out, &len, &g_err)) out = NULL;
    if (out && strlen(out) != len) {
        free(out);
        out = NULL;
        snprintf(g_err.msg, sizeof g_err.msg, "length %zu disagrees with the text", len);
    }
    json_decref(vars);
    chat_template_free(t);
    return out;
}

static void expect(int line, const char *src, const char *vars, const char *want) {
    char *got = render(src, vars);
    CHECK_MSG(got && strcmp(got, want) == 0, "line %d: got [%s] want [%s] (%s)", line,
              got ? got : "(error)", want, got ? "" : g_err.msg);
    free(got);
}

static void expect_err(int line, const char *src, const char *vars, const char *part1,
                       const char *part2) {
    char *got = render(src, vars);
    CHECK_MSG(!got && strstr(g_err.msg, part1) && (!part2 || strstr(g_err.msg, part2)),
              "line %d: want an error with [%s] [%s], got [%s] / [%s]", line, part1,
              part2 ? part2 : "", got ? got : "(error)", got ? "" : g_err.msg);
    free(got);
}

#define EXPECT(src, vars, want)     expect(__LINE__, src, vars, want)
#define EXPECT_ERR(src, vars, a, b) expect_err(__LINE__, src, vars, a, b)

static void test_whitespace(void) {
    EXPECT("a  {%- if true -%}  b  {%- endif -%}  c", NULL, "abc");
    EXPECT("a {{- 1 -}} b", NULL, "a1b");
    EXPECT("a {{ 1 }} b", NULL, "a 1 b");
    /* lstrip_blocks removes the indent before a tag, trim_blocks the newline after it. */
    EXPECT("x\n  {% if true %}\n  y\n  {% endif %}\nz", NULL, "x\n  y\nz");
    EXPECT("x\n  {{ 1 }}\n", NULL, "x\n  1");
    EXPECT("hi\n", NULL, "hi");
    EXPECT("hi\n\n", NULL, "hi\n");
    EXPECT("a{# note #}b", NULL, "ab");
    EXPECT("a {#- note -#} b", NULL, "ab");
    EXPECT("  {# c #}\nx", NULL, "x");
    EXPECT("{% raw %}{{ x }}{% if %}{% endraw %}!", NULL, "{{ x }}{% if %}!");
    EXPECT("a\n{%- generation %} b {% endgeneration -%}\nc", NULL, "a b c");
}

static void test_control(void) {
    EXPECT("{% if 0 %}a{% elif '' %}b{% elif [1] %}c{% else %}d{% endif %}", NULL, "c");
    EXPECT("{% if none %}a{% else %}b{% endif %}", NULL, "b");
    EXPECT("{% for x in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}"
           "{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}",
           NULL, "1032TrueFalse3|2121FalseFalse3|3210FalseTrue3|");
    EXPECT("{% for x in [1, 2, 3] %}{{ loop.previtem | default('-') }}{{ loop.nextitem | "
           "default('-') }} {% endfor %}",
           NULL, "-2 13 2- ");
    EXPECT("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}{{ loop.length }}{% else %}none"
           "{% endfor %}",
           NULL, "2242");
    EXPECT("{% for x in [] %}x{% else %}empty{% endfor %}", NULL, "empty");
    EXPECT("{% for x in missing %}x{% else %}empty{% endfor %}", NULL, "empty");
    EXPECT("{% for c in 'añ' %}[{{ c }}]{% endfor %}", NULL, "[a][ñ]");
    EXPECT("{% for k in {'b': 1, 'a': 2} %}{{ k }}{% endfor %}", NULL, "ba");
    EXPECT("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}", NULL,
           "a=1;b=2;");
    EXPECT("{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}"
           "{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}",
           NULL, "0134");
    EXPECT("{% for a in [1, 2] %}{% for b in [3, 4] %}{{ loop.index }}{% endfor %}"
           "{{ loop.index }}{% endfor %}",
           NULL, "121122");
    /* A set inside a loop stays in the loop; a namespace carries the value out. */
    EXPECT("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}", NULL, "1");
    EXPECT("{% set ns = namespace(x=1) %}{% for i in [5, 6] %}{% set ns.x = ns.x + i %}"
           "{% endfor %}{{ ns.x }}",
           NULL, "12");
    EXPECT("{% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }}", NULL, "2");
    EXPECT("{% set t %}a{{ 1 }}{% endset %}[{{ t }}]", NULL, "[a1]");
    EXPECT("{% set a, b = [1, 2] %}{{ b }}{{ a }}", NULL, "21");
    EXPECT("{% filter upper %}ab{{ 'c' }}{% endfilter %}", NULL, "ABC");
}

/* `levels` copies of open[i % n_open] (each block closed by close[i % n_open] after the
 * innermost text "x"), malloc'd. */
static char *nest(const char *const *open, const char *const *close, int n_open, int levels) {
    size_t size = 2;
    for (int i = 0; i < levels; i++) size += strlen(open[i % n_open]) + strlen(close[i % n_open]);
    char *s = malloc(size), *p = s;
    for (int i = 0; i < levels; i++) p = stpcpy(p, open[i % n_open]);
    p = stpcpy(p, "x");
    for (int i = levels - 1; i >= 0; i--) p = stpcpy(p, close[i % n_open]);
    return s;
}

/* Statement nesting is bounded when parsing, with the position of the first block too deep
 * (a hostile tokenizer_config.json must not crash the loader); a long elif chain is no
 * nesting and works at any length. */
static void test_nesting(void) {
    static const char *const open[] = {"{% if 1 %}", "{% for a in [1] %}", "{% set t %}",
                                       "{% filter upper %}", "{% generation %}"};
    static const char *const close[] = {"{% endif %}", "{% endfor %}", "{% endset %}",
                                        "{% endfilter %}", "{% endgeneration %}"};
    /* 100 levels: parses and renders ("x" once, upper-cased by the filters). */
    char *src = nest(open, close, 2, 100);
    EXPECT(src, NULL, "x");
    free(src);
    struct {
        int first, n_open;
        size_t column; /* of the 101st opening tag */
    } cases[] = {{0, 1, 100 * strlen(open[0]) + 1},
                 {1, 1, 100 * strlen(open[1]) + 1},
                 {0, 5,
                  20 * (strlen(open[0]) + strlen(open[1]) + strlen(open[2]) + strlen(open[3]) +
                        strlen(open[4])) +
                      1}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        src = nest(open + cases[c].first, close + cases[c].first, cases[c].n_open, 20000);
        char want[80];
        snprintf(want, sizeof want, "template line 1, column %zu: blocks nested deeper than 100",
                 cases[c].column);
        EXPECT_ERR(src, NULL, want, NULL);
        free(src);
    }
    /* Unclosed blocks, as a truncated file has them. */
    char *deep = malloc(20000 * 9 + 1), *p = deep;
    for (int i = 0; i < 20000; i++) p = stpcpy(p, "{%if 1%}");
    EXPECT_ERR(deep, NULL, "column 801: blocks nested deeper than 100", NULL);
    free(deep);
    /* A macro's body counts as a block. */
    static const char *const mopen[] = {"{% macro m() %}"}, *const mclose[] = {"{% endmacro %}"};
    src = nest(mopen, mclose, 1, 101);
    EXPECT_ERR(src, NULL, "blocks nested deeper than 100", NULL);
    free(src);

    size_t size = 64 + 40 * 20000;
    char *chain = malloc(size);
    p = stpcpy(chain, "{% if x == 0 %}0");
    for (int i = 1; i < 20000; i++) p += sprintf(p, "{%% elif x == %d %%}%d", i, i);
    strcpy(p, "{% else %}none{% endif %}");
    EXPECT(chain, "{\"x\": 19999}", "19999");
    EXPECT(chain, "{\"x\": -1}", "none");
    free(chain);
}

static void test_macros(void) {
    EXPECT("{% macro f(a, b='B', c=none) %}{{ a }}{{ b }}{{ c }}{% endmacro %}"
           "{{ f(1) }}|{{ f(1, 2) }}|{{ f(1, c=3) }}|{{ f() }}",
           NULL, "1BNone|12None|1B3|BNone");
    EXPECT("{% macro r(n) %}{{ n }}{% if n > 0 %}{{ r(n - 1) }}{% endif %}{% endmacro %}"
           "{{ r(3) }}",
           NULL, "3210");
    EXPECT("{% macro g(a, b=a * 2) %}{{ b }}{% endmacro %}{{ g(4) }}", NULL, "8");
    EXPECT("{% macro h() %}{{ top }}{% endmacro %}{% set top = 'T' %}{{ h() }}", NULL, "T");
    EXPECT_ERR("{% macro f(a) %}{% endmacro %}{{ f(1, 2) }}", NULL, "template line 1",
               "takes not more than 1");
    EXPECT_ERR("{% macro f(a) %}{% endmacro %}{{ f(z=1) }}", NULL, "no keyword argument 'z'", NULL);
}

static void test_expressions(void) {
    EXPECT("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 7 / 2 }} {{ 4 / 2 }}", NULL,
           "3 -4 2 -2 3.5 2.0");
    EXPECT("{{ 2 ** 10 }} {{ 2 ** -1 }} {{ 1 + 2.0 }} {{ 0.1 + 0.2 }} {{ 1e-05 * 1 }} {{ 1e16 }}",
           NULL, "1024 0.5 3.0 0.30000000000000004 1e-05 1e+16");
    EXPECT("{{ 2 + 3 * 4 }} {{ (2 + 3) * 4 }} {{ -2 ** 2 }} {{ 10 - 2 - 3 }}", NULL, "14 20 4 5");
    EXPECT("{{ 'ab' * 3 }} {{ [1] * 2 }} {{ [1] + [2] }} {{ 'a' ~ 1 ~ none ~ missing }}", NULL,
           "ababab [1, 1] [1, 2] a1None");
    EXPECT("{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 == 1.0 }} {{ 'a' != 'b' }} {{ 'b' > 'a' }}", NULL,
           "True False True True True");
    EXPECT("{{ [1, 2] < [1, 3] }} {{ true == 1 }} {{ [1, [2]] == [1, [2]] }}", NULL,
           "True True True");
    EXPECT("{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }} "
           "{{ 1 in missing }}",
           NULL, "True True True True False");
    EXPECT("{{ 1 and 2 }} {{ 0 and 2 }} {{ 0 or 'x' }} {{ not 0 }} {{ not 1 == 2 }}", NULL,
           "2 0 x True True");
    EXPECT("{{ 'y' if 1 else 'n' }} {{ 'y' if 0 else 'n' }} [{{ 'y' if 0 }}]", NULL, "y n []");
    EXPECT("{{ x is not none }} {{ none is not none }} {{ x is defined }} {{ x is undefined }}",
           "{\"x\": 1}", "True False True False");
    EXPECT("{{ [1, 'a', none, true, 1.5] }} {{ {'k': \"it's\", 'n': [1]} }} {{ (1,) }} {{ (1, "
           "2) }}",
           NULL, "[1, 'a', None, True, 1.5] {'k': \"it's\", 'n': [1]} (1,) (1, 2)");
    EXPECT("{{ 'a\\nb\\t\\'\\\"\\\\\\x41\\u00e9' }}", NULL, "a\nb\t'\"\\Aé");
    EXPECT("{{ 'con' 'cat' }} {{ \"a'b\" }}", NULL, "concat a'b");
    EXPECT("{{ missing }}|{{ missing.attr }}|{{ missing['k'] }}|{{ none.x }}", NULL, "|||");
    EXPECT("{{ d.a }} {{ d['a'] }} {{ d.b.c }} {{ l[0] }} {{ l[-1] }} {{ l.1 }} [{{ l[5] }}]",
           "{\"d\": {\"a\": 1, \"b\": {\"c\": 2}}, \"l\": [3, 4]}", "1 1 2 3 4 4 []");
    EXPECT("{{ [1, 2, 3, 4][::-1] }} {{ [1, 2, 3, 4][1:] }} {{ [1, 2, 3, 4][-2:] }} "
           "{{ [1, 2, 3, 4][:-1] }} {{ [1, 2, 3, 4][::2] }} {{ [1, 2, 3][5:] }}",
           NULL, "[4, 3, 2, 1] [2, 3, 4] [3, 4] [1, 2, 3] [1, 3] []");
    EXPECT("{{ 'añb'[::-1] }} {{ 'hello'[1:3] }} {{ 'añb'[1] }} {{ 'abc'[-1] }}", NULL,
           "bña el ñ c");
    EXPECT("{{ range(3) | join(',') }} {{ range(1, 7, 2) | join(',') }} "
           "{{ range(5, 0, -2) | join(',') }} {{ range(0) | length }}",
           NULL, "0,1,2 1,3,5 5,3,1 0");
    EXPECT("{{ dict(a=1, b='x') | tojson }} {{ namespace(a=1).a }}", NULL,
           "{\"a\": 1, \"b\": \"x\"} 1");
    EXPECT("{{ True }} {{ False }} {{ None }} {{ true }}", NULL, "True False None True");
}

static void test_filters(void) {
    EXPECT("[{{ '  a b \\n' | trim }}] [{{ 'xxaxx' | trim('x') }}]", NULL, "[a b] [a]");
    EXPECT("{{ {'a': [1, 2.5, 'x\"y'], 'b': none, 'c': true, 'd': {}} | tojson }}", NULL,
           "{\"a\": [1, 2.5, \"x\\\"y\"], \"b\": null, \"c\": true, \"d\": {}}");
    EXPECT("{{ {'a': [1], 'b': []} | tojson(indent=2) }}", NULL,
           "{\n  \"a\": [\n    1\n  ],\n  \"b\": []\n}");
    EXPECT("{{ {'b': 1, 'a': 'é\\n'} | tojson(sort_keys=true) }}", NULL,
           "{\"a\": \"é\\n\", \"b\": 1}");
    EXPECT("{{ [1, 2] | tojson(separators=(',', ':')) }}", NULL, "[1,2]");
    EXPECT("{{ 'añb' | length }} {{ [1, 2] | length }} {{ {'a': 1} | count }} {{ missing | "
           "length }}",
           NULL, "3 2 1 0");
    EXPECT("{{ 'aB' | upper }} {{ 'aB' | lower }} {{ 'hELLO wORLD' | capitalize }} "
           "{{ 'hello-world foo(bar)' | title }} {{ 'ß' | upper }}",
           NULL, "AB ab Hello world Hello-World Foo(Bar) SS");
    EXPECT("{{ 'aaa' | replace('a', 'b') }} {{ 'aaa' | replace('a', 'b', 2) }} "
           "{{ 'ab' | replace('', '-') }}",
           NULL, "bbb bba -a-b-");
    EXPECT("{{ [1, 'a'] | join }} {{ [1, 'a'] | join('-') }} {{ [{'n': 'x'}, {'n': 'y'}] | "
           "join(',', attribute='n') }}",
           NULL, "1a 1-a x,y");
    EXPECT("{{ {'a': 1} | items | list }} {{ [3, 4] | first }} {{ [3, 4] | last }} "
           "{{ 'xyz' | first }} [{{ [] | first }}]",
           NULL, "[('a', 1)] 3 4 x []");
    EXPECT("{{ missing | default('d') }} {{ '' | default('d') }} {{ '' | default('d', true) }} "
           "{{ none | d('x') }}",
           NULL, "d  d None");
    EXPECT("{{ 12 | string ~ 'px' }} {{ '42' | int + 1 }} {{ 'x' | int }} {{ '3.7' | int }} "
           "{{ 3.9 | int }} {{ 'x' | int(5) }} {{ '2.5' | float }} {{ true | int }}",
           NULL, "12px 43 0 3 3 5 2.5 1");
    EXPECT("{{ 'ab' | list }} {{ {'k': 1} | list }}", NULL, "['a', 'b'] ['k']");
    EXPECT("{{ users | map(attribute='name') | join(',') }} {{ ['a', 'b'] | map('upper') | "
           "join }} {{ users | map(attribute='age', default=0) | list }}",
           "{\"users\": [{\"name\": \"x\", \"age\": 3}, {\"name\": \"y\"}]}", "x,y AB [3, 0]");
    EXPECT("{{ [1, 2, 3, 4] | select('odd') | list }} {{ [1, 2, 3, 4] | reject('odd') | list }} "
           "{{ [0, 1, '', 'a'] | select | list }} {{ [1, 5, 9] | select('gt', 4) | list }}",
           NULL, "[1, 3] [2, 4] [1, 'a'] [5, 9]");
    EXPECT("{{ m | selectattr('role', 'equalto', 'user') | map(attribute='c') | join }} "
           "{{ m | rejectattr('role', 'equalto', 'user') | map(attribute='c') | join }} "
           "{{ m | selectattr('tool') | list | length }} "
           "{{ m | selectattr('tool', 'defined') | list | length }}",
           "{\"m\": [{\"role\": \"user\", \"c\": \"1\"}, {\"role\": \"bot\", \"c\": \"2\", "
           "\"tool\": false}, {\"role\": \"user\", \"c\": \"3\"}]}",
           "13 2 0 1");
    EXPECT("{{ ['a', 'A', 'b', 'a'] | unique | list }} {{ ['a', 'A'] | unique(true) | list }}",
           NULL, "['a', 'b'] ['a', 'A']");
    EXPECT("{{ 'x' | safe }} {{ 'a\\nb\\n\\nc' | indent }} {{ 'a\\nb' | indent(2, true) }}", NULL,
           "x a\n    b\n\n    c   a\n  b");
    EXPECT("{{ {'b': 1, 'A': 2, 'c': 0} | dictsort }} {{ {'b': 1, 'a': 2} | dictsort(by='value', "
           "reverse=true) }}",
           NULL, "[('A', 2), ('b', 1), ('c', 0)] [('a', 2), ('b', 1)]");
    EXPECT("{{ 2.5 | round }} {{ 3.5 | round }} {{ 2.567 | round(2) }} {{ 3.7 | round(0, "
           "'floor') }} {{ 3.2 | round(0, 'ceil') }} {{ 7 | round }}",
           NULL, "2.0 4.0 2.57 3.0 4.0 7");
    EXPECT("{{ -3 | abs }} {{ -2.5 | abs }} {{ [3, 1, 2] | sort }} {{ ['b', 'A', 'a'] | sort }} "
           "{{ [3, 1] | sort(reverse=true) }} {{ [3, 1, 2] | max }} {{ [3, 1, 2] | min }} "
           "{{ [1, 2.5] | sum }}",
           NULL, "3 2.5 [1, 2, 3] ['A', 'a', 'b'] [3, 1] 3 1 3.5");
    EXPECT("{{ [1, 2] | reverse | list }} {{ 'abc' | reverse }} {{ '%s-%d' | format('a', 3) }} "
           "{{ 'a b  c' | wordcount }}",
           NULL, "[2, 1] cba a-3 3");
}

static void test_tests(void) {
    EXPECT("{{ x is defined }}{{ y is undefined }}{{ n is none }}{{ s is string }}"
           "{{ d is mapping }}{{ l is iterable }}{{ s is iterable }}{{ l is sequence }}"
           "{{ 1.5 is number }}{{ 1 is integer }}{{ 1.0 is integer }}{{ t is boolean }}"
           "{{ t is true }}{{ 1 is true }}{{ f is false }}{{ 0 is false }}",
           "{\"x\": 1, \"n\": null, \"s\": \"a\", \"d\": {}, \"l\": [], \"t\": true, \"f\": false}",
           "TrueTrueTrueTrueTrueTrueTrueTrueTrueTrueFalseTrueTrueFalseTrueFalse");
    EXPECT("{{ 3 is odd }}{{ 3 is even }}{{ 'a' is equalto 'a' }}{{ 2 is equalto(3) }}"
           "{{ 2 is in [1, 2] }}{{ 6 is divisibleby 3 }}{{ 'ab' is lower }}{{ d is not mapping }}",
           "{\"d\": []}", "TrueFalseTrueFalseTrueTrueTrueTrue");
}

static void test_methods(void) {
    EXPECT("[{{ ' a '.strip() }}][{{ 'xax'.strip('x') }}][{{ '\\n a'.lstrip() }}]"
           "[{{ 'a \\n'.rstrip() }}][{{ '\\n\\n a\\n'.strip('\\n') }}]",
           NULL, "[a][a][a][a][ a]");
    EXPECT("{{ 'abc'.startswith('ab') }}{{ 'abc'.startswith(('x', 'a')) }}"
           "{{ 'abc'.endswith('bc') }}{{ 'abc'.endswith('x') }}",
           NULL, "TrueTrueTrueFalse");
    EXPECT("{{ ' a  b '.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a,b,c'.split(',', 1) }} "
           "{{ 'a</think>b'.split('</think>')[-1] }}",
           NULL, "['a', 'b'] ['a', 'b', '', 'c'] ['a', 'b,c'] b");
    EXPECT("{{ 'aB'.upper() }}{{ 'aB'.lower() }} {{ 'aaa'.replace('a', 'b', 1) }} "
           "{{ \"they're bill's\".title() }} {{ 'hELLO'.capitalize() }}",
           NULL, "ABab baa They'Re Bill'S Hello");
    EXPECT("{{ '{} and {name}'.format(1, name='x') }} {{ '{0}{0}'.format('z') }} "
           "{{ ', '.join(['a', 'b']) }} {{ 'abcb'.find('b') }} {{ 'abcb'.count('b') }} "
           "{{ '12'.isdigit() }}",
           NULL, "1 and x zz a, b 1 2 True");
    EXPECT("{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 5) }} {{ d.items() | list }} "
           "{{ d.keys() | list }} {{ d.values() | list }}",
           "{\"d\": {\"a\": 1, \"b\": 2}}", "1 None 5 [('a', 1), ('b', 2)] ['a', 'b'] [1, 2]");
}

static void test_globals(void) {
    char year[16];
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(year, sizeof year, "%Y", &tm);
    char *got = render("{{ strftime_now('%Y') }}", NULL);
    CHECK_MSG(got && strlen(got) == 4 && (strcmp(got, year) == 0 || atoi(got) == atoi(year) + 1),
              "strftime_now('%%Y') gave [%s], expected %s", got ? got : g_err.msg, year);
    free(got);
    EXPECT_ERR("a\n{{ raise_exception('roles must alternate') }}", NULL, "template line 2",
               "roles must alternate");
}

static void test_transformers_vars(void) {
    /* The Qwen3 pattern: namespace, reversed loop with index arithmetic, string methods. */
    const char *src =
        "{%- set ns = namespace(last=messages|length - 1) %}\n"
        "{%- for m in messages[::-1] %}\n"
        "    {%- set index = (messages|length - 1) - loop.index0 %}\n"
        "    {%- if m.role == 'user' and not m.content.startswith('<tool') %}\n"
        "        {%- set ns.last = index %}{% break %}\n"
        "    {%- endif %}\n"
        "{%- endfor %}\n"
        "{{- ns.last }}\n"
        "{%- if add_generation_prompt %}|gen{% endif %}\n"
        "{%- if enable_thinking is defined and enable_thinking is false %}|nothink{% endif %}";
    EXPECT(src,
           "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", "
           "\"content\": \"b\"}, {\"role\": \"user\", \"content\": \"<tool_response>\"}], "
           "\"add_generation_prompt\": true, \"enable_thinking\": false}",
           "0|gen|nothink");
    EXPECT(src, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}", "0");
}

static void test_errors(void) {
    EXPECT_ERR("a\nb {% if %}", NULL, "template line 2, column", "expected an expression");
    EXPECT_ERR("{{ x | nope }}", NULL, "template line 1, column 8", "no filter named 'nope'");
    EXPECT_ERR("\n\n{{ x is nope }}", NULL, "template line 3", "no test named 'nope'");
    EXPECT_ERR("{% if true %}x", NULL, "missing {% endif %}", "opened on line 1");
    EXPECT_ERR("{% for x in y %}", NULL, "missing {% endfor %}", NULL);
    EXPECT_ERR("{{ x", NULL, "unclosed '{{'", NULL);
    EXPECT_ERR("{# x", NULL, "unclosed comment", NULL);
    EXPECT_ERR("{{ 'abc }}", NULL, "unterminated string", NULL);
    EXPECT_ERR("x\n{% endfor %}", NULL, "template line 2", "unexpected {% endfor %}");
    EXPECT_ERR("{% break %}", NULL, "outside of a for loop", NULL);
    EXPECT_ERR("{% include 'x' %}", NULL, "unsupported tag 'include'", NULL);
    EXPECT_ERR("{{ 1 + }}", NULL, "expected an expression", NULL);
    EXPECT_ERR("{{ f(a=1, 2) }}", NULL, "positional argument after keyword", NULL);
    EXPECT_ERR("{{ $ }}", NULL, "unexpected character '$'", NULL);
    EXPECT_ERR("x\n{{ nothing() }}", NULL, "template line 2", "'nothing' is undefined");
    EXPECT_ERR("{{ 'a'.nomethod() }}", NULL, "'str' object has no attribute 'nomethod'", NULL);
    EXPECT_ERR("{{ 5() }}", NULL, "'int' object is not callable", NULL);
    EXPECT_ERR("{{ 1 + 'a' }}", NULL, "unsupported operand type(s) for +: 'int' and 'str'", NULL);
    EXPECT_ERR("{{ missing + 1 }}", NULL, "'missing' is undefined", NULL);
    EXPECT_ERR("{{ 1 // 0 }}", NULL, "division or modulo by zero", NULL);
    EXPECT_ERR("{{ 9223372036854775807 + 1 }}", NULL, "integer overflow", NULL);
    EXPECT_ERR("{{ 1 < 'a' }}", NULL, "cannot compare 'int' with 'str'", NULL);
    EXPECT_ERR("{% for x in 5 %}{% endfor %}", NULL, "'int' object is not iterable", NULL);
    EXPECT_ERR("{% set x = 1 %}{% set x.a = 2 %}", NULL, "not a namespace", NULL);
    EXPECT_ERR("{% for a, b in [[1, 2, 3]] %}{% endfor %}", NULL, "too many values to unpack",
               NULL);
    EXPECT_ERR("{{ [1][::0] }}", NULL, "slice step cannot be zero", NULL);
    EXPECT_ERR("{{ {'a': 1} | tojson(ensure_ascii=true) }}", NULL, "ensure_ascii", NULL);
    EXPECT_ERR("{{ namespace(a=1) | tojson }}", NULL, "not JSON serializable", NULL);
    EXPECT_ERR("{{ x }}", "[1]", "must be a JSON object", NULL);
}

static void test_limits(void) {
    EXPECT_ERR("{% macro r() %}{{ r() }}{% endmacro %}\n{{ r() }}", NULL, "nests deeper than",
               NULL);
    char deep[2000];
    strcpy(deep, "{{ ");
    for (int i = 0; i < 600; i++) strcat(deep, "(");
    strcat(deep, "1");
    for (int i = 0; i < 600; i++) strcat(deep, ")");
    strcat(deep, " }}");
    EXPECT_ERR(deep, NULL, "nested too deeply", NULL);
    EXPECT_ERR("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", NULL,
               "rendered output is larger than", NULL);
    /* Loops that print nothing and allocate little still end: an empty inner body, and an
     * inner body that only evaluates. */
    EXPECT_ERR("{% set r = range(100000) %}{% for i in r %}{% for j in r %}{% endfor %}"
               "{% endfor %}",
               NULL, "more than 20000000 steps", NULL);
    EXPECT_ERR("{% set r = range(100000) %}{% for i in r %}{% for j in r %}"
               "{% if j < 0 %}x{% endif %}{% endfor %}{% endfor %}",
               NULL, "more than 20000000 steps", NULL);
    /* A loop that wraps a list in itself makes a value nested deeper than any stack holds:
     * comparing it fails with a message. Doubling a list instead makes one whose comparison
     * would visit 2^60 items: it runs out of steps. */
    static const char wrap[] = "{% set ns = namespace(x=[], y=[]) %}{% for i in range(300000) %}"
                               "{% set ns.x = [ns.x] %}{% endfor %}";
    static const char *const uses[] = {"{{ ns.x == [ns.x] }}",
                                       "{{ ns.x < [ns.x] }}",
                                       "{{ ns.x in [[ns.x]] }}",
                                       "{{ [[ns.x]] | select('equalto', ns.x) | list }}",
                                       "{{ [ns.x, [ns.x]] | unique | list | length }}",
                                       "{{ [ns.x, [ns.x]] | sort | length }}"};
    for (size_t i = 0; i < sizeof uses / sizeof uses[0]; i++) {
        char src[512];
        snprintf(src, sizeof src, "%s%s", wrap, uses[i]);
        EXPECT_ERR(src, NULL, "values nested deeper than 400 levels", NULL);
    }
    /* `sameas` is Python's `is`: identity, which looks inside nothing. */
    char same[512];
    snprintf(same, sizeof same, "%s{{ ns.x is sameas ns.x }}{{ [1] is sameas [1] }}", wrap);
    EXPECT(same, NULL, "TrueFalse");
    EXPECT_ERR("{% set ns = namespace(x=[], y=[]) %}{% for i in range(60) %}"
               "{% set ns.x = [ns.x, ns.x] %}{% set ns.y = [ns.y, ns.y] %}{% endfor %}"
               "{{ ns.x == ns.y }}",
               NULL, "more than 20000000 steps", NULL);
    /* Dict keys are what Python can hash without looking inside (so finding one never
     * recurses): a list or dict key is refused as Python refuses it. */
    EXPECT_ERR("{{ {[1]: 2} }}", NULL, "unhashable type: 'list'", NULL);
    EXPECT_ERR("{{ {{}: 2} }}", NULL, "unhashable type: 'dict'", NULL);
    EXPECT("{{ {1: 'a', 1.0: 'b', none: 'c', 's': 'd'} }}", NULL, "{1: 'b', None: 'c', 's': 'd'}");
    EXPECT_ERR("{{ range(2000000000) | length }}", NULL, "more than", "MiB of memory");
    EXPECT_ERR("{{ 'x' * 4000000000 }}", NULL, "MiB of memory", NULL);
}

/* Cuts a real template at every length and renders random token soups: every one must either
 * render or fail with a message, never crash. */
static void test_malformed(void) {
    char *src;
    char *path = base_path_join(test_source_dir(), "tests/chat/templates/features.jinja");
    base_err err;
    int read_rc = base_read_file(path, &src, NULL, &err);
    CHECK_MSG(read_rc == 0, "%s (set MLXCEL_SOURCE_DIR)", err.msg);
    free(path);
    if (read_rc) return;
    const char *vars = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}";
    size_t n = strlen(src);
    int failures_with_message = 0, failures = 0;
    for (size_t cut = 0; cut <= n; cut += 3) {
        char *part = strndup(src, cut);
        char *out = render(part, vars);
        if (!out) {
            failures++;
            failures_with_message += g_err.msg[0] != 0;
        }
        free(out);
        free(part);
    }
    free(src);
    CHECK(failures > 0 && failures == failures_with_message);

    static const char *const soup[] = {
        "{{",  "}}",        "{%",    "%}",     "{#",     "#}",       "{%-",   "-%}",      "if",
        "for", "in",        "endif", "endfor", "else",   "set",      "=",     "x",        "'s'",
        "\"",  "1",         "2.5",   "(",      ")",      "[",        "]",     "{",        "}",
        ",",   ":",         "|",     "trim",   "tojson", "is",       "not",   "defined",  ".",
        "+",   "-",         "*",     "**",     "//",     "~",        "macro", "endmacro", "loop",
        "ns",  "namespace", "range", "\n",     " ",      "\\",       "raw",   "endraw",   "<",
        "==",  "and",       "or",    "none",   "[::-1]", "messages", "%",     "#"};
    uint64_t state = 12345;
    int crashed_free = 0;
    for (int iter = 0; iter < 4000; iter++) {
        char buf[512] = {0};
        int len = 1 + (int)(state % 40);
        for (int k = 0; k < len; k++) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            strncat(buf, soup[(state >> 33) % (sizeof soup / sizeof soup[0])],
                    sizeof buf - strlen(buf) - 1);
            strncat(buf, state & 1 ? " " : "", sizeof buf - strlen(buf) - 1);
        }
        char *out = render(buf, vars);
        crashed_free += out != NULL || g_err.msg[0] != 0;
        free(out);
    }
    CHECK(crashed_free == 4000);
}

typedef struct thread_job {
    const chat_template *t;
    json_t *vars;
    int mismatches;
    const char *want;
} thread_job;

static void *render_many(void *arg) {
    thread_job *j = arg;
    for (int i = 0; i < 200; i++) {
        char *out;
        base_err err;
        if (chat_template_render(j->t, j->vars, &out, NULL, &err) || strcmp(out, j->want) != 0)
            j->mismatches++;
        else
            free(out);
    }
    return NULL;
}

static void test_threads(void) {
    chat_template *t;
    CHECK(chat_template_parse("{% set ns = namespace(s='') %}{% for m in messages %}"
                              "{% set ns.s = ns.s ~ m %}{% endfor %}{{ ns.s }}{{ x | tojson }}",
                              &t, &g_err) == 0);
    json_error_t je;
    json_t *vars = json_loads("{\"messages\": [\"a\", \"b\"], \"x\": {\"k\": [1]}}", 0, &je);
    thread_job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (thread_job){t, vars, 0, "ab{\"k\": [1]}"};
        pthread_create(&th[i], NULL, render_many, &jobs[i]);
    }
    int bad = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        bad += jobs[i].mismatches;
    }
    CHECK(bad == 0);
    json_decref(vars);
    chat_template_free(t);
}

static void test_config(void) {
    char dir[] = "/tmp/mlxcel-chat-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    test_write_file(
        dir, "tokenizer_config.json",
        "{\"bos_token\": {\"content\": \"<s>\", \"lstrip\": false}, \"eos_token\": \"</s>\","
        " \"unk_token\": null, \"model_max_length\": 1000000000000000019884624838656,"
        " \"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"},"
        " {\"name\": \"default\", \"template\": \"{{ bos_token }}D\"}]}");
    char *source;
    json_t *special;
    base_err err;
    CHECK(chat_config_load(dir, &source, &special, &err) == 0);
    CHECK(source && strcmp(source, "{{ bos_token }}D") == 0);
    CHECK(strcmp(json_string_value(json_object_get(special, "bos_token")), "<s>") == 0);
    CHECK(strcmp(json_string_value(json_object_get(special, "eos_token")), "</s>") == 0);
    CHECK(json_object_get(special, "unk_token") == NULL);
    free(source);
    json_decref(special);

    test_write_file(dir, "tokenizer_config.json", "{\"eos_token\": \"<e>\"}");
    CHECK(chat_config_load(dir, &source, &special, &err) == 0 && source == NULL);
    json_decref(special);
    test_write_file(dir, "chat_template.jinja", "J{{ eos_token }}");
    CHECK(chat_config_load(dir, &source, &special, &err) == 0);
    CHECK(source && strcmp(source, "J{{ eos_token }}") == 0);
    free(source);
    json_decref(special);

    test_write_file(dir, "tokenizer_config.json", "{\"chat_template\": 5}");
    CHECK(chat_config_load(dir, &source, &special, &err) != 0 &&
          strstr(err.msg, "tokenizer_config.json"));
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    CHECK(chat_config_load(dir, &source, &special, &err) != 0 &&
          strstr(err.msg, "tokenizer_config.json"));
}

int main(void) {
    test_whitespace();
    test_control();
    test_nesting();
    test_macros();
    test_expressions();
    test_filters();
    test_tests();
    test_methods();
    test_globals();
    test_transformers_vars();
    test_errors();
    test_limits();
    test_malformed();
    test_threads();
    test_config();
    TEST_MAIN_END();
}
