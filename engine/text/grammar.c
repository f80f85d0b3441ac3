/*
 * engine/text/grammar.c - the lazily determinised pushdown matcher and the
 * vocabulary byte trie (grammar.h has the idea).
 *
 * Data, per matcher:
 *   node  (pos, parent)   one stack frame; node 0 is the empty stack. A stack
 *                         is named by its top node; its top's pos is a BYTE
 *                         item, the frames below hold return positions (never
 *                         an END: a rule called last in an alternative returns
 *                         straight to the caller's caller).
 *   state  sorted node ids  a set of stacks; states are interned, so equal
 *                         sets have one id, with a lazily filled byte
 *                         transition table and a cached token mask.
 * The tables only grow while a sequence is decoded; when they pass their caps
 * between two tokens the matcher keeps its current stacks, forgets the rest
 * and starts afresh (compact()). When the current stacks alone hold more than
 * GRAMMAR_LIVE_NODES_MAX frames (an ambiguous grammar whose stacks all grow,
 * byte after byte), the matcher stops following (is_overgrown): copying them
 * again after every byte would cost a tenth of a second a byte. A closure (the stacks reached without
 * consuming a byte) visits each (pos, parent) at most once, so it ends even
 * for ambiguous grammars; gbnf.c has already refused left recursion.
 */
#include "engine/text/grammar.h"

#include <stdlib.h>
#include <string.h>

#include "engine/base/alloc.h"
#include "engine/base/buf.h"
#include "engine/base/err.h"
#include "engine/text/gbnf.h"
#include "engine/text/tokenizer.h"

/* The matcher's work bounds are powers of two shifted down by
 * GRAMMAR_BOUND_SHIFT. In the fuzz build (-DLLMSERVE_FUZZ) the shift is 6:
 * bounds 64 times smaller, so an ambiguous grammar reaches the paths past
 * them (a cut mask, a closure cut short, an overgrown matcher, compaction)
 * at 1/64 of the work. At full size such an input costs 1-3 s under ASan
 * and coverage, and the fuzzer, which keeps and mutates what is slow, runs
 * at tens of inputs a second; the code is the same at either size. */
#ifdef LLMSERVE_FUZZ
#define GRAMMAR_BOUND_SHIFT 6
#else
#define GRAMMAR_BOUND_SHIFT 0
#endif

#define GRAMMAR_STATES_MAX 8192    // states kept between tokens before a compaction
#define GRAMMAR_NODES_MAX ((1 << 18) >> GRAMMAR_BOUND_SHIFT)
// Stack frames the current stacks alone may hold after a compaction; past it the
// grammar is too ambiguous to follow. Half of GRAMMAR_NODES_MAX, so that between two
// compactions at least as many nodes are made as the next one copies.
#define GRAMMAR_LIVE_NODES_MAX (GRAMMAR_NODES_MAX / 2)
#define GRAMMAR_TABLES_MAX 4096    // transition tables (1 KiB each)
#define GRAMMAR_MASKS_MAX 32       // cached token masks
#define GRAMMAR_CLOSURE_MAX ((1 << 16) >> GRAMMAR_BOUND_SHIFT)  // configurations a closure visits
#define GRAMMAR_MASK_WORK ((1 << 18) >> GRAMMAR_BOUND_SHIFT)  // stacks and configurations per mask
#define GRAMMAR_TRANS_UNKNOWN (-2)
#define GRAMMAR_TRANS_DEAD (-1)

/* ---- the vocabulary trie ------------------------------------------------------- */

/* Trie nodes in depth-first preorder: the children of a node follow it, and
 * its subtree ends at `end`, so a rejected prefix skips the whole subtree. */
struct vocab_node {
    int32_t depth;   // bytes from the root: 1 for a first byte
    int32_t end;     // index past this node's subtree
    int32_t tok0;    // tokens whose piece ends here: ids[tok0, tok1)
    int32_t tok1;
    uint8_t byte;
};

struct grammar_vocab {
    int32_t n_vocab;
    struct vocab_node *nodes;  // owned; [n_nodes]
    int32_t n_nodes;
    int32_t max_depth;
    int32_t *ids;              // owned; token ids sorted by piece
    int32_t n_ids;
    char *pieces;              // owned; every token's piece back to back
    uint32_t *piece_off;       // owned; [n_vocab + 1]
    int32_t *eog;              // owned; [n_eog] end-of-generation ids
    int32_t n_eog;
};

