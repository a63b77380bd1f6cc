/*
 * internal.h: what the parts of pagedattn share and users never see (prefix pa__).
 *
 * Layering: core (status, alloc, dtype, registry, layer, API entry points) <- cache, batch <-
 * backends. Backends include this header and never each other. Public entry points validate
 * everything; the backend hooks below receive validated arguments and do no checking.
 */
#ifndef PAGEDATTN_INTERNAL_H
#define PAGEDATTN_INTERNAL_H

#include "pagedattn.h"

#include <fenv.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#  define PA__PRINTF(a, b) __attribute__((format(printf, a, b)))
#  define PA__LIKELY(x) __builtin_expect(!!(x), 1)
#  define PA__UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#  define PA__PRINTF(a, b)
#  define PA__LIKELY(x) (x)
#  define PA__UNLIKELY(x) (x)
#endif

/* ---- errors ------------------------------------------------------------------------------- */

/* The size of the per-thread reason buffer (pa_last_error), its terminator included */
#define PA__REASON_MAX 512
/* Records the reason for the calling thread and returns status (so `return pa__fail(...)`). */
pa_status pa__fail(pa_status status, const char *fmt, ...) PA__PRINTF(2, 3);
void pa__clear_error(void);

/* ---- allocation (all library memory goes through these) --------------------------------- */

void *pa__alloc(size_t size);                     /* 64-byte aligned, uninitialized */
/* Zeroed memory for a large pool: 2 MiB aligned and advised for transparent huge pages when at
 * least 4 MiB (fewer TLB misses when a kernel walks paged blocks), else as pa__calloc. */
void *pa__alloc_pool(size_t size);
void *pa__calloc(size_t count, size_t size);      /* 64-byte aligned, zeroed, overflow-checked */
void pa__free(void *ptr);
/* a * b and a + b into *out, false on int64 overflow or negative operands. */
bool pa__mul_i64(int64_t a, int64_t b, int64_t *out);
bool pa__add_i64(int64_t a, int64_t b, int64_t *out);
/* Whether the byte ranges [a, a + an) and [b, b + bn) share a byte (empty ranges share none). */
bool pa__ranges_overlap(const void *a, size_t an, const void *b, size_t bn);
/* Whether `rows` rows of `row` elements of es bytes, as..bs elements apart (resolved strides),
 * hold the same bytes at a and at b: compared where host, else only whether they are the same rows */
bool pa__rows_equal(const void *a, int64_t as, const void *b, int64_t bs, int64_t rows, int64_t row, size_t es,
                    bool host);
/* For pairs (src, dst) at v[2i], v[2i + 1], i < n, with distinct destinations: whether some
 * destination is also a source; *dst_pair and *src_pair the first such source's pair index (in
 * order) and the index of the pair that has it as destination. OUT_OF_MEMORY only on allocation
 * failure. O(n log n). */
pa_status pa__find_chained_pair(const int64_t *v, int64_t n, bool *found, int64_t *dst_pair, int64_t *src_pair);
/* Looks for a value that occurs twice among v[0], v[stride], ... v[(n-1)*stride] (negative values
 * ignored when skip_negative). OUT_OF_MEMORY only on allocation failure. */
pa_status pa__find_duplicate(const int64_t *v, int64_t n, int64_t stride, bool skip_negative,
                             bool *found, int64_t *dup);

/* ---- dtypes ------------------------------------------------------------------------------- */

