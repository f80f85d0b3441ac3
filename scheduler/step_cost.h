/*
 * scheduler/step_cost.h - what a step costs as a function of its tokens, fitted
 * online: time = a + b * tokens, by least squares over the recent steps
 * (exponentially weighted moments). a is the cost every step pays whatever it
 * carries (reading the weights once, the threads' start, sampling), b what one
 * token adds. The planner needs their ratio a / b, the step's fixed cost in
 * tokens: beside d decodes it may add prompt tokens until the step costs
 * step_ratio times a step in which every sequence present decodes
 * (plan.c's NOTE). Pure: the caller gives the times.
 * Threads: the step thread.
 */
#ifndef SCHEDULER_STEP_COST_H
#define SCHEDULER_STEP_COST_H

#include <stdint.h>

/* The weight of the newest step in the moments: about the last 64 steps count. */
#define STEP_COST_WEIGHT (1.0 / 64.0)

/* The fixed cost is not believed beyond this many tokens (a fit on steps of
 * nearly equal sizes). */
enum { STEP_COST_MAX_FIXED = 512 };

struct step_cost {
    double n, t, nn, nt;  // weighted means of tokens, time, tokens^2, tokens * time
    int64_t n_steps;      // steps observed
    int32_t fixed;        // the last well-conditioned a / b in tokens, 0 before
};

void step_cost_init(struct step_cost *c);

/* One step of n_tokens >= 1 that took ns >= 0 nanoseconds. The fit is
 * refreshed when the recent steps' sizes vary enough to separate a from b
 * (a standard deviation of at least one token and a tenth of their mean) and b
 * comes out positive; otherwise the last fixed cost stays. */
void step_cost_observe(struct step_cost *c, int32_t n_tokens, int64_t ns);

#endif // SCHEDULER_STEP_COST_H
