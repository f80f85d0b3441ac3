/*
 * server/json_schema.h - JSON Schema (the subset structured output needs) to
 * a GBNF grammar (engine/gbnf.h) whose sentences are exactly the compact-ish
 * JSON texts that satisfy the schema, for response_format and tools.
 *
 * Supported: type (one or a list), properties + required (properties appear
 * in the declared order, optional ones may be left out), additionalProperties
 * (beside properties: false or absent, no others, as OpenAI's strict mode
 * has it; without properties: true or absent, any members; a schema: members
 * of that schema), enum, const, anyOf, oneOf (as anyOf: the
 * grammar cannot exclude overlaps), $ref to "#/$defs/..." or
 * "#/definitions/..." (recursion allowed), "#" (the root), items, minItems,
 * maxItems, minLength, maxLength, pattern (a regex subset: literals, ., [...]
 * classes with ranges and negation, \d \w \s and their negations, ( ) groups,
 * |, * + ? {m} {m,} {m,n}, ^ and $ at the ends), format "date", "time",
 * "date-time" and "uuid" (a date's day is checked against its month;
 * February stops at 28). allOf with one schema. Annotations (title, description, default,
 * examples, $schema, $id, $comment, deprecated, readOnly, writeOnly, strict) are
 * ignored. Any other keyword is refused with ERR_INVAL and a message naming
 * it: a schema is never silently weakened.
 *
 * Numbers: integers of at most 16 digits, numbers with at most 16 fraction
 * and 3 exponent digits, so a sampled number always ends.
 * Threads: pure functions. [any thread]
 */
#ifndef SERVER_JSON_SCHEMA_H
#define SERVER_JSON_SCHEMA_H

#include <stddef.h>

#include <jansson.h>

#include "engine/base/buf.h"

#define JSON_SCHEMA_DEPTH_MAX 64  // deepest nesting of subschemas

/* Appends to out a grammar whose root is the schema's language. Returns 0, or
 * ERR_INVAL with a message in msg (e.g. "unsupported JSON Schema keyword
 * 'minimum' at #/properties/age"). */
int json_schema_to_gbnf(json_t *schema, struct buf *out, char *msg, size_t msg_size);

/* Appends rules (no root) in which rule `name` ([A-Za-z0-9_-]+, unique in
 * the grammar) matches the schema's language; helper rules are named
 * name-sN and kv-name-sN. The JSON primitives they use (value, object,
 * array, string, char, number, integer, ws, date, time, uuid, hex) are not
 * appended: a grammar appends json_schema_primitives_gbnf() once. For
 * grammars of several schemas (the tools of a request). Returns as
 * json_schema_to_gbnf(); out is unchanged on failure. */
int json_schema_to_gbnf_rule(json_t *schema, const char *name, struct buf *out, char *msg,
                             size_t msg_size);

/* Appends the JSON primitive rules named above. */
void json_schema_primitives_gbnf(struct buf *out);

/* Appends a grammar for any JSON object (response_format json_object): root
 * and the primitives. One copy of the JSON grammar's text, which
 * scripts/bench_grammar.c uses too. */
void json_schema_object_gbnf(struct buf *out);

/* Appends the GBNF literal (with quotes) matching exactly len bytes of s. */
void json_schema_gbnf_literal(struct buf *out, const char *s, size_t len);

#endif  // SERVER_JSON_SCHEMA_H
