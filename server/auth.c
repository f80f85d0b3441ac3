/*
 * server/auth.c - constant-time API key check. Each accepted key is stored
 * zero-padded to AUTH_KEY_MAX_BYTES with its length, and every check compares
 * the presented key against every stored key over the full width, OR-ing the
 * differences, so the time depends on neither the content nor the position of
 * a mismatch nor on which key matched.
 */
#include "server/auth.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct auth_key {
    unsigned char bytes[AUTH_KEY_MAX_BYTES];  // zero-padded
    size_t len;
};

struct auth {
    int32_t n_keys;
    struct auth_key *keys;  // owned [n_keys]
};

struct auth *auth_create(const char *const *keys, int32_t n_keys) {
    struct auth *a = calloc(1, sizeof(*a));
    if (!a) return NULL;
    if (n_keys > 0) {
        a->keys = calloc((size_t)n_keys, sizeof(*a->keys));
        if (!a->keys) {
            free(a);
            return NULL;
        }
    }
    for (int32_t i = 0; i < n_keys; i++) {
        size_t len = strlen(keys[i]);
        if (len > AUTH_KEY_MAX_BYTES) len = AUTH_KEY_MAX_BYTES;
        memcpy(a->keys[i].bytes, keys[i], len);
        a->keys[i].len = len;
    }
    a->n_keys = n_keys;
    return a;
}

void auth_destroy(struct auth *a) {
    if (!a) return;
    if (a->keys) {
        volatile unsigned char *p = (volatile unsigned char *)a->keys;
        for (size_t i = 0; i < (size_t)a->n_keys * sizeof(*a->keys); i++) p[i] = 0;
    }
    free(a->keys);
    free(a);
}

bool auth_is_open(const struct auth *a) {
    return a->n_keys == 0;
}

bool auth_check(const struct auth *a, const char *authorization) {
    if (a->n_keys == 0) return true;
    if (!authorization) return false;
    if (strncasecmp(authorization, "Bearer ", 7) != 0) return false;
    const char *key = authorization + 7;
    while (*key == ' ') key++;
    size_t len = strnlen(key, AUTH_KEY_MAX_BYTES + 1);
    if (len == 0 || len > AUTH_KEY_MAX_BYTES) return false;
    unsigned char given[AUTH_KEY_MAX_BYTES] = {0};
    memcpy(given, key, len);

    unsigned matched = 0;
    for (int32_t k = 0; k < a->n_keys; k++) {
        unsigned diff = (unsigned)(a->keys[k].len ^ len);
        for (size_t i = 0; i < AUTH_KEY_MAX_BYTES; i++) {
            diff |= (unsigned)(a->keys[k].bytes[i] ^ given[i]);
        }
        // diff == 0 -> 1, else 0, without a branch on the secret.
        matched |= 1u & ((diff - 1u) >> (sizeof(unsigned) * 8 - 1));
    }
    volatile unsigned char *g = given;
    for (size_t i = 0; i < sizeof(given); i++) g[i] = 0;
    return matched != 0;
}