/* Orders token ids by piece bytes, then by id. */
static int cmp_piece(const struct grammar_vocab *v, int32_t a, int32_t b) {
    uint32_t la = v->piece_off[a + 1] - v->piece_off[a];
    uint32_t lb = v->piece_off[b + 1] - v->piece_off[b];
    int c = memcmp(v->pieces + v->piece_off[a], v->pieces + v->piece_off[b], la < lb ? la : lb);
    if (c) return c;
    if (la != lb) return la < lb ? -1 : 1;
    return a < b ? -1 : a > b;
}

/* Sorts ids [n] by piece: a merge sort, since qsort has no context argument. */
static void sort_ids(const struct grammar_vocab *v, int32_t *ids, int32_t *tmp, int32_t n) {
    if (n < 2) return;
    int32_t h = n / 2;
    sort_ids(v, ids, tmp, h);
    sort_ids(v, ids + h, tmp, n - h);
    int32_t i = 0;
    int32_t j = h;
    int32_t k = 0;
    while (i < h && j < n) tmp[k++] = cmp_piece(v, ids[i], ids[j]) <= 0 ? ids[i++] : ids[j++];
    while (i < h) tmp[k++] = ids[i++];
    while (j < n) tmp[k++] = ids[j++];
    memcpy(ids, tmp, (size_t)n * sizeof(*ids));
}

struct grammar_vocab *grammar_vocab_create(const struct tokenizer *t) {
    int32_t n_vocab = tokenizer_n_vocab(t);
    struct grammar_vocab *v = calloc(1, sizeof(*v));
    if (!v) return NULL;
    v->n_vocab = n_vocab;
    struct buf all = {0};
    v->piece_off = malloc(((size_t)n_vocab + 1) * sizeof(*v->piece_off));
    v->ids = malloc(((size_t)n_vocab + 1) * sizeof(*v->ids));
    int32_t *tmp = malloc(((size_t)n_vocab + 1) * sizeof(*tmp));
    v->eog = malloc(((size_t)n_vocab + 1) * sizeof(*v->eog));
    if (!v->piece_off || !v->ids || !tmp || !v->eog) goto fail;
    for (int32_t i = 0; i < n_vocab; i++) {
        v->piece_off[i] = (uint32_t)all.len;
        tokenizer_token_to_piece(t, i, false, &all);
        if (all.len > v->piece_off[i]) v->ids[v->n_ids++] = i;
        if (tokenizer_is_eog(t, i)) v->eog[v->n_eog++] = i;
    }
    v->piece_off[n_vocab] = (uint32_t)all.len;
    v->pieces = buf_take(&all);
    sort_ids(v, v->ids, tmp, v->n_ids);
    // Build the preorder trie from the sorted pieces: keep the path of the
    // previous piece, pop to the common prefix, push the new bytes.
    size_t total = v->piece_off[n_vocab];
    v->nodes = malloc((total + 1) * sizeof(*v->nodes));
    int32_t *path = malloc((total + 2) * sizeof(*path));  // node index per depth
    if (!v->nodes || !path) {
        free(path);
        goto fail;
    }
    int32_t depth = 0;
    const char *prev = NULL;
    uint32_t prev_len = 0;
    for (int32_t k = 0; k < v->n_ids; k++) {
        int32_t id = v->ids[k];
        const char *p = v->pieces + v->piece_off[id];
        uint32_t len = v->piece_off[id + 1] - v->piece_off[id];
        uint32_t common = 0;
        while (common < len && common < prev_len && common < (uint32_t)depth &&
               p[common] == prev[common])
            common++;
        while (depth > (int32_t)common) v->nodes[path[--depth]].end = v->n_nodes;
        while ((uint32_t)depth < len) {
            int32_t i = v->n_nodes++;
            v->nodes[i] = (struct vocab_node){.depth = depth + 1, .end = -1, .tok0 = k,
                                              .tok1 = k, .byte = (uint8_t)p[depth]};
            path[depth++] = i;
        }
        struct vocab_node *leaf = &v->nodes[path[len - 1]];
        if (leaf->tok1 == leaf->tok0) leaf->tok0 = k;  // first token ending here
        leaf->tok1 = k + 1;
        if ((int32_t)len > v->max_depth) v->max_depth = (int32_t)len;
        prev = p;
        prev_len = len;
    }
    while (depth > 0) v->nodes[path[--depth]].end = v->n_nodes;
    free(path);
    free(tmp);
    return v;

fail:
    buf_free(&all);
    free(tmp);
    grammar_vocab_free(v);
    return NULL;
}

