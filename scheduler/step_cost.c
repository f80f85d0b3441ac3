/*
 * scheduler/step_cost.c - the step's fixed cost in tokens (step_cost.h).
 */
#include "scheduler/step_cost.h"

#include <math.h>

void step_cost_init(struct step_cost *c) {
    *c = (struct step_cost){0};
}

void step_cost_observe(struct step_cost *c, int32_t n_tokens, int64_t ns) {
    if (n_tokens < 1 || ns < 0) return;
    const double x = n_tokens, y = (double)ns;
    const double w = c->n_steps == 0 ? 1.0 : STEP_COST_WEIGHT;
    c->n += w * (x - c->n);
    c->t += w * (y - c->t);
    c->nn += w * (x * x - c->nn);
    c->nt += w * (x * y - c->nt);
    c->n_steps++;
    const double var = c->nn - c->n * c->n, cov = c->nt - c->n * c->t;
    const double sd = var > 0.0 ? sqrt(var) : 0.0;
    if (sd < 1.0 || sd < 0.1 * c->n) return;
    const double b = cov / var;
    if (!(b > 0.0)) return;
    double f = (c->t - b * c->n) / b;
    if (f < 0.0) f = 0.0;
    if (f > STEP_COST_MAX_FIXED) f = STEP_COST_MAX_FIXED;
    c->fixed = (int32_t)lround(f);
}
