/*
 * scheduler/stats.c - histogram buckets and the published snapshot.
 */
#include "scheduler/stats.h"


const double stats_bucket_ms[STATS_N_BUCKETS - 1] = {
    1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000,
};

void stats_observe(struct stats_histogram *h, double ms) {
    int i = 0;
    while (i < STATS_N_BUCKETS - 1 && ms > stats_bucket_ms[i]) i++;
    h->counts[i]++;
    h->n++;
    h->sum_ms += ms;
}
