/*
 * cmd_serve.c - `llmserve serve`: load the config and the model, start the
 * scheduler, the adapter loader and the HTTP server, wait for SIGINT/SIGTERM,
 * then shut down gracefully: stop accepting work (503), answer queued adapter
 * loads (503), let the load in progress and the running requests finish for
 * the grace period, cancel the rest, stop HTTP, exit 0.
 *
 * Like main.c, this is where config/ is translated into the modules' params
 * (STYLE 2.10; the include is listed in scripts/check-layering's exceptions).
 * Signals are blocked before any thread starts and taken with sigwait() on
 * the main thread, so no handler runs inside a library.
 *
 * Under tensor parallelism (--tp N, in mpirun -np N) rank 0 does all of the
 * above; the other ranks load their slice and follow rank 0's steps
 * (server/tp.h), never listen, and leave when rank 0's scheduler is freed.
 */
#define LOG_TAG "serve"
#include <arpa/inet.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config/config.h"
#include "engine/base/alloc.h"
#include "engine/base/clock.h"
#include "engine/base/err.h"
#include "engine/base/log.h"
#include "engine/text/chat.h"
#include "engine/engine.h"
#include "engine/kernels/kernels.h"
#include "scheduler/scheduler.h"
#include "server/auth.h"
#include "server/cmd.h"
#include "server/http.h"
#include "server/lora_loader.h"
#include "server/draft_model.h"
#include "server/lora_path.h"
#include "server/lora_registry.h"
#include "server/routes.h"
#include "server/tp.h"

static void log_model(const struct engine_model_info *info, const char *path) {
    LOG_INFO("model path=%s name=%s arch=%s type=%s params=%.1fM size_mib=%.1f n_ctx_train=%d "
             "n_vocab=%d n_layer=%d n_embd=%d n_head=%d n_head_kv=%d",
             path, info->name, info->arch, info->weight_type, (double)info->n_params / 1e6,
             (double)info->weight_bytes / (1024.0 * 1024.0), (int)info->n_ctx_train,
             (int)info->n_vocab, (int)info->n_layer, (int)info->n_embd, (int)info->n_head,
             (int)info->n_head_kv);
}

