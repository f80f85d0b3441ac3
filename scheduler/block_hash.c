/*
 * scheduler/block_hash.c - 128-bit prefix-cache keys.
 *
 * Each lane is a multiply-xorshift absorb over 64-bit words followed by a
 * strong finaliser (the splitmix64 / murmur3 fmix64 constants); the two lanes
 * use different seeds and multipliers so they are independent enough that a
 * simultaneous collision is out of reach for a cache of any real size.
 */
#include "scheduler/block_hash.h"

static uint64_t fmix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static uint64_t rotl64(uint64_t x, int r) {
    return (x << r) | (x >> (64 - r));
}

struct lanes {
    uint64_t a;
    uint64_t b;
};

static void absorb(struct lanes *l, uint64_t w) {
    l->a = rotl64(l->a ^ fmix64(w + 0x9e3779b97f4a7c15ull), 27) * 0x87c37b91114253d5ull;
    l->b = rotl64(l->b ^ fmix64(w ^ 0xc2b2ae3d27d4eb4full), 31) * 0x4cf5ad432745937full;
}

struct block_hash block_hash_compute(struct block_hash parent, const int32_t *tokens,
                                     int32_t n_tokens, uint64_t adapter_id) {
    struct lanes l = {parent.lo ^ 0x243f6a8885a308d3ull, parent.hi ^ 0x13198a2e03707344ull};
    absorb(&l, parent.hi);
    absorb(&l, parent.lo);
    absorb(&l, adapter_id);
    absorb(&l, (uint64_t)(uint32_t)n_tokens);
    int32_t i = 0;
    // two tokens per absorbed word
    for (; i + 1 < n_tokens; i += 2)
        absorb(&l, (uint64_t)(uint32_t)tokens[i] | ((uint64_t)(uint32_t)tokens[i + 1] << 32));
    if (i < n_tokens) absorb(&l, (uint64_t)(uint32_t)tokens[i] | (0xffffffffull << 32));
    struct block_hash h = {fmix64(l.a ^ rotl64(l.b, 17)), fmix64(l.b + l.a)};
    return h;
}

bool block_hash_equal(struct block_hash a, struct block_hash b) {
    return a.lo == b.lo && a.hi == b.hi;
}
