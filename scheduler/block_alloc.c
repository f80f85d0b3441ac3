/*
 * scheduler/block_alloc.c - ref counts, LRU free list and the prefix-cache map.
 *
 * Free list: blocks[] entries linked by index through prev/next; index
 * n_blocks is the sentinel, so an empty list is sentinel <-> sentinel and no
 * operation needs a NULL check:
 *
 *     sentinel <-> head (evicted first) <-> ... <-> tail (freed last) <-> sentinel
 *
 * Map: linear probing over map_cap (a power of two >= 2 * n_blocks) slots of
 * block ids, 0 = empty; deletion shifts later entries back (no tombstones), so
 * the map never degrades however long the server runs.
 */
#define LOG_TAG "sched"
#include "scheduler/block_alloc.h"

#include <stdlib.h>
#include <string.h>

#include "engine/base/alloc.h"
#include "engine/base/err.h"
#include "engine/base/log.h"

struct block_meta {
    int32_t n_refs;
    int32_t prev;          // free-list links, valid when on_list
    int32_t next;
    uint64_t adapter_id;   // adapter identity of the cached tokens (0: none)
    bool on_list;
    bool has_key;
    struct block_hash key; // valid when has_key
};

struct block_alloc {
    int32_t n_blocks;             // block 0 included
    int32_t block_size;
    int32_t n_on_list;            // free + cached
    int32_t n_cached;             // on the list with a key
    struct block_meta *blocks;    // owned; [n_blocks + 1], the last is the sentinel
    int32_t *tokens;              // owned; [n_blocks * block_size] tokens of keyed blocks
    int32_t *map;                 // owned; [map_cap] block ids, 0 = empty slot
    uint32_t map_mask;            // map_cap - 1
};

/* ---- free list ---- */

static void list_remove(struct block_alloc *a, int32_t id) {
    struct block_meta *b = &a->blocks[id];
    DASSERT(b->on_list);
    a->blocks[b->prev].next = b->next;
    a->blocks[b->next].prev = b->prev;
    b->on_list = false;
    a->n_on_list--;
    if (b->has_key) a->n_cached--;
}

static void list_push_tail(struct block_alloc *a, int32_t id) {
    int32_t s = a->n_blocks;
    struct block_meta *b = &a->blocks[id];
    DASSERT(!b->on_list);
    b->prev = a->blocks[s].prev;
    b->next = s;
    a->blocks[b->prev].next = id;
    a->blocks[s].prev = id;
    b->on_list = true;
    a->n_on_list++;
    if (b->has_key) a->n_cached++;
}

/* ---- map ---- */

static uint32_t map_home(const struct block_alloc *a, struct block_hash key) {
    return (uint32_t)(key.lo ^ (key.hi >> 7)) & a->map_mask;
}

static uint32_t map_find_slot(const struct block_alloc *a, struct block_hash key) {
    uint32_t i = map_home(a, key);
    while (a->map[i] != 0 && !block_hash_equal(a->blocks[a->map[i]].key, key))
        i = (i + 1) & a->map_mask;
    return i;
}

static void map_remove(struct block_alloc *a, int32_t id) {
    uint32_t i = map_find_slot(a, a->blocks[id].key);
    ASSERT(a->map[i] == id);
    a->map[i] = 0;
    // Backward-shift deletion: move up every later entry of the run whose home
    // is not in (i, j], so lookups never stop early at the hole.
    uint32_t j = i;
    for (;;) {
        j = (j + 1) & a->map_mask;
        if (a->map[j] == 0) break;
        uint32_t h = map_home(a, a->blocks[a->map[j]].key);
        bool stays = (i <= j) ? (i < h && h <= j) : (i < h || h <= j);
        if (stays) continue;
        a->map[i] = a->map[j];
        a->map[j] = 0;
        i = j;
    }
}

static void drop_key(struct block_alloc *a, int32_t id) {
    struct block_meta *b = &a->blocks[id];
    if (!b->has_key) return;
    map_remove(a, id);
    if (b->on_list) a->n_cached--;
    b->has_key = false;
}

/* ---- lifecycle ---- */