/* Element i of a buffer of `dtype` as f32 (fp8 not scaled). */
static inline float pa__load_f32(pa_dtype dtype, const void *base, int64_t i)
{
    switch (dtype) {
    case PA_DTYPE_F32: return ((const float *)base)[i];
    case PA_DTYPE_F16: return pa_f16_to_f32(((const uint16_t *)base)[i]);
    case PA_DTYPE_BF16: return pa_bf16_to_f32(((const uint16_t *)base)[i]);
    case PA_DTYPE_FP8_E4M3: return pa_fp8e4m3_to_f32(((const uint8_t *)base)[i]);
    case PA_DTYPE_FP8_E5M2: return pa_fp8e5m2_to_f32(((const uint8_t *)base)[i]);
    default: return NAN;
    }
}
/* Stores f (rounded once to `dtype`) as element i. */
static inline void pa__store_f32(pa_dtype dtype, void *base, int64_t i, float f)
{
    switch (dtype) {
    case PA_DTYPE_F32: ((float *)base)[i] = f; break;
    case PA_DTYPE_F16: ((uint16_t *)base)[i] = pa_f32_to_f16(f); break;
    case PA_DTYPE_BF16: ((uint16_t *)base)[i] = pa_f32_to_bf16(f); break;
    case PA_DTYPE_FP8_E4M3: ((uint8_t *)base)[i] = pa_f32_to_fp8e4m3(f); break;
    case PA_DTYPE_FP8_E5M2: ((uint8_t *)base)[i] = pa_f32_to_fp8e5m2(f); break;
    default: break;
    }
}
static inline bool pa__dtype_valid(pa_dtype d) { return (unsigned)d < (unsigned)PA_DTYPE_COUNT_; }
static inline bool pa__dtype_is_fp8(pa_dtype d)
{
    return d == PA_DTYPE_FP8_E4M3 || d == PA_DTYPE_FP8_E5M2;
}
/* f32, f16, bf16: the dtypes allowed for q, new k/v and the output. */
static inline bool pa__dtype_is_float(pa_dtype d)
{
    return d == PA_DTYPE_F32 || d == PA_DTYPE_F16 || d == PA_DTYPE_BF16;
}

/* ---- layers ------------------------------------------------------------------------------- */

struct pa_layer {
    pa_layer_config cfg; /* validated; sliding_window folded into window_left/right (and set
                            to 0); alibi_slopes / sinks point at the copies below */
    float *alibi;        /* [num_heads] or NULL */
    float *sinks;        /* [num_heads] or NULL */
    int32_t group;       /* num_heads / num_kv_heads */
    int32_t *bs_offset;  /* [num_heads] block-sparse o_h (see pagedattn.h), NULL if dense */
};

/* Block-sparse visibility of key j for query position p and head h (dense layers: true). */
static inline bool pa__blocksparse_visible(const struct pa_layer *L, int32_t h, int64_t p,
                                           int64_t j)
{
    const pa_blocksparse *bs = &L->cfg.blocksparse;
    if (bs->block_size <= 0) return true;
    int64_t qb = p / bs->block_size, kb = j / bs->block_size;
    if (kb > qb) return false;
    if (qb - kb < bs->local_blocks) return true;
    return (kb + L->bs_offset[h]) % bs->vert_stride == 0;
}

/* The contiguous key range [*lo, *hi) that causality and the window leave visible to the query
 * at position p of a sequence of `kv_len` keys (block sparsity comes on top, per key).
 * Decoder: j <= p; every type: the window. May be empty (*lo >= *hi). */
static inline void pa__key_range(const struct pa_layer *L, int64_t p, int64_t kv_len,
                                 int64_t *lo, int64_t *hi)
{
    int64_t a = 0, b = kv_len;
    if (L->cfg.attn_type == PA_ATTN_DECODER && p + 1 < b) b = p + 1;
    if (L->cfg.window_left >= 0 && p - L->cfg.window_left > a) a = p - L->cfg.window_left;
    if (L->cfg.window_right >= 0 && p + L->cfg.window_right + 1 < b)
        b = p + L->cfg.window_right + 1;
    *lo = a;
    *hi = b;
}

/* ALiBi bias added to s_j (already negated): -slope * |j - p| (causal rows have j <= p). */
static inline double pa__alibi_bias(double slope, int64_t p, int64_t j)
{
    int64_t d = j - p;
    return -slope * (double)(d < 0 ? -d : d);
}

/* ---- batches ------------------------------------------------------------------------------ */

struct pa_batch {
    pa_batch_metadata md; /* arrays below, exposed read-only */
    uint64_t id;          /* unique per batch, so a plan can prove which batch it was made for */
    int64_t num_blocks;   /* the pool size the batch was validated against */
    int64_t num_cross_blocks;
    int32_t tableless_seq; /* first sequence given without a block table, -1 if none */
    void *storage;        /* one allocation holding every array of md */
};

/* Sequence s's key length for a layer: decoder: seq_len; encoder types: query_len;
 * encoder_decoder: encoder_len. */
