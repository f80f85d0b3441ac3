/*
 * test_json_schema.c - JSON Schema to GBNF, judged two ways: texts whose
 * validity under each schema is derived by hand from the schema (FULL: a
 * whole valid document, PREFIX: only the start of one, REJECT), and seeded
 * random documents drawn from each grammar byte by byte that
 * scripts/validate-json (Python's json module and the jsonschema package, not
 * our code) must parse and validate, for 100% of them. Bad schemas must be
 * ERR_INVAL with a message naming the keyword.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "engine/base/buf.h"
#include "engine/base/err.h"
#include "engine/engine.h"
#include "server/json_schema.h"
#include "tests/helpers/testutil.h"

enum { REJECT = -1, PREFIX = 0, FULL = 1 };

static struct gbnf *compile_schema(const char *schema_text) {
    json_error_t je;
    json_t *schema = json_loads(schema_text, JSON_DECODE_ANY, &je);
    if (!schema) fail_msg("bad test schema: %s", je.text);
    struct buf gb = {0};
    char msg[256];
    int err = json_schema_to_gbnf(schema, &gb, msg, sizeof(msg));
    json_decref(schema);
    if (err) fail_msg("schema %s: %s", schema_text, msg);
    struct gbnf *g = NULL;
    err = gbnf_compile(gb.data, gb.len, &g, msg, sizeof(msg));
    if (err) fail_msg("grammar of %s does not compile: %s\n%s", schema_text, msg, gb.data);
    buf_free(&gb);
    return g;
}

static int match(struct gbnf *g, const char *text) {
    struct grammar *gm = grammar_create(g);
    enum grammar_step st = grammar_accept_bytes(gm, text, strlen(text));
    int r = st == GRAMMAR_STEP_REJECT ? REJECT : grammar_is_accepting(gm) ? FULL : PREFIX;
    grammar_free(gm);
    return r;
}

struct case_ {
    const char *text;
    int want;
};

static void check(const char *schema, const struct case_ *c, size_t n) {
    struct gbnf *g = compile_schema(schema);
    for (size_t i = 0; i < n; i++) {
        int got = match(g, c[i].text);
        if (got != c[i].want)
            fail_msg("schema %s on '%s': got %d want %d", schema, c[i].text, got, c[i].want);
    }
    gbnf_release(g);
}

#define CHECK(s, ...)                                \
    do {                                             \
        const struct case_ cs_[] = {__VA_ARGS__};    \
        check(s, cs_, sizeof(cs_) / sizeof(cs_[0])); \
    } while (0)

static void test_json_schema_object_properties_required(void **state) {
    (void)state;
    const char *s =
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
        "\"age\":{\"type\":\"integer\"},\"ok\":{\"type\":\"boolean\"}},"
        "\"required\":[\"name\",\"ok\"],\"additionalProperties\":false}";
    CHECK(s, {"{\"name\":\"x\",\"ok\":true}", FULL},
          {"{\"name\": \"x\", \"age\": 3, \"ok\": false}", FULL},
          {"{ \"name\" : \"\\u00e9\\n\" ,\n  \"ok\":true }", FULL}, {"{\"name\":\"x\"", PREFIX},
          {"{\"name\":\"x\",\"ok\":tr", PREFIX}, {"{\"ok\":true}", REJECT},  // name is required
          {"{\"name\":\"x\",\"ok\":true,\"z\":1}", REJECT},  // additionalProperties false
          {"{\"name\":\"x\",\"age\":3.5,\"ok\":true}", REJECT},
          {"{\"name\":\"x\",\"age\":01,\"ok\":true}", REJECT},
          {"{\"name\":\"x\",\"ok\":true} ", REJECT},  // nothing after the root value
          {"{\"name\":\"x\",,\"ok\":true}", REJECT});
    // beside properties, no others even when additionalProperties is absent
    CHECK("{\"properties\":{\"a\":{\"const\":1}}}", {"{}", FULL}, {"{\"a\":1}", FULL},
          {"{\"a\":1,\"b\":[null]}", REJECT}, {"{\"a\":2}", REJECT});
    // no properties: any members
    CHECK("{\"type\":\"object\"}", {"{}", FULL}, {"{\"b\":{\"c\":[]}, \"d\": 1}", FULL},
          {"[]", REJECT});
    // additionalProperties as a schema
    CHECK("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"number\"}}", {"{}", FULL},
          {"{\"x\":1,\"y\":-2.5e3}", FULL}, {"{\"x\":\"1\"}", REJECT});
}

static void test_json_schema_enum_const_anyof_types(void **state) {
    (void)state;
    CHECK("{\"enum\":[\"red\",\"green\",3,null,{\"a\":[1]}]}", {"\"red\"", FULL}, {"3", FULL},
          {"null", FULL}, {"{\"a\":[1]}", FULL}, {"\"blue\"", REJECT}, {"4", REJECT},
          {"\"re", PREFIX});
    CHECK("{\"const\":\"a\\\"b\"}", {"\"a\\\"b\"", FULL}, {"\"ab\"", REJECT});
    CHECK(
        "{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"array\",\"items\":{\"type\":\"string\"}}]}",
        {"12", FULL}, {"[\"a\", \"b\"]", FULL}, {"[]", FULL}, {"[1]", REJECT}, {"\"s\"", REJECT});
    CHECK("{\"oneOf\":[{\"type\":\"null\"},{\"type\":\"boolean\"}]}", {"null", FULL},
          {"false", FULL}, {"0", REJECT});
    CHECK("{\"type\":[\"string\",\"null\"]}", {"\"x\"", FULL}, {"null", FULL}, {"1", REJECT});
    CHECK("{\"type\":\"number\"}", {"0", FULL}, {"-0.5", FULL}, {"1e10", FULL}, {"1.", PREFIX},
          {".5", REJECT}, {"+1", REJECT}, {"1e1234", REJECT}, {"12345678901234567", REJECT});
    CHECK("true", {"[{\"a\":\"b\"}, 1, null]", FULL}, {"{", PREFIX}, {"}", REJECT});
}

static void test_json_schema_arrays_refs(void **state) {
    (void)state;
    CHECK("{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":3}",
          {"[1,2]", FULL}, {"[1, 2, 3]", FULL}, {"[1", PREFIX}, {"[1]", REJECT},
          {"[1,2,3,4]", REJECT}, {"[]", REJECT}, {"[1,]", REJECT});
    CHECK("{\"type\":\"array\",\"maxItems\":0}", {"[]", FULL}, {"[1]", REJECT});
    // recursion through $defs, and the root itself
    const char *tree =
        "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":"
        "\"integer\"},\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},"
        "\"required\":[\"v\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}";
    CHECK(tree, {"{\"v\":1}", FULL}, {"{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[]},{\"v\":3}]}", FULL},
          {"{\"v\":1,\"kids\":[{\"kids\":[]}]}", REJECT});
    CHECK(
        "{\"type\":\"object\",\"properties\":{\"next\":{\"$ref\":\"#\"}},\"additionalProperties\":"
        "false}",
        {"{}", FULL}, {"{\"next\":{\"next\":{}}}", FULL}, {"{\"next\":1}", REJECT});
    CHECK("{\"definitions\":{\"a/b\":{\"type\":\"null\"}},\"$ref\":\"#/definitions/a~1b\"}",
          {"null", FULL}, {"1", REJECT});
}

static void test_json_schema_strings_pattern_format(void **state) {
    (void)state;
    CHECK("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", {"\"ab\"", FULL},
          {"\"a\\nc\"", FULL}, {"\"\xc3\xa9\xc3\xa9\"", FULL}, {"\"a\"", REJECT},
          {"\"abcd\"", REJECT});
    CHECK("{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d{3,4}$\"}", {"\"AB-123\"", FULL},
          {"\"AB-1234\"", FULL}, {"\"AB-12\"", REJECT}, {"\"ab-123\"", REJECT},
          {"\"AB-12345\"", REJECT});
    CHECK("{\"type\":\"string\",\"pattern\":\"^(cat|dog)s?$\"}", {"\"cats\"", FULL},
          {"\"dog\"", FULL}, {"\"cow\"", REJECT});
    // a group that can match nothing, repeated a bounded number of times or
    // made optional
    CHECK("{\"type\":\"string\",\"pattern\":\"^(a?){2}(|b)?c$\"}", {"\"aabc\"", FULL},
          {"\"c\"", FULL}, {"\"ac\"", FULL}, {"\"aaac\"", REJECT});
    // ... or without bound (fuzz_grammar found the first, then refused as left
    // recursion; its input is crash-schema-nullable-repeat). Strings derived
    // by hand from ECMAScript regex semantics.
    CHECK("{\"type\":\"string\",\"pattern\":\"^[aAz]+x(|yT){2,}3\\\\d$\"}", {"\"ax35\"", FULL},
          {"\"AzxyT37\"", FULL}, {"\"axyTyTyT30\"", FULL}, {"\"ax3\"", REJECT},
          {"\"xyT35\"", REJECT}, {"\"axy35\"", REJECT});
    CHECK("{\"type\":\"string\",\"pattern\":\"^(a?)*$\"}", {"\"\"", FULL}, {"\"aaa\"", FULL},
          {"\"ab\"", REJECT});
    CHECK("{\"type\":\"string\",\"pattern\":\"^(a|)+$\"}", {"\"\"", FULL}, {"\"aa\"", FULL},
          {"\"b\"", REJECT});
    CHECK("{\"type\":\"string\",\"pattern\":\"^((b*)c?)*$\"}", {"\"bcbbcc\"", FULL},
          {"\"cb\"", FULL}, {"\"\"", FULL}, {"\"a\"", REJECT});
    CHECK("{\"type\":\"string\",\"pattern\":\"(a?)*\"}", {"\"bbb\"", FULL}, {"\"\"", FULL});
    // unanchored: the pattern may sit anywhere in the string
    CHECK("{\"type\":\"string\",\"pattern\":\"ab\"}", {"\"xxabyy\"", FULL}, {"\"ab\"", FULL},
          {"\"a\"", REJECT});
    // a quote in the pattern is \" in the JSON text; [^...] never takes a raw quote
    CHECK("{\"type\":\"string\",\"pattern\":\"^\\\"[^x]\\\\.$\"}", {"\"\\\"y.\"", FULL},
          {"\"\\\"\\\\.\"", FULL}, {"\"\\\"x.\"", REJECT}, {"\"\"y.\"", REJECT});
    CHECK("{\"type\":\"string\",\"format\":\"date\"}", {"\"2024-02-28\"", FULL},
          {"\"1999-12-31\"", FULL}, {"\"2024-04-31\"", REJECT}, {"\"2024-13-01\"", REJECT},
          {"\"0000-01-01\"", REJECT});
    CHECK("{\"type\":\"string\",\"format\":\"uuid\"}",
          {"\"123e4567-e89b-12d3-a456-426614174000\"", FULL},
          {"\"123e4567e89b12d3a456426614174000\"", REJECT});
    CHECK("{\"type\":\"string\",\"format\":\"date-time\"}", {"\"2024-01-02T03:04:05Z\"", FULL},
          {"\"2024-01-02T03:04:05.123+01:00\"", FULL}, {"\"2024-01-02 03:04:05Z\"", REJECT});
}

static void expect_error(const char *schema_text, const char *needle) {
    json_error_t je;
    json_t *schema = json_loads(schema_text, JSON_DECODE_ANY, &je);
    assert_non_null(schema);
    struct buf gb = {0};
    char msg[256];
    int err = json_schema_to_gbnf(schema, &gb, msg, sizeof(msg));
    json_decref(schema);
    if (err != ERR_INVAL) fail_msg("schema %s: got %d, want ERR_INVAL", schema_text, err);
    if (!strstr(msg, needle))
        fail_msg("schema %s: message '%s' lacks '%s'", schema_text, msg, needle);
    assert_int_equal(gb.len, 0);
    buf_free(&gb);
}

static void test_json_schema_errors(void **state) {
    (void)state;
    expect_error("{\"type\":\"integer\",\"minimum\":0}", "keyword 'minimum' at #");
    expect_error("{\"properties\":{\"a\":{\"type\":\"array\",\"uniqueItems\":true}}}",
                 "'uniqueItems' at #/properties/a");
    expect_error("{\"type\":\"string\",\"format\":\"email\"}", "format 'email'");
    expect_error("{\"type\":\"strin\"}", "unknown type 'strin'");
    expect_error("{\"$ref\":\"#/$defs/missing\"}", "unresolvable $ref");
    expect_error("{\"type\":\"array\",\"minItems\":5000}", "'minItems' at # is over 1000");
    expect_error("{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", "below 'minItems'");
    expect_error("{\"type\":\"object\",\"required\":[\"a\"],\"properties\":{}}", "'a'");
    expect_error("{\"type\":\"string\",\"pattern\":\"(?=a)\"}", "group '(?'");
    expect_error("{\"type\":\"string\",\"pattern\":\"a{2,1}\"}", "n < m");
    expect_error("{\"type\":\"string\",\"pattern\":\"a$b\"}", "anchor");
    expect_error("{\"type\":\"string\",\"pattern\":\"(a\"}", "unbalanced");
    expect_error("{\"type\":\"string\",\"pattern\":\"^a|b$\"}", "'|' beside an anchor");
    expect_error("{\"allOf\":[{},{}]}", "allOf");
    expect_error("{\"properties\":{\"a\":{}},\"additionalProperties\":true}",
                 "additionalProperties");
    expect_error("false", "matches nothing");
    expect_error("3", "must be an object or a boolean");
    // nesting past the limit
    struct buf deep = {0};
    for (int i = 0; i < 100; i++) buf_append_str(&deep, "{\"items\":");
    buf_append_str(&deep, "{}");
    for (int i = 0; i < 100; i++) buf_append_char(&deep, '}');
    expect_error(deep.data, "nested deeper than 64");
    buf_free(&deep);
}

static uint64_t rng_next_(uint64_t *x) {
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    return *x >> 33;
}

/* Mutated schemas (bytes replaced, deleted, inserted) and random patterns:
 * whatever jansson parses must convert and compile, or fail with ERR_INVAL
 * and a message; never crash (ASan/UBSan watch this test too). */