static void sleep_ms(int ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Creates and starts the scheduler from the config (with the job's ranks
 * under tensor parallelism, comm; else NULL); *n_blocks: the KV
 * blocks it got. Returns 0 or the error (logged). */
static int start_scheduler(const struct config *cfg, struct engine_model *model,
                           const struct engine_model *draft, struct comm *comm,
                           struct scheduler **out, int32_t *n_blocks) {
    struct scheduler_params sp = scheduler_default_params();
    sp.block_size = cfg->block_size;
    sp.kv_memory_mib = (int32_t)(cfg->kv_bytes >> 20);
    sp.max_seqs = cfg->max_seqs;
    sp.max_batch_tokens = cfg->max_batch_tokens;
    sp.prefill_chunk = cfg->prefill_chunk;
    sp.step_ratio = cfg->step_ratio;
    sp.draft_n = cfg->draft_n;
    sp.draft_always = cfg->draft_always;
    sp.draft_model = draft;
    sp.max_queue = cfg->max_queue;
    sp.n_threads = cfg->n_threads;
    sp.n_ctx = cfg->n_ctx;
    sp.max_loras = cfg->max_loras;
    sp.comm = comm;
    sp.kv_parts = cfg->sp_divide_kv ? cfg->sp : 1;
    int err = engine_kv_type_parse(cfg->kv_type, &sp.kv_type);
    ASSERT(err == 0);  // config/ accepted only the engine's names
    err = scheduler_create(model, &sp, out);
    if (err) {
        LOG_ERROR("cannot create the scheduler: %s", err_str(err));
        return err;
    }
    err = scheduler_start(*out);
    if (err) {
        LOG_ERROR("cannot start the scheduler: %s", err_str(err));
        return err;
    }
    struct scheduler_stats st;
    scheduler_get_stats(*out, &st);
    size_t block_bytes = engine_kv_block_bytes(model, cfg->block_size, sp.kv_type);
    *n_blocks = st.n_blocks_total > 0 ? st.n_blocks_total
                                      : (int32_t)(cfg->kv_bytes / (int64_t)block_bytes);
    LOG_INFO("kv blocks=%d block_size=%d kv_type=%s block_kib=%.1f kv_mib=%.1f max_seqs=%d "
             "max_batch_tokens=%d threads=%d blas=%s",
             (int)*n_blocks, (int)cfg->block_size, cfg->kv_type, (double)block_bytes / 1024.0,
             (double)block_bytes * *n_blocks / sp.kv_parts / (1024.0 * 1024.0), (int)cfg->max_seqs,
             (int)cfg->max_batch_tokens, (int)cfg->n_threads, kern_blas_init());
    return 0;
}

/* What the routes say of the model: its name (--model-name, else file_id,
 * the file's name, which must outlive om), the context a request gets (no
 * more than the KV pool holds) and the chat template family (--chat-template's
 * chat_override, else the model's). */
static void describe_model(const struct config *cfg, struct engine_model *model, int32_t n_blocks,
                           const char *file_id, enum chat_family chat_override,
                           struct openai_model *om) {
    const struct engine_model_info *info = engine_model_get_info(model);
    om->model = model;
    om->name = cfg->model_name ? cfg->model_name : file_id[0] ? file_id : info->name;
    int64_t kv_tokens = (int64_t)(n_blocks > 1 ? n_blocks - 1 : 0) * cfg->block_size;
    om->n_ctx = cfg->n_ctx > 0 ? cfg->n_ctx : info->n_ctx_train;
    if (kv_tokens > 0 && kv_tokens < om->n_ctx) om->n_ctx = (int32_t)kv_tokens;
    const char *tmpl = engine_model_chat_template(model);
    int err = chat_detect(tmpl, tmpl ? strlen(tmpl) : 0, &om->chat_family);
    if (cfg->chat_template) {
        om->chat_family = chat_override;  // --chat-template, checked before the model loaded
        om->has_chat = true;
    } else if (err == ERR_NOTFOUND) {
        om->chat_family = CHAT_FAMILY_FALLBACK;
        om->has_chat = true;
    } else {
        om->has_chat = err == 0;
    }
    LOG_INFO("chat template=%s", om->has_chat ? chat_family_name(om->chat_family)
                                              : "unsupported (chat requests get 400)");
}

/* Whether host (an IPv4 address, or "localhost") is a loopback address
 * (127.0.0.0/8): only this machine reaches the server. */
static bool is_loopback(const char *host) {
    if (strcmp(host, "localhost") == 0) return true;
    struct in_addr a;
    return inet_pton(AF_INET, host, &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

/* Adapters of --lora, loaded before the port opens, and the runtime loader:
 * into *loras and *loader (owned by the caller, also on failure), and app.
 * --lora-dir is opened into *lora_root (the caller's; closed by it, also on
 * failure), which app->lora_root and the loader then point to (so it must
 * outlive them).
 * Returns 0, or -1 when one fails to load (logged; the engine logged which
 * file and tensor) or --lora-dir is not a directory: that stops the server. */
static int start_loras(const struct config *cfg, struct engine_model *model,
                       struct routes_ctx *app, struct lora_registry **loras,
                       struct lora_loader **loader, struct lora_path_root *lora_root) {
    char msg[512];
    *loras = lora_registry_create(model, app->om.name);
    if (!*loras) return -1;
    for (int32_t i = 0; i < cfg->n_loras; i++) {
        int err = lora_registry_load(*loras, cfg->lora_names[i], cfg->lora_paths[i], msg,
                                     sizeof(msg));
        if (err) {
            LOG_ERROR("--lora %s=%s: %s", cfg->lora_names[i], cfg->lora_paths[i], msg);
            return -1;
        }
    }
    app->loras = *loras;
    app->allow_runtime_lora = cfg->allow_runtime_lora;
    if (cfg->lora_dir) {
        if (lora_path_root_open(cfg->lora_dir, lora_root, msg, sizeof(msg)) != 0) {
            LOG_ERROR("%s", msg);
            return -1;
        }
        app->lora_root = lora_root;
    }
    if (cfg->allow_runtime_lora) {
        *loader = lora_loader_create(*loras, app->lora_root);
        if (!*loader) return -1;
        app->lora_loader = *loader;
    }
    LOG_INFO("adapters n=%d max_loras=%d runtime_updates=%s", (int)cfg->n_loras,
             (int)cfg->max_loras, !cfg->allow_runtime_lora ? "off"
                                  : app->auth              ? "on (API key)"
                                                           : "on (no API key!)");
    return 0;
}

/* After the stop signal: new work gets 503; adapter loads first (queued ones
 * are answered 503 at once; the one in progress cannot be interrupted and
 * gets the grace period; one still running then, a hung file system, is
 * given up: its client is answered 503 and the process exits without
 * waiting for it); then the running requests get what is left of the grace.
 * Returns whether the loader is stuck. */
static bool drain(const struct config *cfg, struct http_server *http, struct scheduler *sched,
                  struct lora_loader *loader) {
    http_drain(http);
    bool is_loader_stuck = false;
    int64_t grace_ms = (int64_t)cfg->shutdown_grace_s * 1000;
    int64_t t_stop_ns = clock_mono_ns();
    if (loader) is_loader_stuck = lora_loader_stop(loader, grace_ms) == LORA_LOADER_STUCK;
    int64_t left_ms = grace_ms - (clock_mono_ns() - t_stop_ns) / 1000000;
    scheduler_stop(sched, left_ms > 0 ? left_ms : 0);
    // Every sequence has finished now; give the streams a moment to write
    // their last chunks and [DONE].
    for (int i = 0; i < 200 && http_n_active(http) > 0; i++) sleep_ms(10);
    return is_loader_stuck;
}

int cmd_serve(int argc, char **argv) {
    struct config cfg;
    char msg[512];
    int err = config_load(&cfg, argc, argv, msg, sizeof(msg));
    if (err) {
        fprintf(stderr, "llmserve serve: %s\n", msg);
        config_deinit(&cfg);
        return 2;
    }
    if (cfg.show_help) {
        config_print_help(stdout);
        config_deinit(&cfg);
        return 0;
    }
    log_set_level(cfg.log_level);
    config_log(&cfg);

    struct comm *comm = NULL;
    struct engine_model *model = NULL;
    struct engine_model *draft = NULL;  // --draft-model
    struct scheduler *sched = NULL;
    struct auth *auth = NULL;
    struct lora_registry *loras = NULL;
    struct lora_loader *loader = NULL;
    struct http_server *http = NULL;
    bool is_loader_stuck = false;
    int status = 1;
    struct lora_path_root lora_root = {.fd = -1};  // --lora-dir, open while the loader may run

    // Block the stop signals before any thread exists, so every thread
    // inherits the mask and only sigwait() below sees them.
    sigset_t stop_set;
    sigemptyset(&stop_set);
    sigaddset(&stop_set, SIGINT);
    sigaddset(&stop_set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_set, NULL);
    signal(SIGPIPE, SIG_IGN);

    enum chat_family chat_override = CHAT_FAMILY_FALLBACK;
    if (cfg.chat_template && chat_family_parse(cfg.chat_template, &chat_override) != 0) {
        LOG_ERROR("--chat-template: unknown family '%s' (see --help for the names)",
                  cfg.chat_template);
        goto done;
    }
    int64_t t0 = clock_mono_ns();
    // MPI starts threads of its own: after the mask, so they inherit it.
    err = tp_open(cfg.tp * cfg.pp * cfg.sp, &comm);
    if (err) goto done;
    err = tp_load_model(comm, cfg.model_path, cfg.pp, cfg.sp, &model);
    if (err) {
        LOG_ERROR("cannot load model %s: %s", cfg.model_path, err_str(err));
        goto done;
    }
    if (comm_rank(comm) > 0) {
        status = tp_follow(comm, model, cfg.n_threads);
        goto done;
    }
    const struct engine_model_info *info = engine_model_get_info(model);
    log_model(info, cfg.model_path);
    if (strstr(cfg.model_path, "synthetic") || strstr(info->name, "synthetic")) {
        LOG_WARN("this is a synthetic model: its weights are random, its output is gibberish");
    }
    if (cfg.draft_model_path) {
        char dmsg[512];
        err = draft_model_load(cfg.draft_model_path, model, true, &draft, dmsg, sizeof(dmsg));
        if (err) {
            LOG_ERROR("%s", dmsg);
            goto done;
        }
    }
    int32_t n_blocks = 0;
    if (start_scheduler(&cfg, model, draft, comm, &sched, &n_blocks) != 0) goto done;

    struct routes_ctx app = {
        .sched = sched,
        .model = model,
        .started_s = (int64_t)time(NULL),
    };
    char file_id[256];
    openai_model_id(cfg.model_path, file_id, sizeof(file_id));
    describe_model(&cfg, model, n_blocks, file_id, chat_override, &app.om);
    if (cfg.n_api_keys) {
        auth = auth_create((const char *const *)cfg.api_keys, cfg.n_api_keys);
        app.auth = auth;
    }
    if (cfg.max_loras > 0 &&
        start_loras(&cfg, model, &app, &loras, &loader, &lora_root) != 0) {
        goto done;
    }

    struct http_params hp = http_default_params();
    hp.host = cfg.host;
    hp.port = cfg.port;
    hp.max_body_bytes = cfg.max_body_bytes;
    hp.request_timeout_s = cfg.request_timeout_s;
    hp.idle_timeout_s = cfg.idle_timeout_s;
    hp.read_timeout_s = cfg.read_timeout_s;
    hp.max_connections = cfg.max_connections;
    err = http_start(&hp, &app, &http);
    if (err) goto done;
    if (!auth && !is_loopback(cfg.host)) {
        LOG_WARN("listening on %s without an API key: anyone who reaches port %d can use the "
                 "server; set --api-key or --api-key-file",
                 cfg.host, (int)cfg.port);
    }
    // The one line that says the server is ready, with the URL to open: the
    // playground (GET /) and the API beside it. 0.0.0.0 listens on every
    // address; a browser on this machine reaches it as 127.0.0.1.
    const char *url_host = strcmp(cfg.host, "0.0.0.0") == 0 ? "127.0.0.1" : cfg.host;
    LOG_INFO("ready: open http://%s:%d/ (playground; API at /v1) listen=%s:%d model=%s n_ctx=%d "
             "auth=%s ready_ms=%lld",
             url_host, (int)cfg.port, cfg.host, (int)cfg.port, app.om.name, (int)app.om.n_ctx,
             auth ? "on" : "off", (long long)((clock_mono_ns() - t0) / 1000000));

    int sig = 0;
    sigwait(&stop_set, &sig);
    if (comm) {
        // mpirun sends SIGTERM to every rank when one of them has died, and when it is
        // stopped itself; either way it kills what is left a moment later (Open MPI:
        // odls_base_sigkill_timeout, 1 s), so say so now: /health is 503 from here on.
        LOG_WARN(
            "%s under mpirun (rank 0 of %d): ending the job; a rank may have died "
            "(mpirun's own message names it)",
            sig == SIGINT ? "SIGINT" : "SIGTERM", (int)comm_size(comm));
        // No drain is possible: the step thread may be stuck in a collective with a rank
        // that is gone, and mpirun kills this process a moment from now. Tell the clients
        // instead (an error event ends each stream, a 503 each plain request) and give
        // the connections a moment to carry it.
        const int32_t n_open = http_n_active(http);
        http_abort_all(http);
        for (int i = 0; i < 50 && http_n_active(http) > 0; i++) sleep_ms(10);
        LOG_WARN("ended %d request(s) in progress with an error (job_failed); %d still open",
                 (int)n_open, (int)http_n_active(http));
    }
    LOG_INFO("%s: shutting down, grace=%ds, requests in progress=%d",
             sig == SIGINT ? "SIGINT" : "SIGTERM", (int)cfg.shutdown_grace_s,
             (int)http_n_active(http));
    is_loader_stuck = drain(&cfg, http, sched, loader);
    status = 0;

done:
    // Rank 0 failed with the other ranks still waiting for it (in the ctx's creation
    // or a step): end them with it.
    if (status != 0 && comm_rank(comm) == 0) tp_fail(comm, status, "serve failed");
    // The loader wakes HTTP slots, so it stops before they go (a stopped or
    // stuck loader wakes nobody); it is freed only after HTTP has stopped, as
    // a handler may still call it (and be refused) until then.
    if (loader && !is_loader_stuck) lora_loader_stop(loader, -1);
    http_stop(http);
    if (!is_loader_stuck) lora_loader_destroy(loader);
    scheduler_free(sched);
    if (is_loader_stuck) {
        // Its thread still uses the loader, the registry and the model: they
        // stay, and go with the process.
        LOG_WARN("exiting with an adapter load still running");
    } else {
        lora_registry_destroy(loras);
        engine_model_free(draft);
        engine_model_free(model);
        lora_path_root_close(&lora_root);
    }
    auth_destroy(auth);
    comm_close(comm);
    if (status == 0) LOG_INFO("stopped");
    config_deinit(&cfg);
    return status;
}
