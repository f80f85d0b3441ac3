/*
 * pretok.c - the split regexes of byte-level BPE pre-tokenizers, compiled
 * with PCRE2. The patterns are the ones the models' tokenizer.json files
 * declare (HF tokenizers' Split / ByteLevel pre-tokenizers); the mapping from
 * tokenizer.ggml.pre values to pattern sets follows what GGUF converters
 * write. PCRE2 understands \p{..}, (?i:..), lookaheads and possessive
 * quantifiers, so the original patterns are used unchanged.
 *
 * The only PCRE2 user (STYLE 2.10). Compiled code is shared read-only; match
 * data, match context and JIT stack are created per pretok_split() call.
 */
#include "engine/text/pretok.h"

#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "engine/base/alloc.h"
#include "engine/base/err.h"
#define LOG_TAG "pretok"
#include "engine/base/log.h"

/* GPT-2's ByteLevel regex, which many families reuse. */
#define PAT_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define PAT_LLAMA3                                                                          \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+" \
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define PAT_QWEN2                                                                       \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+" \
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define PAT_PORO " ?[^(\\s|.,!?…。，、।۔،)]+"

struct pretok_family_def {
    const char *name;
    const char *patterns[PRETOK_MAX_PATTERNS];  // NULL-terminated
};

/* One row per distinct pattern set. */
static const struct pretok_family_def pretok_families[] = {
    {"gpt2", {PAT_GPT2, NULL}},
    /* llama.cpp's "default" BPE set (files converted without a known pre). */
    {"default",
     {"[\\p{P}\\$\\+<=>\\^~\\|]+", PAT_GPT2, "\\p{N}+", "[0-9][0-9][0-9]", NULL}},
    {"llama3", {PAT_LLAMA3, NULL}},
    {"qwen2", {PAT_QWEN2, NULL}},
    {"deepseek-llm",
     {"[\r\n]",
      // The cased letters (Lu, Ll, Lt) as code points; escaped so that no editor
      // normalisation can change them (several are singleton-decomposable).
      "\\s?["
      "A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-"
      "\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}"
      "\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}"
      "\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-"
      "\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}"
      "\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-"
      "\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-"
      "\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-"
      "\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}"
      "\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}"
      "\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-"
      "\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-"
      "\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}"
      "\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-"
      "\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-"
      "\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-"
      "\\x{118DF}\\x{1E900}-\\x{1E943}"
      "]+",
      "\\s?[!-/:-~！-／：-～‘-‟　-。]+", "\\s+$", "[一-龥ࠀ-一가-퟿]+", "\\p{N}+", NULL}},
    {"deepseek-v3",
     {"\\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+",
      "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
      " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
      NULL}},
    {"deepseek-coder",
     {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[一-龥ࠀ-一가-퟿]+", "\\p{N}", NULL}},
    {"falcon", {"[\\p{P}\\$\\+<=>\\^~\\|`]+", PAT_GPT2, "[0-9][0-9][0-9]", NULL}},
    {"starcoder", {"\\p{N}", PAT_GPT2, NULL}},
    {"poro", {PAT_PORO, NULL}},
    {"viking", {PAT_PORO, "\\p{N}", NULL}},
    {"tekken",
     {"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"
      "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|"
      "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
      NULL}},
    {"gpt-4o",
     {"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
      "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
      "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
      NULL}},
    {"chameleon",
     {"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", "\\p{N}",
      "[\\p{P}!-/:-@\\[-`{-~]", PAT_GPT2, NULL}},
    {"seed-coder",
     {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|"
      "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
      NULL}},
    {"bailingmoe",
     {"'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*|"
      "\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
      NULL}},
};

/* tokenizer.ggml.pre values -> pattern set, with llama.cpp's per-value
 * ignore_merges and add_bos defaults. */
struct pretok_name {
    const char *pre;
    const char *family;
    bool ignore_merges;
    bool adds_bos;
};

static const struct pretok_name pretok_names[] = {
    {"default", "default", false, false},
    {"gpt-2", "gpt2", false, false},
    {"gpt2", "gpt2", false, false},
    {"phi-2", "gpt2", false, false},
    {"mpt", "gpt2", false, false},
    {"olmo", "gpt2", false, false},
    {"jais", "gpt2", false, false},
    {"trillion", "gpt2", false, false},
    {"granite-docling", "gpt2", false, false},
    {"jina-es", "gpt2", false, false},
    {"jina-de", "gpt2", false, false},
    {"jina-v1-en", "gpt2", false, false},
    {"jina-v2-es", "gpt2", false, false},
    {"jina-v2-de", "gpt2", false, false},
    {"jina-v2-code", "gpt2", false, false},
    {"gigachat", "gpt2", false, false},
    {"roberta-bpe", "gpt2", false, false},
    {"llama3", "llama3", true, true},
    {"llama-v3", "llama3", true, true},
    {"llama-bpe", "llama3", true, true},
    {"falcon3", "llama3", true, true},
    {"falcon-h1", "llama3", true, true},
    {"pixtral", "llama3", true, true},
    {"midm-2.0", "llama3", true, true},
    {"lfm2", "llama3", true, true},
    {"dbrx", "llama3", false, false},
    {"smaug-bpe", "llama3", false, false},
    {"chatglm-bpe", "llama3", false, false},
    {"qwen2", "qwen2", false, false},
    {"deepseek-r1-qwen", "qwen2", false, false},
    {"megrez", "qwen2", false, false},
    {"stablelm2", "qwen2", false, false},
    {"hunyuan", "qwen2", false, false},
    {"grok-2", "qwen2", false, false},
    {"deepseek-llm", "deepseek-llm", false, false},
    {"deepseek-v3", "deepseek-v3", false, false},
    {"hunyuan-dense", "deepseek-v3", false, false},
    {"deepseek-coder", "deepseek-coder", false, false},
    {"falcon", "falcon", false, false},
    {"starcoder", "starcoder", false, false},
    {"refact", "starcoder", false, false},
    {"command-r", "starcoder", false, false},
    {"smollm", "starcoder", false, false},
    {"codeshell", "starcoder", false, false},
    {"exaone", "starcoder", false, false},
    {"minerva-7b", "starcoder", false, false},
    {"poro-chat", "poro", false, false},
    {"bloom", "poro", false, false},
    {"gpt3-finnish", "poro", false, false},
    {"viking", "viking", false, false},
    {"tekken", "tekken", true, true},
    {"gpt-4o", "gpt-4o", false, false},
    {"minimax-m2", "gpt-4o", false, false},
    {"llama4", "gpt-4o", true, true},
    {"chameleon", "chameleon", false, true},
    {"seed-coder", "seed-coder", false, false},
    {"bailingmoe", "bailingmoe", false, false},
    {"llada-moe", "bailingmoe", false, false},
};

#define N_FAMILIES (sizeof(pretok_families) / sizeof(pretok_families[0]))
#define N_NAMES (sizeof(pretok_names) / sizeof(pretok_names[0]))

struct pretok {
    int n_patterns;
    pcre2_code *code[PRETOK_MAX_PATTERNS];  // owned
    bool has_jit;                           // every pattern JIT-compiled
    uint32_t n_ovector;                     // largest capture count + 1 over the patterns
};

static const struct pretok_name *find_name(const char *name, size_t len) {
    for (size_t i = 0; i < N_NAMES; i++) {
        if (strlen(pretok_names[i].pre) == len && memcmp(pretok_names[i].pre, name, len) == 0)
            return &pretok_names[i];
    }
    return NULL;
}

const char *pretok_family(const char *name, size_t name_len) {
    const struct pretok_name *n = find_name(name, name_len);
    return n ? n->family : NULL;
}

void pretok_free(struct pretok *p) {
    if (!p) return;
    for (int i = 0; i < p->n_patterns; i++) pcre2_code_free(p->code[i]);
    free(p);
}

int pretok_create(const char *name, size_t name_len, struct pretok **out,
                  struct pretok_info *info) {
    *out = NULL;
    if (!name) {
        name = "default";
        name_len = strlen(name);
    }
    const struct pretok_name *n = find_name(name, name_len);
    if (!n) {
        LOG_ERROR("unsupported tokenizer.ggml.pre '%.*s'", (int)(name_len > 64 ? 64 : name_len),
                  name);
        return ERR_UNSUPPORTED;
    }
    const struct pretok_family_def *fam = NULL;
    for (size_t i = 0; i < N_FAMILIES; i++) {
        if (strcmp(pretok_families[i].name, n->family) == 0) fam = &pretok_families[i];
    }
    ASSERT(fam);

    struct pretok *p = calloc(1, sizeof(*p));
    if (!p) return ERR_NOMEM;
    p->has_jit = true;
    p->n_ovector = 1;
    for (int i = 0; i < PRETOK_MAX_PATTERNS && fam->patterns[i]; i++) {
        int errcode = 0;
        PCRE2_SIZE erroff = 0;
        pcre2_code *code = pcre2_compile((PCRE2_SPTR)fam->patterns[i], PCRE2_ZERO_TERMINATED,
                                         PCRE2_UTF | PCRE2_UCP, &errcode, &erroff, NULL);
        if (!code) {
            // Our own static table: a pattern that does not compile is a bug.
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(errcode, msg, sizeof(msg));
            LOG_ERROR("pattern %d of '%s' does not compile at %zu: %s", i, fam->name,
                      (size_t)erroff, (const char *)msg);
            pretok_free(p);
            return errcode == PCRE2_ERROR_HEAP_FAILED ? ERR_NOMEM : ERR_UNSUPPORTED;
        }
        p->code[p->n_patterns++] = code;
        if (pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) != 0) p->has_jit = false;
        uint32_t n_cap = 0;
        pcre2_pattern_info(code, PCRE2_INFO_CAPTURECOUNT, &n_cap);
        if (n_cap + 1 > p->n_ovector) p->n_ovector = n_cap + 1;
    }
    if (info) {
        info->ignore_merges = n->ignore_merges;
        info->adds_bos = n->adds_bos;
    }
    *out = p;
    return 0;
}

/* Splits the piece subject[0, len) (at absolute offset base) with one regex:
 * every match and every gap between matches becomes a span. Empty matches
 * split nothing. */
static int split_one(const pcre2_code *code, pcre2_match_data *md, pcre2_match_context *mc,
                     const char *subject, uint32_t len, uint32_t base, struct pretok_span *out,
                     size_t cap, size_t *n_out) {
    size_t n = *n_out;
    PCRE2_SIZE pos = 0;     // next byte to search from
    PCRE2_SIZE emitted = 0; // bytes of the piece already covered by spans
    while (pos < len) {
        int rc = pcre2_match(code, (PCRE2_SPTR)subject, len, pos, PCRE2_NO_UTF_CHECK, md, mc);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof(msg));
            LOG_ERROR("split failed: %s", (const char *)msg);
            return rc == PCRE2_ERROR_NOMEMORY ? ERR_NOMEM : ERR_INVAL;
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        PCRE2_SIZE s = ov[0], e = ov[1];
        if (e == s) {
            // Empty match: step over one UTF-8 character and search again.
            pos = s + 1;
            while (pos < len && ((unsigned char)subject[pos] & 0xC0) == 0x80) pos++;
            continue;
        }
        if (s > emitted) {
            ASSERT(n < cap);
            out[n++] = (struct pretok_span){base + (uint32_t)emitted, (uint32_t)(s - emitted)};
        }
        ASSERT(n < cap);
        out[n++] = (struct pretok_span){base + (uint32_t)s, (uint32_t)(e - s)};
        emitted = pos = e;
    }
    if (emitted < len) {
        ASSERT(n < cap);
        out[n++] = (struct pretok_span){base + (uint32_t)emitted, (uint32_t)(len - emitted)};
    }
    *n_out = n;
    return 0;
}

