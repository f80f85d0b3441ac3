/*
 * server/draft_model.c - loading and checking the draft model (draft_model.h).
 */
#define LOG_TAG "draft"
#include "server/draft_model.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "engine/base/err.h"
#include "engine/base/log.h"
#include "engine/text/tokenizer.h"

int32_t draft_model_vocab_mismatch(const struct tokenizer *target, const struct tokenizer *draft) {
    int32_t nt = tokenizer_n_vocab(target), nd = tokenizer_n_vocab(draft);
    int32_t n = nt < nd ? nt : nd;
    for (int32_t id = 0; id < n; id++) {
        const char *a = tokenizer_token_text(target, id), *b = tokenizer_token_text(draft, id);
        if (!a || !b || strcmp(a, b) != 0) return id;
    }
    int32_t diff = nt > nd ? nt - nd : nd - nt;
    return diff > DRAFT_MODEL_MAX_VOCAB_DIFF ? n : -1;
}

int draft_model_load(const char *path, const struct engine_model *target, bool show_progress,
                     struct engine_model **out, char *msg, size_t msg_size) {
    *out = NULL;
    msg[0] = 0;
    struct engine_model_params mp = engine_model_default_params();
    mp.path = path;
    mp.show_progress = show_progress;
    struct engine_model *m = NULL;
    int err = engine_model_load(&mp, &m);
    if (err) {
        snprintf(msg, msg_size, "--draft-model: cannot load %s: %s", path, err_str(err));
        return err;
    }
    const struct tokenizer *tt = engine_model_tokenizer(target);
    const struct tokenizer *td = engine_model_tokenizer(m);
    int32_t id = draft_model_vocab_mismatch(tt, td);
    if (id >= 0) {
        const char *a = tokenizer_token_text(tt, id), *b = tokenizer_token_text(td, id);
        snprintf(msg, msg_size,
                 "--draft-model: %s has another vocabulary than the model (%d and %d tokens; "
                 "id %d is '%.40s' in the model and '%.40s' in the draft)",
                 path, (int)tokenizer_n_vocab(tt), (int)tokenizer_n_vocab(td), (int)id,
                 a ? a : "(none)", b ? b : "(none)");
        engine_model_free(m);
        return ERR_INVAL;
    }
    const struct engine_model_info *info = engine_model_get_info(m);
    LOG_INFO("draft model path=%s arch=%s type=%s params=%.1fM size_mib=%.1f n_layer=%d n_embd=%d",
             path, info->arch, info->weight_type, (double)info->n_params / 1e6,
             (double)info->weight_bytes / 1048576.0, (int)info->n_layer, (int)info->n_embd);
    *out = m;
    return 0;
}