int block_alloc_create(int32_t n_blocks, int32_t block_size, struct block_alloc **out) {
    *out = NULL;
    if (n_blocks < 2 || block_size < 1 || n_blocks > (1 << 28) || block_size > (1 << 16))
        return ERR_INVAL;
    struct block_alloc *a = calloc(1, sizeof(*a));
    if (!a) return ERR_NOMEM;
    a->n_blocks = n_blocks;
    a->block_size = block_size;
    uint32_t cap = 4;
    while (cap < 2u * (uint32_t)n_blocks) cap <<= 1;
    a->map_mask = cap - 1;
    a->blocks = calloc((size_t)n_blocks + 1, sizeof(*a->blocks));
    a->tokens = malloc((size_t)n_blocks * (size_t)block_size * sizeof(*a->tokens));
    a->map = calloc(cap, sizeof(*a->map));
    if (!a->blocks || !a->tokens || !a->map) {
        LOG_ERROR("%s: cannot allocate the ledger for %d blocks of %d tokens", __func__,
                  (int)n_blocks, (int)block_size);
        block_alloc_destroy(a);
        return ERR_NOMEM;
    }
    int32_t s = n_blocks;
    a->blocks[s].prev = s;
    a->blocks[s].next = s;
    for (int32_t id = 1; id < n_blocks; id++) list_push_tail(a, id);
    *out = a;
    return 0;
}

void block_alloc_destroy(struct block_alloc *a) {
    if (!a) return;
    free(a->blocks);
    free(a->tokens);
    free(a->map);
    free(a);
}

/* ---- queries ---- */

int32_t block_alloc_block_size(const struct block_alloc *a) { return a->block_size; }
int32_t block_alloc_n_total(const struct block_alloc *a) { return a->n_blocks - 1; }
int32_t block_alloc_n_free(const struct block_alloc *a) { return a->n_on_list; }
int32_t block_alloc_n_cached(const struct block_alloc *a) { return a->n_cached; }
int32_t block_alloc_n_used(const struct block_alloc *a) { return a->n_blocks - 1 - a->n_on_list; }

int32_t block_alloc_n_refs(const struct block_alloc *a, int32_t id) {
    ASSERT(id > 0 && id < a->n_blocks);
    return a->blocks[id].n_refs;
}

bool block_alloc_is_cached(const struct block_alloc *a, int32_t id) {
    ASSERT(id > 0 && id < a->n_blocks);
    return a->blocks[id].has_key;
}

/* ---- operations ---- */

int32_t block_alloc_allocate(struct block_alloc *a) {
    int32_t id = a->blocks[a->n_blocks].next;
    if (id == a->n_blocks) return 0;
    list_remove(a, id);
    drop_key(a, id);  // evict: the LRU cached block is reused for new tokens
    a->blocks[id].n_refs = 1;
    return id;
}

void block_alloc_ref(struct block_alloc *a, int32_t id) {
    ASSERT(id > 0 && id < a->n_blocks);
    struct block_meta *b = &a->blocks[id];
    if (b->n_refs == 0) {
        ASSERT(b->has_key);  // only a cached block may be revived
        list_remove(a, id);
    }
    b->n_refs++;
}

void block_alloc_unref(struct block_alloc *a, int32_t id) {
    ASSERT(id > 0 && id < a->n_blocks);
    struct block_meta *b = &a->blocks[id];
    ASSERT(b->n_refs > 0);  // a double free is our bug
    if (--b->n_refs == 0) list_push_tail(a, id);
}

int32_t block_alloc_lookup(const struct block_alloc *a, struct block_hash key,
                           const int32_t *tokens, uint64_t adapter_id) {
    int32_t id = a->map[map_find_slot(a, key)];
    if (id == 0) return 0;
    const struct block_meta *b = &a->blocks[id];
    size_t bytes = (size_t)a->block_size * sizeof(*tokens);
    if (b->adapter_id != adapter_id || memcmp(&a->tokens[(size_t)id * (size_t)a->block_size], tokens, bytes))
        return 0;  // a 128-bit collision: never hand out different tokens
    return id;
}