void grammar_vocab_free(struct grammar_vocab *v) {
    if (!v) return;
    free(v->nodes);
    free(v->ids);
    free(v->pieces);
    free(v->piece_off);
    free(v->eog);
    free(v);
}

int32_t grammar_vocab_n_vocab(const struct grammar_vocab *v) { return v->n_vocab; }
int32_t grammar_vocab_n_nodes(const struct grammar_vocab *v) { return v->n_nodes; }

/* ---- the matcher ---------------------------------------------------------------- */

struct gstate {
    int32_t off;       // stacks: st_nodes[off, off + n)
    int32_t n;
    int32_t table;     // transition table index, -1: none yet
    int32_t mask;      // mask slot, -1: none
    int32_t n_allowed; // with mask: its population
    bool is_mask_cut;  // with mask: it was cut short by the bound of work
    uint32_t hash;
    bool is_accepting; // holds the empty stack
};

struct grammar {
    struct gbnf *g;            // retained
    const int32_t *items;      // borrowed from g
    // nodes
    int32_t *node_pos;         // owned; [n_nodes]
    int32_t *node_parent;      // owned; [n_nodes]
    uint32_t *node_mark;       // owned; [n_nodes] closure epoch stamps
    int32_t n_nodes;
    int32_t cap_nodes;
    int32_t *node_index;       // owned; open addressing, -1 empty, [node_index_mask + 1]
    uint32_t node_index_mask;
    uint32_t epoch;
    int64_t n_masks_cut;       // masks whose walk used up its work (grammar_n_masks_cut)
    int64_t n_compactions;     // compact() calls (grammar_n_compactions)
    bool is_cut_dead;          // the last mask was cut short and allowed nothing
    bool is_mask_cut;          // the last mask was cut short (computed or cached)
    bool is_budgeted;          // inside grammar_mask(): its walk has a bound of work
    bool is_over_budget;       // ... and has used it up: what it has not seen is not allowed
    bool is_overgrown;         // the current stacks passed GRAMMAR_LIVE_NODES_MAX: follows nothing
    bool is_marked;            // a grammar_mark() is held: no compaction (state ids stay)
    int64_t work_left;         // stacks and configurations it may still visit
    // states
    struct gstate *states;     // owned; [n_states]
    int32_t n_states;
    int32_t cap_states;
    int32_t *st_nodes;         // owned; node ids of every state back to back
    int32_t n_st_nodes;
    int32_t cap_st_nodes;
    int32_t *state_index;      // owned; open addressing, -1 empty
    uint32_t state_index_mask;
    int32_t (*tables)[256];    // owned; [n_tables]
    int32_t n_tables;
    uint64_t *masks;           // owned; [GRAMMAR_MASKS_MAX][mask_words], on first use
    int32_t mask_owner[GRAMMAR_MASKS_MAX];  // state holding each slot, -1 free
    int32_t next_mask;         // round-robin eviction cursor
    size_t mask_words;
    int32_t cur;               // the current state
    // scratch of one closure
    int32_t *work;             // owned; pending (pos, parent) pairs
    int32_t n_work;
    int32_t cap_work;
    int32_t *out;              // owned; top nodes found
    int32_t n_out;
    int32_t cap_out;
    int32_t *walk;             // owned; [max_depth + 1] state per trie depth
    int32_t cap_walk;
};

static uint32_t hash2(int32_t a, int32_t b) {
    uint64_t x = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (uint32_t)x;
}

static void push2(int32_t **arr, int32_t *n, int32_t *cap, int32_t a) {
    if (*n == *cap) {
        *cap = *cap ? *cap * 2 : 64;
        *arr = xrealloc(*arr, (size_t)*cap * sizeof(**arr));
    }
    (*arr)[(*n)++] = a;
}