static void test_json_schema_fuzz(void **state) {
    (void)state;
    static const char *const seeds[] = {
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"^[a-z]+(x|y)"
        "{2,3}\\\\d$\"},"
        "\"b\":{\"$ref\":\"#/$defs/n\"},\"c\":{\"enum\":[1,\"x\",null]}},\"required\":[\"a\"],"
        "\"additionalProperties\":false,\"$defs\":{\"n\":{\"anyOf\":[{\"type\":\"null\"},{\"$ref\":"
        "\"#\"}]}}}",
        "{\"type\":\"array\",\"items\":{\"type\":[\"integer\",\"string\"],\"format\":\"date\"},"
        "\"minItems\":1,"
        "\"maxItems\":3}",
    };
    const char alphabet[] = "{}[]\":,\\^$|()*+?.-0123456789azAZ ";
    uint64_t x = 0xf00d;
    int n_ok = 0, n_err = 0;
    char buf[1024];
    for (int it = 0; it < 6000; it++) {
        const char *seed = seeds[it % 2];
        size_t n = strlen(seed);
        memcpy(buf, seed, n);
        int n_mut = 1 + (int)(rng_next_(&x) % 2);
        for (int m = 0; m < n_mut; m++) {
            size_t at = (size_t)(rng_next_(&x) % n);
            char c = alphabet[rng_next_(&x) % (sizeof(alphabet) - 1)];
            int kind = (int)(rng_next_(&x) % 3);
            if (kind == 0) {
                buf[at] = c;
            } else if (kind == 1 && n > 1) {
                memmove(buf + at, buf + at + 1, n - at - 1);
                n--;
            } else if (n + 1 < sizeof(buf)) {
                memmove(buf + at + 1, buf + at, n - at);
                buf[at] = c;
                n++;
            }
        }
        json_t *schema = json_loadb(buf, n, JSON_DECODE_ANY, NULL);
        if (!schema) continue;
        struct buf gb = {0};
        char msg[256];
        int err = json_schema_to_gbnf(schema, &gb, msg, sizeof(msg));
        json_decref(schema);
        if (!err) {
            struct gbnf *g = NULL;
            err = gbnf_compile(gb.data, gb.len, &g, msg, sizeof(msg));
            if (!err) {
                struct grammar *gm = grammar_create(g);
                for (int k = 0; k < 32; k++) {
                    uint8_t b = (uint8_t)(rng_next_(&x) >> 11);
                    if (grammar_accept_bytes(gm, &b, 1) == GRAMMAR_STEP_DONE) break;
                }
                grammar_free(gm);
                gbnf_release(g);
            }
        }
        buf_free(&gb);
        if (err) {
            if (err != ERR_INVAL) fail_msg("schema %.*s: error %d", (int)n, buf, err);
            assert_true(msg[0] != '\0');
            n_err++;
        } else {
            n_ok++;
        }
    }
    assert_true(n_ok > 100 && n_err > 100);  // both sides reached
}

