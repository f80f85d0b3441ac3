/*
 * fault.h - allocation failures injected on purpose, for the fault tests
 * (issue 16): which requests an out-of-memory hits, and that it hits only
 * them.
 *
 * The environment variable LLMSERVE_FAULT="SITE:N[,SITE:N]..." makes the
 * Nth allocation (counting from 1) at each named site fail, once:
 *   kv       a sequence's block table (scheduler/block_table.c), made once
 *            per sequence when it is submitted
 *   adapter  an adapter's A matrices (engine/model/lora.c), one per
 *            adapted projection of a load
 *   parse    the arrays a request's JSON is parsed into (server/openai.c:
 *            prompts, messages, token ids, stop ids, logit bias)
 *   tools    the arrays of tool calling (server/openai.c, server/routes.c):
 *            a request's tools, each tool's members, the templates' view
 *            of them, a message's tool_calls, the list the call grammar is
 *            built from, and a reply's parsed calls and their ids
 * Without the variable nothing fails and the cost is one relaxed atomic
 * increment per allocation at those sites. A bad value is ignored with a
 * warning, so a typo cannot take a server down.
 *
 * LLMSERVE_FAULT_GATE=NAME is the other hook, for holding an adapter load
 * "in progress" in tests (tests/integration/test_lora_load.c): a load of an
 * adapter directory that holds a FIFO named NAME first waits until a writer
 * opens that FIFO and closes it (fault_gate), then goes on as usual. Without
 * the variable, nothing waits: a FIFO in an adapter directory is otherwise
 * refused at once (lora.c opens every file O_NONBLOCK).
 *
 * The call counters are mutable globals, a test hook beside the log level
 * (STYLE 2.2): read once from the environment on first use, atomic after.
 * Threads: [any thread].
 */
#ifndef LLMSERVE_FAULT_H
#define LLMSERVE_FAULT_H

#include <stdbool.h>
#include <stddef.h>

enum fault_site {
    FAULT_SITE_KV,
    FAULT_SITE_ADAPTER,
    FAULT_SITE_PARSE,
    FAULT_SITE_TOOLS,
    FAULT_SITE_COUNT,
};

/* Counts one allocation at site; true when it is the one LLMSERVE_FAULT
 * names, so the caller must behave as if the allocation had failed. */
bool fault_hit(enum fault_site site);

/* malloc(n) / calloc(count, size), or NULL when fault_hit(site). Owned by
 * the caller (free()). */
void *fault_malloc(enum fault_site site, size_t n);
void *fault_calloc(enum fault_site site, size_t count, size_t size);

/* LLMSERVE_FAULT_GATE: when the variable is set and the directory dir_fd
 * holds a FIFO of that name (not followed through a symlink), blocks until a
 * writer has opened and closed it. Else returns at once. */
void fault_gate(int dir_fd);

#endif // LLMSERVE_FAULT_H