bool block_alloc_publish(struct block_alloc *a, int32_t id, struct block_hash key,
                         const int32_t *tokens, uint64_t adapter_id) {
    ASSERT(id > 0 && id < a->n_blocks);
    struct block_meta *b = &a->blocks[id];
    ASSERT(b->n_refs > 0);
    if (b->has_key) return false;
    uint32_t slot = map_find_slot(a, key);
    if (a->map[slot] != 0) return false;  // another block already caches this prefix
    a->map[slot] = id;
    b->key = key;
    b->has_key = true;
    b->adapter_id = adapter_id;
    memcpy(&a->tokens[(size_t)id * (size_t)a->block_size], tokens,
           (size_t)a->block_size * sizeof(*tokens));
    return true;
}

void block_alloc_clear_cache(struct block_alloc *a) {
    int32_t s = a->n_blocks;
    for (int32_t id = a->blocks[s].next; id != s; id = a->blocks[id].next) drop_key(a, id);
}

/* ---- invariants ---- */

#define CHECK(cond, ...)                                   \
    do {                                                   \
        if (!(cond)) {                                     \
            LOG_ERROR("block_alloc_check: " __VA_ARGS__);  \
            return false;                                  \
        }                                                  \
    } while (0)

bool block_alloc_check(const struct block_alloc *a) {
    int32_t s = a->n_blocks;
    const struct block_meta *null_b = &a->blocks[0];
    CHECK(null_b->n_refs == 0 && !null_b->on_list && !null_b->has_key, "null block touched");
    // Walk the list forward, checking back links and bounding the walk.
    int32_t n_list = 0;
    int32_t n_list_keyed = 0;
    int32_t prev = s;
    for (int32_t id = a->blocks[s].next; id != s; id = a->blocks[id].next) {
        CHECK(id > 0 && id < s, "list holds bad id %d", (int)id);
        CHECK(n_list < s, "free list has a cycle");
        const struct block_meta *b = &a->blocks[id];
        CHECK(b->on_list, "block %d linked but not marked on_list", (int)id);
        CHECK(b->prev == prev, "block %d prev link %d, expected %d", (int)id, (int)b->prev,
              (int)prev);
        CHECK(b->n_refs == 0, "block %d on the free list with n_refs %d", (int)id, (int)b->n_refs);
        n_list++;
        n_list_keyed += b->has_key;
        prev = id;
    }
    CHECK(a->blocks[s].prev == prev, "sentinel prev link broken");
    CHECK(n_list == a->n_on_list, "free list length %d, counter %d", (int)n_list,
          (int)a->n_on_list);
    CHECK(n_list_keyed == a->n_cached, "cached on list %d, counter %d", (int)n_list_keyed,
          (int)a->n_cached);
    int32_t n_used = 0;
    int32_t n_keyed = 0;
    for (int32_t id = 1; id < s; id++) {
        const struct block_meta *b = &a->blocks[id];
        CHECK(b->n_refs >= 0, "block %d n_refs %d", (int)id, (int)b->n_refs);
        CHECK((b->n_refs == 0) == b->on_list, "block %d n_refs %d but on_list %d", (int)id,
              (int)b->n_refs, (int)b->on_list);
        n_used += b->n_refs > 0;
        if (b->has_key) {
            n_keyed++;
            CHECK(a->map[map_find_slot(a, b->key)] == id, "keyed block %d not found in map",
                  (int)id);
        }
    }
    CHECK(n_used + n_list == s - 1, "used %d + free %d != total %d", (int)n_used, (int)n_list,
          (int)(s - 1));
    int32_t n_map = 0;
    for (uint32_t i = 0; i <= a->map_mask; i++) {
        int32_t id = a->map[i];
        if (id == 0) continue;
        CHECK(id > 0 && id < s && a->blocks[id].has_key, "map slot %u holds unkeyed block %d",
              (unsigned)i, (int)id);
        n_map++;
    }
    CHECK(n_map == n_keyed, "map holds %d entries, %d blocks keyed", (int)n_map, (int)n_keyed);
    return true;
}