/* ---- sampled documents, judged by scripts/validate-json ------------------- */

static uint64_t rng(uint64_t *x) {
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    return *x >> 33;
}

/* Draws one document of g: random allowed bytes (closing ones favoured, so
 * documents end), until the grammar is complete. Returns false if it did not
 * end within max_len bytes. */
static bool sample_doc(struct gbnf *g, uint64_t *x, struct buf *out, size_t max_len) {
    struct grammar *gm = grammar_create(g);
    buf_reset(out);
    bool done = false;
    while (out->len < max_len && !done) {
        if (grammar_is_accepting(gm) && rng(x) % 4 == 0) break;
        uint8_t allowed[256];
        int n = 0;
        for (int b = 0; b < 256; b++)
            if (grammar_allows_byte(gm, (uint8_t)b)) allowed[n++] = (uint8_t)b;
        if (n == 0) break;
        uint8_t pick = allowed[rng(x) % (uint64_t)n];
        for (int i = 0; i < n; i++)
            if (strchr("\"]}", allowed[i]) && allowed[i] && rng(x) % 3 == 0) pick = allowed[i];
        buf_append(out, &pick, 1);
        done = grammar_accept_bytes(gm, &pick, 1) == GRAMMAR_STEP_DONE;
    }
    bool ok = done || grammar_is_accepting(gm);
    grammar_free(gm);
    return ok;
}

