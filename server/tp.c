/*
 * tp.c - the process side of tensor parallelism for the subcommands (tp.h):
 * opening the job, loading this rank's slice, the follower's whole life.
 */
#define LOG_TAG "tp"
#include "server/tp.h"

#include "engine/base/err.h"
#include "engine/base/log.h"

double tp_peak_rss_mib(void) { return (double)engine_peak_rss_bytes() / (1024.0 * 1024.0); }

int tp_open(int32_t n_ranks, struct comm **out) {
    *out = NULL;
    if (n_ranks == 1) return 0;
    return comm_open(n_ranks, out);
}

int tp_load_model(struct comm *c, const char *path, int32_t n_stages, int32_t n_sp,
                  struct engine_model **out) {
    struct engine_model_params mp = engine_model_default_params();
    mp.path = path;
    mp.show_progress = comm_rank(c) == 0;  // one bar for the job, not one per rank
    if (n_sp > 1) {
        mp.sp_size = n_sp;
        mp.sp_rank = comm_rank(c);
    } else {
        mp.pp_size = n_stages;
        mp.tp_size = comm_size(c) / n_stages;
        mp.pp_rank = comm_rank(c) / mp.tp_size;
        mp.tp_rank = comm_rank(c) % mp.tp_size;
    }
    int err = engine_model_load(&mp, out);
    const int all = comm_agree(c, err);
    if (all && !err) {
        LOG_ERROR("rank %d/%d: another rank could not load %s", comm_rank(c), comm_size(c), path);
        engine_model_free(*out);
        *out = NULL;
    }
    return all;
}

int tp_follow(struct comm *c, const struct engine_model *m, int32_t n_threads) {
    struct engine_ctx_params cp = engine_ctx_default_params();  // the limits come from rank 0
    cp.n_threads = n_threads;
    cp.comm = c;
    struct engine_ctx *ctx = NULL;
    if (engine_ctx_create(m, &cp, &ctx) != 0) return 1;
    LOG_INFO("rank %d/%d: following rank 0", comm_rank(c), comm_size(c));
    engine_follow(ctx);
    engine_ctx_free(ctx);
    LOG_INFO("rank %d/%d: rank 0 is done, comm_bytes=%llu peak_rss_mib=%.1f", comm_rank(c),
             comm_size(c), (unsigned long long)comm_bytes_sent(c), tp_peak_rss_mib());
    return 0;
}

void tp_fail(struct comm *c, int code, const char *why) {
    if (comm_size(c) > 1) comm_abort(c, code, why);
}