static inline int64_t pa__kv_len(const struct pa_batch *b, pa_attn_type type, int32_t s)
{
    switch (type) {
    case PA_ATTN_DECODER: return b->md.seq_lens[s];
    case PA_ATTN_ENCODER_DECODER: return b->md.encoder_seq_lens ? b->md.encoder_seq_lens[s] : 0;
    default: return b->md.query_lens[s];
    }
}

/* Sequence s's block table row for a layer of `type` (the cross table for encoder_decoder);
 * NULL when the batch has no such table (no encoder tokens, or a sequence without blocks). */
static inline const int32_t *pa__seq_table(const struct pa_batch *b, pa_attn_type type, int32_t s)
{
    if (type == PA_ATTN_ENCODER_DECODER)
        return b->md.cross_block_tables ? b->md.cross_block_tables + (int64_t)s * b->md.max_cross_blocks_per_seq
                                        : NULL;
    return b->md.block_tables + (int64_t)s * b->md.max_blocks_per_seq;
}

/* ---- caches ------------------------------------------------------------------------------- */

/* Element offset of (block, token-in-block, kv head) in either pool. */
static inline int64_t pa__cache_offset(const pa_cache *c, int64_t block, int64_t t, int64_t h)
{
    return block * c->block_stride + t * c->token_stride + h * c->head_stride;
}
/* Offset of logical key j of a sequence whose block table row is `table`. */
static inline int64_t pa__cache_key_offset(const pa_cache *c, const int32_t *table, int64_t j)
{
    return pa__cache_offset(c, table[j / c->block_size], j % c->block_size, 0);
}
/* Checks a cache view (geometry, strides, no self-overlap, non-NULL pools); `what` names the
 * argument in the reason text. */
pa_status pa__cache_validate(const pa_cache *c, const char *what);
/* pa__cache_validate, and the key and value pools share no element (caches about to be written),
 * but for one pool as both where same_data (the write puts the same values in K and V) */
pa_status pa__cache_validate_write(const pa_cache *c, const char *what, bool same_data);
/* Host implementations of the cache ops on validated arguments (used by the reference and cpu
 * backends and by ctx == NULL). */
void pa__cache_write_host(const pa_cache *c, pa_dtype src_dtype, const void *key,
                          int64_t k_row_stride, const void *value, int64_t v_row_stride,
                          const int64_t *slots, int64_t n, float k_scale, float v_scale);
void pa__cache_copy_blocks_host(const pa_cache *caches, int32_t num_layers, const int64_t *pairs,
                                int64_t num_pairs);
void pa__cache_swap_blocks_host(const pa_cache *src, const pa_cache *dst, const int64_t *pairs,
                                int64_t num_pairs);
void pa__merge_states_host(const pa_merge_args *a);

/* ---- backends ----------------------------------------------------------------------------- */

/* Validated forward arguments with defaults resolved (row strides filled in, LSE strides set
 * when lse != NULL). */
typedef struct pa__fwd {
    const struct pa_layer *layer;
    const struct pa_batch *batch;
    const pa_forward_args *args; /* strides in here are resolved (never 0) */
    bool write_kv;               /* k/v given and must be written to args->cache first */
} pa__fwd;

/* A backend: a registry entry of function pointers. Optional hooks say what NULL means. */
struct pa_backend {
    const char *name;
    const char *description;
    pa_cache_layout preferred_layout;
    pa_memory memory;
    /* Whether it can run here; writes why not. NULL: always. */
    bool (*available)(char *reason, size_t reason_size);
    /* Lines for `pagedattn info`. NULL: none. */
    const char *(*info)(void);
    /* OK, or UNSUPPORTED via pa__fail with the reason. NULL: supports everything. */
    pa_status (*supports)(const struct pa_layer *layer);
    /* Context: *impl receives the backend's state (may stay NULL). */
    pa_status (*context_create)(const pa_context_options *opt, void **impl);
    void (*context_destroy)(void *impl);
    /* Optional (NULL: fixed at 1 thread, resizing is accepted and ignored). */
    pa_status (*set_num_threads)(void *impl, int32_t n);
    int32_t (*num_threads)(const void *impl);
    pa_status (*synchronize)(void *impl); /* NULL: nothing to wait for */
    /* Plans. NULL plan_create: the backend needs no schedule. */
    pa_status (*plan_create)(void *impl, const struct pa_layer *layer,
                             const struct pa_batch *batch, void **plan);
    void (*plan_destroy)(void *plan);
    /* Forward on validated arguments: writes K/V when f->write_kv, then attends. */
    pa_status (*forward)(void *impl, const pa__fwd *f, void *plan);
    /* Cache ops on validated arguments. NULL: the host implementations above. */
    pa_status (*cache_write)(void *impl, const pa_cache *c, pa_dtype src_dtype, const void *key,
                             int64_t k_row_stride, const void *value, int64_t v_row_stride,
                             const int64_t *slots, int64_t n, float k_scale, float v_scale);
    pa_status (*copy_blocks)(void *impl, const pa_cache *caches, int32_t num_layers,
                             const int64_t *pairs, int64_t num_pairs);
    pa_status (*swap_blocks)(void *impl, const pa_cache *src, const pa_cache *dst,
                             const int64_t *pairs, int64_t num_pairs);
    pa_status (*merge_states)(void *impl, const pa_merge_args *a);
};