static void node_index_rebuild(struct grammar *gm, uint32_t size) {
    free(gm->node_index);
    gm->node_index = xmalloc((size_t)size * sizeof(*gm->node_index));
    memset(gm->node_index, 0xff, (size_t)size * sizeof(*gm->node_index));
    gm->node_index_mask = size - 1;
    for (int32_t i = 1; i < gm->n_nodes; i++) {
        uint32_t h = hash2(gm->node_pos[i], gm->node_parent[i]) & gm->node_index_mask;
        while (gm->node_index[h] >= 0) h = (h + 1) & gm->node_index_mask;
        gm->node_index[h] = i;
    }
}

/* The node (pos, parent), created if new. */
static int32_t node_intern(struct grammar *gm, int32_t pos, int32_t parent) {
    uint32_t h = hash2(pos, parent) & gm->node_index_mask;
    for (int32_t i; (i = gm->node_index[h]) >= 0; h = (h + 1) & gm->node_index_mask) {
        if (gm->node_pos[i] == pos && gm->node_parent[i] == parent) return i;
    }
    if (gm->n_nodes == gm->cap_nodes) {
        gm->cap_nodes *= 2;
        gm->node_pos = xrealloc(gm->node_pos, (size_t)gm->cap_nodes * sizeof(int32_t));
        gm->node_parent = xrealloc(gm->node_parent, (size_t)gm->cap_nodes * sizeof(int32_t));
        gm->node_mark = xrealloc(gm->node_mark, (size_t)gm->cap_nodes * sizeof(uint32_t));
    }
    int32_t id = gm->n_nodes++;
    gm->node_pos[id] = pos;
    gm->node_parent[id] = parent;
    gm->node_mark[id] = 0;
    gm->node_index[h] = id;
    if ((uint32_t)gm->n_nodes * 2 > gm->node_index_mask + 1)
        node_index_rebuild(gm, (gm->node_index_mask + 1) * 2);
    return id;
}

static uint32_t hash_nodes(const int32_t *ids, int32_t n) {
    uint32_t h = 0x811c9dc5u;
    for (int32_t i = 0; i < n; i++) h = (h ^ (uint32_t)ids[i]) * 0x01000193u;
    return h;
}

static void state_index_rebuild(struct grammar *gm, uint32_t size) {
    free(gm->state_index);
    gm->state_index = xmalloc((size_t)size * sizeof(*gm->state_index));
    memset(gm->state_index, 0xff, (size_t)size * sizeof(*gm->state_index));
    gm->state_index_mask = size - 1;
    for (int32_t i = 0; i < gm->n_states; i++) {
        uint32_t h = gm->states[i].hash & gm->state_index_mask;
        while (gm->state_index[h] >= 0) h = (h + 1) & gm->state_index_mask;
        gm->state_index[h] = i;
    }
}

static int cmp_i32(const void *pa, const void *pb) {
    int32_t a = *(const int32_t *)pa;
    int32_t b = *(const int32_t *)pb;
    return a < b ? -1 : a > b;
}

/* The state of the node set ids [n] (sorted here, duplicates dropped); -1
 * (dead) for an empty set. */
static int32_t state_intern(struct grammar *gm, int32_t *ids, int32_t n) {
    if (n == 0) return GRAMMAR_TRANS_DEAD;
    qsort(ids, (size_t)n, sizeof(*ids), cmp_i32);
    int32_t m = 1;
    for (int32_t i = 1; i < n; i++)
        if (ids[i] != ids[m - 1]) ids[m++] = ids[i];
    n = m;
    uint32_t hash = hash_nodes(ids, n);
    uint32_t h = hash & gm->state_index_mask;
    for (int32_t i; (i = gm->state_index[h]) >= 0; h = (h + 1) & gm->state_index_mask) {
        const struct gstate *s = &gm->states[i];
        if (s->hash == hash && s->n == n &&
            memcmp(&gm->st_nodes[s->off], ids, (size_t)n * sizeof(*ids)) == 0)
            return i;
    }
    if (gm->n_states == gm->cap_states) {
        gm->cap_states = gm->cap_states ? gm->cap_states * 2 : 64;
        gm->states = xrealloc(gm->states, (size_t)gm->cap_states * sizeof(*gm->states));
    }
    while (gm->n_st_nodes + n > gm->cap_st_nodes) {
        gm->cap_st_nodes = gm->cap_st_nodes ? gm->cap_st_nodes * 2 : 256;
        gm->st_nodes = xrealloc(gm->st_nodes, (size_t)gm->cap_st_nodes * sizeof(int32_t));
    }
    int32_t id = gm->n_states++;
    gm->states[id] = (struct gstate){.off = gm->n_st_nodes, .n = n, .table = -1, .mask = -1,
                                     .hash = hash, .is_accepting = ids[0] == 0};
    memcpy(&gm->st_nodes[gm->n_st_nodes], ids, (size_t)n * sizeof(*ids));
    gm->n_st_nodes += n;
    gm->state_index[h] = id;
    if ((uint32_t)gm->n_states * 2 > gm->state_index_mask + 1)
        state_index_rebuild(gm, (gm->state_index_mask + 1) * 2);
    return id;
}

