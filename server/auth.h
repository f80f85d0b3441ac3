/*
 * server/auth.h - API keys: the accepted set, and the check of a request's
 * "Authorization: Bearer KEY" header in constant time.
 *
 * Owns copies of the keys (cleared before they are freed). Keys are never
 * logged. Threads: immutable after auth_create(); auth_check() is
 * [any thread].
 */
#ifndef SERVER_AUTH_H
#define SERVER_AUTH_H

#include <stdbool.h>
#include <stdint.h>

#define AUTH_KEY_MAX_BYTES 256

struct auth;

/* Copies keys [n_keys]. n_keys 0: every request is allowed. NULL when out of
 * memory. Owned by the caller (auth_destroy()). */
struct auth *auth_create(const char *const *keys, int32_t n_keys);
void auth_destroy(struct auth *a);  // NULL-safe

/* True when the server needs no key. */
bool auth_is_open(const struct auth *a);

/* Checks the value of an Authorization header (NULL when absent). Accepts
 * "Bearer KEY" (scheme case-insensitive) where KEY equals one of the keys.
 * The comparison takes the same time whatever the key's content or where it
 * differs: every accepted key is compared in full over AUTH_KEY_MAX_BYTES.
 * Returns true when allowed. */
bool auth_check(const struct auth *a, const char *authorization);

#endif