/* a caller's floating-point environment, saved by pa__fpenv_enter */
typedef struct pa__fpenv {
#if defined(__x86_64__)
    unsigned int mxcsr;
#else
    fenv_t env;
#endif
} pa__fpenv;

struct pa_context {
    const struct pa_backend *backend;
    void *impl;
    uint64_t id; /* unique in the process: plans name their context by it */
    int busy; /* a call is running on it (the one-thread-at-a-time rule, checked; __atomic builtins:
               * this header is also read by the cuda backend's C++) */
    pa__fpenv caller_fenv; /* the caller's floating-point environment while a call runs */
};

/* The floating-point environment the library computes in: the C default (IEEE round to nearest
 * even, exceptions masked, subnormals kept: no flush-to-zero, no denormals-are-zero). A caller's
 * own mode would otherwise reach the kernels: a program built with -ffast-math sets FTZ and DAZ
 * at start-up, torch.set_flush_denormal(True) sets them too, and under DAZ an fp8 kernel that
 * carries E4M3 codes as scaled f32 subnormals would read them as zeros. Every entry point that
 * computes saves the caller's environment, sets the default and restores the caller's (its
 * exception flags included, so the library raises none; with exceptions masked, a caller that
 * enabled FP traps gets no SIGFPE from NaN or inf inputs) before it returns; the cpu pool's
 * workers set the default when they start.
 * On x86-64 all of the library's floating-point arithmetic is SSE/AVX (no long double, no x87),
 * so the MXCSR is the whole environment: saving and loading it costs a few ns, where
 * fegetenv/fesetenv (which also store and reload the x87 state) took ~250 ns a call. */
static inline void pa__fpenv_enter(pa__fpenv *saved)
{
#if defined(__x86_64__)
    unsigned int dfl = 0x1f80u; /* every exception masked, round to nearest, FTZ and DAZ off */
    __asm__ __volatile__("stmxcsr %0" : "=m"(saved->mxcsr));
    __asm__ __volatile__("ldmxcsr %0" : : "m"(dfl));
#else
    fegetenv(&saved->env);
    fesetenv(FE_DFL_ENV);
#endif
}
static inline void pa__fpenv_leave(const pa__fpenv *saved)
{
#if defined(__x86_64__)
    __asm__ __volatile__("ldmxcsr %0" : : "m"(saved->mxcsr));
#else
    fesetenv(&saved->env);
#endif
}

struct pa_plan {
    const struct pa_backend *backend;
    uint64_t ctx_id; /* the context's id (addresses are reused) */
    uint64_t batch_id;
    int32_t num_heads, num_kv_heads, head_size;
    pa_attn_type attn_type;
    void *impl;
};

/* Registered backends (each defined in its own directory). */
extern const struct pa_backend pa__backend_reference;
extern const struct pa_backend pa__backend_cpu;
#ifdef PAGEDATTN_HAVE_CUDA
extern const struct pa_backend pa__backend_cuda;
#endif

/* The reference attention of one (token, head): double precision, the contract read literally.
 * Used by the reference backend and available to others for cross-checks. */
void pa__reference_forward(const pa__fwd *f);

#ifdef __cplusplus
}
#endif

#endif /* PAGEDATTN_INTERNAL_H */