/* Takes n units of the running mask's work (a stack or a configuration
 * visited); false once it has none left. Without a mask running, always true. */
static bool spend(struct grammar *gm, int64_t n) {
    if (!gm->is_budgeted) return true;
    if (gm->is_over_budget || gm->work_left < n) {
        gm->is_over_budget = true;
        return false;
    }
    gm->work_left -= n;
    return true;
}

/* Runs the closure of the pending (pos, parent) configurations in gm->work:
 * every stack top that is a BYTE item (or the empty stack) goes to gm->out.
 *   BYTE at pos: a stack top;
 *   END:        return: continue at the parent frame's position, or accept;
 *   RULE r:     push the return position (unless it is an END: tail call),
 *               then every alternative of r.
 * Each configuration is interned as a node and stamped, so it is expanded
 * once. Returns false when the closure passed GRAMMAR_CLOSURE_MAX. */
static bool closure(struct grammar *gm) {
    const struct gbnf *g = gm->g;
    gm->n_out = 0;
    if (++gm->epoch == 0) {
        memset(gm->node_mark, 0, (size_t)gm->n_nodes * sizeof(*gm->node_mark));
        gm->epoch = 1;
    }
    int32_t n_visited = 0;
    while (gm->n_work > 0) {
        if (!spend(gm, 1)) return false;  // the mask's budget
        int32_t parent = gm->work[--gm->n_work];
        int32_t pos = gm->work[--gm->n_work];
        int32_t node = node_intern(gm, pos, parent);
        if (gm->node_mark[node] == gm->epoch) continue;
        gm->node_mark[node] = gm->epoch;
        if (++n_visited > GRAMMAR_CLOSURE_MAX) return false;
        int32_t it = gm->items[pos];
        switch (gbnf_item_op(it)) {
        case GBNF_OP_BYTE:
            push2(&gm->out, &gm->n_out, &gm->cap_out, node);
            break;
        case GBNF_OP_END:
            if (parent == 0) {
                push2(&gm->out, &gm->n_out, &gm->cap_out, 0);
            } else {
                push2(&gm->work, &gm->n_work, &gm->cap_work, gm->node_pos[parent]);
                push2(&gm->work, &gm->n_work, &gm->cap_work, gm->node_parent[parent]);
            }
            break;
        case GBNF_OP_RULE: {
            int32_t r = gbnf_item_arg(it);
            int32_t ret = gbnf_item_op(gm->items[pos + 1]) == GBNF_OP_END
                              ? parent
                              : node_intern(gm, pos + 1, parent);
            for (int32_t a = g->rule_alt0[r]; a < g->rule_alt0[r + 1]; a++) {
                push2(&gm->work, &gm->n_work, &gm->cap_work, g->alts[a]);
                push2(&gm->work, &gm->n_work, &gm->cap_work, ret);
            }
            break;
        }
        }
    }
    return true;
}

/* The state after byte b from state st, or GRAMMAR_TRANS_DEAD. */
static int32_t advance(struct grammar *gm, int32_t st, uint8_t b) {
    const struct gbnf *g = gm->g;
    gm->n_work = 0;
    int32_t off = gm->states[st].off;
    int32_t n = gm->states[st].n;
    if (!spend(gm, n)) return GRAMMAR_TRANS_DEAD;  // the mask's budget
    for (int32_t i = 0; i < n; i++) {
        int32_t node = gm->st_nodes[off + i];
        if (node == 0) continue;  // the empty stack takes no byte
        int32_t pos = gm->node_pos[node];
        if (!gbnf_set_has(g, gbnf_item_arg(gm->items[pos]), b)) continue;
        push2(&gm->work, &gm->n_work, &gm->cap_work, pos + 1);
        push2(&gm->work, &gm->n_work, &gm->cap_work, gm->node_parent[node]);
    }
    if (gm->n_work == 0) return GRAMMAR_TRANS_DEAD;
    if (!closure(gm)) return GRAMMAR_TRANS_DEAD;  // too ambiguous to follow
    return state_intern(gm, gm->out, gm->n_out);
}