int pretok_split(const struct pretok *p, const char *text, size_t len, struct pretok_span *spans,
                 struct pretok_span *scratch, size_t cap, size_t *n_spans) {
    *n_spans = 0;
    if (len == 0) return 0;
    ASSERT(cap >= len && len <= UINT32_MAX);

    int rc = 0;
    pcre2_match_data *md = pcre2_match_data_create(p->n_ovector, NULL);
    pcre2_match_context *mc = pcre2_match_context_create(NULL);
    pcre2_jit_stack *js = NULL;
    if (!md || !mc) {
        rc = ERR_NOMEM;
        goto done;
    }
    if (p->has_jit) {
        // The default 32 KiB JIT stack is too small for long runs of one class.
        js = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
        if (!js) {
            rc = ERR_NOMEM;
            goto done;
        }
        pcre2_jit_stack_assign(mc, NULL, js);
    }

    // Ping-pong between the two arrays so the result ends in `spans`.
    struct pretok_span *cur = (p->n_patterns % 2) ? scratch : spans;
    struct pretok_span *next = (p->n_patterns % 2) ? spans : scratch;
    size_t n_cur = 1;
    cur[0] = (struct pretok_span){0, (uint32_t)len};
    for (int ip = 0; ip < p->n_patterns; ip++) {
        size_t n_next = 0;
        for (size_t i = 0; i < n_cur; i++) {
            rc = split_one(p->code[ip], md, mc, text + cur[i].start, cur[i].len, cur[i].start, next,
                           cap, &n_next);
            if (rc) goto done;
        }
        struct pretok_span *tmp = cur;
        cur = next;
        next = tmp;
        n_cur = n_next;
    }
    ASSERT(cur == spans);
    *n_spans = n_cur;
done:
    pcre2_jit_stack_free(js);
    pcre2_match_context_free(mc);
    pcre2_match_data_free(md);
    return rc;
}