static const char *const sampled_schemas[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":8},"
    "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\"]}"
    ","
    "\"maxItems\":3}},\"required\":[\"name\"],\"additionalProperties\":false}",
    "{\"$defs\":{\"p\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\"},"
    "\"y\":{\"type\":[\"number\",\"null\"]}},\"required\":[\"x\",\"y\"],\"additionalProperties\":"
    "false}},"
    "\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/p\"},\"minItems\":1,\"maxItems\":4}",
    "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"string\",\"format\":\"uuid\"},"
    "\"day\":{\"type\":\"string\",\"format\":\"date\"},\"code\":{\"type\":\"string\","
    "\"pattern\":\"^[A-Z]{2}-\\\\d{3}$\"},\"kind\":{\"oneOf\":[{\"const\":\"x\"},{\"type\":"
    "\"boolean\"}]}},"
    "\"required\":[\"id\",\"day\",\"code\",\"kind\"],\"additionalProperties\":false}",
    "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\",\"pattern\":\"q[0-9]\"}}",
    "true",
};

static void test_json_schema_sampled_documents_validate(void **state) {
    (void)state;
    if (!testutil_exists("/usr/bin/python3") ||
        system("/usr/bin/python3 -c 'import jsonschema' 2>/dev/null") != 0) {
        skip();  // needs Debian's python3-jsonschema (scripts/setup installs it)
        return;
    }
    char path[] = "/tmp/llmserve-json-schema-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    uint64_t x = 2024;
    int n_docs = 0;
    struct buf doc = {0};
    for (size_t s = 0; s < sizeof(sampled_schemas) / sizeof(*sampled_schemas); s++) {
        struct gbnf *g = compile_schema(sampled_schemas[s]);
        json_t *schema = json_loads(sampled_schemas[s], JSON_DECODE_ANY, NULL);
        for (int k = 0; k < 20; k++) {
            if (!sample_doc(g, &x, &doc, 600)) continue;
            json_t *line = json_pack("{s:O, s:s%}", "schema", schema, "text", doc.data, doc.len);
            assert_non_null(line);  // the grammar only makes valid UTF-8
            char *text = json_dumps(line, JSON_COMPACT);
            fprintf(f, "%s\n", text);
            free(text);
            json_decref(line);
            n_docs++;
        }
        json_decref(schema);
        gbnf_release(g);
    }
    buf_free(&doc);
    fclose(f);
    assert_true(n_docs >= 60);  // most walks end well within 600 bytes
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "/usr/bin/python3 %s/scripts/validate-json < %s",
             testutil_source_dir(), path);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char line[1024];
    int n_ok = 0;
    while (fgets(line, sizeof(line), p)) {
        if (strncmp(line, "ok", 2) == 0)
            n_ok++;
        else
            fail_msg("validate-json: %s", line);
    }
    assert_int_equal(pclose(p), 0);
    unlink(path);
    assert_int_equal(n_ok, n_docs);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_schema_object_properties_required),
        cmocka_unit_test(test_json_schema_enum_const_anyof_types),
        cmocka_unit_test(test_json_schema_arrays_refs),
        cmocka_unit_test(test_json_schema_strings_pattern_format),
        cmocka_unit_test(test_json_schema_errors),
        cmocka_unit_test(test_json_schema_fuzz),
        cmocka_unit_test(test_json_schema_sampled_documents_validate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