/* advance() through the state's transition table. */
static int32_t trans(struct grammar *gm, int32_t st, uint8_t b) {
    int32_t table = gm->states[st].table;
    if (table >= 0 && gm->tables[table][b] != GRAMMAR_TRANS_UNKNOWN) return gm->tables[table][b];
    int32_t t = advance(gm, st, b);
    if (gm->is_over_budget) return t;  // cut short by the mask's budget: not the answer
    if (table < 0 && gm->n_tables < GRAMMAR_TABLES_MAX) {
        if ((gm->n_tables & (gm->n_tables - 1)) == 0) {  // 0, 1, 2, 4, ...: grow
            size_t cap = gm->n_tables ? (size_t)gm->n_tables * 2 : 1;
            gm->tables = xrealloc(gm->tables, cap * sizeof(*gm->tables));
        }
        table = gm->n_tables++;
        for (int i = 0; i < 256; i++) gm->tables[table][i] = GRAMMAR_TRANS_UNKNOWN;
        gm->states[st].table = table;
    }
    if (table >= 0) gm->tables[table][b] = t;
    return t;
}

static bool state_is_done(const struct grammar *gm, int32_t st) {
    const struct gstate *s = &gm->states[st];
    return s->n == 1 && gm->st_nodes[s->off] == 0;
}

/* Empties every table and re-creates the current state's stacks alone. */
static void compact(struct grammar *gm) {
    const struct gstate *cur = &gm->states[gm->cur];
    // The current stacks share their tails (a node's parent is a node): copy that graph,
    // each reachable node once, in O(nodes) (walking every stack to its bottom would be
    // O(stacks x depth): seconds for 2^16 ambiguous stacks 100 frames deep).
    const int32_t n_old = gm->n_nodes;
    int32_t *old_pos = xmalloc((size_t)n_old * sizeof(int32_t));
    int32_t *old_parent = xmalloc((size_t)n_old * sizeof(int32_t));
    int32_t *remap = xmalloc((size_t)n_old * sizeof(int32_t));  // old node -> new, -1: not yet
    memcpy(old_pos, gm->node_pos, (size_t)n_old * sizeof(int32_t));
    memcpy(old_parent, gm->node_parent, (size_t)n_old * sizeof(int32_t));
    for (int32_t i = 0; i < n_old; i++) remap[i] = -1;
    remap[0] = 0;
    const int32_t n_tops = cur->n;
    int32_t *tops = xmalloc(((size_t)n_tops ? (size_t)n_tops : 1) * sizeof(int32_t));
    memcpy(tops, &gm->st_nodes[cur->off], (size_t)n_tops * sizeof(int32_t));
    gm->n_nodes = 1;
    node_index_rebuild(gm, 1024);
    gm->n_states = 0;
    gm->n_st_nodes = 0;
    state_index_rebuild(gm, 1024);
    gm->n_tables = 0;
    free(gm->tables);
    gm->tables = NULL;
    for (int32_t k = 0; k < GRAMMAR_MASKS_MAX; k++) gm->mask_owner[k] = -1;
    gm->n_out = 0;
    int32_t *path = NULL;  // old nodes from a top down to the first one already copied
    int32_t n_path = 0, cap_path = 0;
    for (int32_t i = 0; i < n_tops; i++) {
        n_path = 0;
        for (int32_t node = tops[i]; remap[node] < 0; node = old_parent[node]) {
            push2(&path, &n_path, &cap_path, node);
        }
        for (int32_t j = n_path - 1; j >= 0; j--) {  // bottom up: the parent is copied first
            const int32_t node = path[j];
            remap[node] = node_intern(gm, old_pos[node], remap[old_parent[node]]);
        }
        push2(&gm->out, &gm->n_out, &gm->cap_out, remap[tops[i]]);
    }
    free(path);
    free(tops);
    free(remap);
    free(old_parent);
    free(old_pos);
    gm->cur = state_intern(gm, gm->out, gm->n_out);
}

struct grammar *grammar_create(struct gbnf *g) {
    struct grammar *gm = xcalloc(1, sizeof(*gm));
    gm->g = gbnf_retain(g);
    gm->items = g->items;
    gm->cap_nodes = 1024;
    gm->node_pos = xmalloc((size_t)gm->cap_nodes * sizeof(int32_t));
    gm->node_parent = xmalloc((size_t)gm->cap_nodes * sizeof(int32_t));
    gm->node_mark = xmalloc((size_t)gm->cap_nodes * sizeof(uint32_t));
    gm->node_pos[0] = -1;  // the empty stack
    gm->node_parent[0] = 0;
    gm->node_mark[0] = 0;
    gm->n_nodes = 1;
    node_index_rebuild(gm, 1024);
    state_index_rebuild(gm, 1024);
    for (int32_t k = 0; k < GRAMMAR_MASKS_MAX; k++) gm->mask_owner[k] = -1;
    gm->n_work = 0;
    for (int32_t a = g->rule_alt0[g->root]; a < g->rule_alt0[g->root + 1]; a++) {
        push2(&gm->work, &gm->n_work, &gm->cap_work, g->alts[a]);
        push2(&gm->work, &gm->n_work, &gm->cap_work, 0);
    }
    gm->cur = closure(gm) ? state_intern(gm, gm->out, gm->n_out) : GRAMMAR_TRANS_DEAD;
    return gm;
}

void grammar_free(struct grammar *gm) {
    if (!gm) return;
    gbnf_release(gm->g);
    free(gm->node_pos);
    free(gm->node_parent);
    free(gm->node_mark);
    free(gm->node_index);
    free(gm->states);
    free(gm->st_nodes);
    free(gm->state_index);
    free(gm->tables);
    free(gm->masks);
    free(gm->work);
    free(gm->out);
    free(gm->walk);
    free(gm);
}

int32_t grammar_mask(struct grammar *gm, const struct grammar_vocab *v, uint64_t *allow) {
    size_t words = grammar_mask_words(v->n_vocab);
    memset(allow, 0, words * sizeof(*allow));
    gm->is_cut_dead = false;
    gm->is_mask_cut = false;
    int32_t st = gm->cur;
    if (st < 0) return 0;
    if (gm->is_overgrown) {  // not a dead end: too ambiguous to follow further
        gm->n_masks_cut++;
        gm->is_cut_dead = true;
        gm->is_mask_cut = true;
        return 0;
    }
    if (gm->mask_words == 0) gm->mask_words = words;
    ASSERT(gm->mask_words == words);  // one vocabulary per matcher
    int32_t slot = gm->states[st].mask;
    if (slot >= 0) {
        memcpy(allow, gm->masks + (size_t)slot * words, words * sizeof(*allow));
        gm->is_mask_cut = gm->states[st].is_mask_cut;
        return gm->states[st].n_allowed;
    }
    if (gm->cap_walk < v->max_depth + 1) {
        gm->cap_walk = v->max_depth + 1;
        gm->walk = xrealloc(gm->walk, (size_t)gm->cap_walk * sizeof(*gm->walk));
    }
    // One preorder walk of the trie; walk[d] is the state after the first d
    // bytes of the current path. Its work is bounded (GRAMMAR_MASK_WORK): a grammar
    // ambiguous enough to follow 2^16 stacks at once could otherwise hold the step
    // thread for a second per token (every other sequence with it). Past the bound
    // the tokens not yet reached are not allowed: the mask stays sound (only tokens
    // that continue the grammar), it is smaller.
    gm->is_budgeted = true;
    gm->is_over_budget = false;
    gm->work_left = GRAMMAR_MASK_WORK;
    int32_t n_allowed = 0;
    gm->walk[0] = st;
    const struct vocab_node *nodes = v->nodes;
    for (int32_t i = 0; i < v->n_nodes;) {
        const struct vocab_node *nd = &nodes[i];
        int32_t t = trans(gm, gm->walk[nd->depth - 1], nd->byte);
        if (t < 0) {
            i = nd->end;  // no token with this prefix continues the grammar
            continue;
        }
        gm->walk[nd->depth] = t;
        for (int32_t k = nd->tok0; k < nd->tok1; k++) {
            int32_t id = v->ids[k];
            allow[id >> 6] |= 1ull << (id & 63);
        }
        n_allowed += nd->tok1 - nd->tok0;
        i++;
    }
    gm->is_budgeted = false;
    if (gm->is_over_budget) gm->n_masks_cut++;
    if (gm->states[st].is_accepting) {
        for (int32_t k = 0; k < v->n_eog; k++) {
            int32_t id = v->eog[k];
            if (!((allow[id >> 6] >> (id & 63)) & 1)) n_allowed++;
            allow[id >> 6] |= 1ull << (id & 63);
        }
    }
    // A walk cut short with nothing allowed is no answer (grammar_is_cut_dead()): not
    // cached, so that asking again cuts it again.
    gm->is_mask_cut = gm->is_over_budget;
    gm->is_cut_dead = gm->is_over_budget && n_allowed == 0;
    if (gm->is_cut_dead) return 0;
    // Cache it, evicting round robin.
    if (!gm->masks) gm->masks = xmalloc((size_t)GRAMMAR_MASKS_MAX * words * sizeof(*gm->masks));
    slot = gm->next_mask;
    gm->next_mask = (gm->next_mask + 1) % GRAMMAR_MASKS_MAX;
    if (gm->mask_owner[slot] >= 0) gm->states[gm->mask_owner[slot]].mask = -1;
    gm->mask_owner[slot] = st;
    gm->states[st].mask = slot;
    gm->states[st].n_allowed = n_allowed;
    gm->states[st].is_mask_cut = gm->is_mask_cut;
    memcpy(gm->masks + (size_t)slot * words, allow, words * sizeof(*allow));
    return n_allowed;
}

enum grammar_step grammar_accept_bytes(struct grammar *gm, const void *bytes, size_t len) {
    int32_t st = gm->cur;
    if (st < 0 || gm->is_overgrown) return GRAMMAR_STEP_REJECT;
    const uint8_t *p = bytes;
    for (size_t i = 0; i < len && st >= 0; i++) st = trans(gm, st, p[i]);
    if (st < 0) return GRAMMAR_STEP_REJECT;
    gm->cur = st;
    if (!gm->is_marked && (gm->n_states > GRAMMAR_STATES_MAX || gm->n_nodes > GRAMMAR_NODES_MAX ||
                           gm->n_tables >= GRAMMAR_TABLES_MAX)) {
        compact(gm);
        gm->n_compactions++;
        gm->is_overgrown = gm->n_nodes > GRAMMAR_LIVE_NODES_MAX;
    }
    return state_is_done(gm, gm->cur) ? GRAMMAR_STEP_DONE : GRAMMAR_STEP_OK;
}

enum grammar_step grammar_accept_token(struct grammar *gm, const struct grammar_vocab *v,
                                       int32_t token) {
    if (gm->cur < 0 || gm->is_overgrown || token < 0 || token >= v->n_vocab)
        return GRAMMAR_STEP_REJECT;
    for (int32_t k = 0; k < v->n_eog; k++) {
        if (v->eog[k] == token)
            return gm->states[gm->cur].is_accepting ? GRAMMAR_STEP_DONE : GRAMMAR_STEP_REJECT;
    }
    uint32_t len = v->piece_off[token + 1] - v->piece_off[token];
    if (len == 0) return GRAMMAR_STEP_REJECT;
    return grammar_accept_bytes(gm, v->pieces + v->piece_off[token], len);
}

bool grammar_allows_byte(struct grammar *gm, uint8_t b) {
    return gm->cur >= 0 && !gm->is_overgrown && trans(gm, gm->cur, b) >= 0;
}

bool grammar_is_accepting(const struct grammar *gm) {
    return gm->cur >= 0 && gm->states[gm->cur].is_accepting;
}

int64_t grammar_n_masks_cut(const struct grammar *gm) { return gm->n_masks_cut; }

bool grammar_is_cut_dead(const struct grammar *gm) { return gm->is_cut_dead; }

bool grammar_is_mask_cut(const struct grammar *gm) { return gm->is_mask_cut; }

int32_t grammar_mark(struct grammar *gm) {
    ASSERT(!gm->is_marked);
    gm->is_marked = true;
    return gm->cur;
}

void grammar_rewind(struct grammar *gm, int32_t mark) {
    ASSERT(gm->is_marked);
    gm->is_marked = false;
    gm->cur = mark;
}

int32_t grammar_n_states(const struct grammar *gm) { return gm->n_states; }

int32_t grammar_n_nodes(const struct grammar *gm) { return gm->n_nodes; }

int64_t grammar_n_compactions(const struct grammar *gm) { return gm->n_compactions; }
