/* api.c: the public entry points that run work on a backend: contexts, plans, forward and the
 * cache operations. Each validates everything, then calls the backend's hook. */
#include "internal.h"
#include <stdatomic.h>

/* ---- contexts ------------------------------------------------------------------------------ */

/* A context is used by one thread at a time (the header). Two calls on it at once would share its
 * pool and scratch (wrong outputs, a freed workspace, a hang), so the calls that run work on it
 * take this flag and the second one fails, changing nothing. Not a lock: nothing waits. */
static pa_status ctx_enter(pa_context *ctx, const char *what)
{
    if (__atomic_exchange_n(&ctx->busy, 1, __ATOMIC_ACQUIRE))
        return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                        "%s: the context is in use by another call right now (a context is used by one "
                        "thread at a time; give each thread its own)", what);
    pa__fpenv_enter(&ctx->caller_fenv);
    return PA_STATUS_OK;
}

static void ctx_leave(pa_context *ctx)
{
    pa__fpenv_leave(&ctx->caller_fenv);
    __atomic_store_n(&ctx->busy, 0, __ATOMIC_RELEASE);
}

/* r = the backend call, made inside ctx_enter / ctx_leave */
#define PA__WITH_CTX(ctx, what, r, call)                                                     \
    do {                                                                                     \
        if (((r) = ctx_enter((ctx), (what))) == PA_STATUS_OK) {                              \
            (r) = (call);                                                                    \
            ctx_leave(ctx);                                                                  \
        }                                                                                    \
    } while (0)

static atomic_uint_least64_t pa__next_context_id = 1;

pa_status pa_context_create(const pa_backend *b, const pa_context_options *opt, pa_context **out)
{
    if (!b || !out)
        return pa__fail(PA_STATUS_NULL_POINTER, "pa_context_create: backend and out must not be NULL");
    *out = NULL;
    char why[256];
    if (!pa_backend_available(b, why, sizeof why))
        return pa__fail(PA_STATUS_UNAVAILABLE, "backend \"%s\" cannot run here: %s", b->name, why);
    pa_context_options defaults = {0, 0, NULL};
    if (!opt) opt = &defaults;
    if (opt->num_threads < 0 || opt->num_threads > PA_MAX_THREADS)
        return pa__fail(PA_STATUS_INVALID_ARGUMENT, "pa_context_create: num_threads %d not in [0, %d]",
                        opt->num_threads, PA_MAX_THREADS);
    struct pa_context *ctx = pa__calloc(1, sizeof *ctx);
    if (!ctx) return pa__fail(PA_STATUS_OUT_OF_MEMORY, "pa_context_create: out of memory");
    ctx->backend = b;
    ctx->id = atomic_fetch_add(&pa__next_context_id, 1);
    pa__fpenv fe; /* (a backend's threads start in their creator's environment) */
    pa__fpenv_enter(&fe);
    pa_status s = b->context_create ? b->context_create(opt, &ctx->impl) : PA_STATUS_OK;
    pa__fpenv_leave(&fe);
    if (s) {
        pa__free(ctx);
        return s;
    }
    *out = ctx;
    return PA_STATUS_OK;
}

void pa_context_destroy(pa_context *ctx)
{
    if (!ctx) return;
    if (ctx->backend->context_destroy) ctx->backend->context_destroy(ctx->impl);
    pa__free(ctx);
}

const pa_backend *pa_context_backend(const pa_context *ctx) { return ctx ? ctx->backend : NULL; }

pa_status pa_context_set_num_threads(pa_context *ctx, int32_t n)
{
    if (!ctx) return pa__fail(PA_STATUS_NULL_POINTER, "pa_context_set_num_threads: ctx is NULL");
    if (n < 0 || n > PA_MAX_THREADS)
        return pa__fail(PA_STATUS_INVALID_ARGUMENT, "pa_context_set_num_threads: %d not in [0, %d]", n,
                        PA_MAX_THREADS);
    pa_status s; /* (the in-use check also where the backend has nothing to do: the header's rule) */
    PA__WITH_CTX(ctx, "pa_context_set_num_threads", s,
                 ctx->backend->set_num_threads ? ctx->backend->set_num_threads(ctx->impl, n) : PA_STATUS_OK);
    return s;
}

int32_t pa_context_num_threads(const pa_context *ctx)
{
    if (!ctx) return 0;
    return ctx->backend->num_threads ? ctx->backend->num_threads(ctx->impl) : 1;
}

pa_status pa_context_synchronize(pa_context *ctx)
{
    if (!ctx) return pa__fail(PA_STATUS_NULL_POINTER, "pa_context_synchronize: ctx is NULL");
    pa_status s;
    PA__WITH_CTX(ctx, "pa_context_synchronize", s,
                 ctx->backend->synchronize ? ctx->backend->synchronize(ctx->impl) : PA_STATUS_OK);
    return s;
}

/* ---- plans --------------------------------------------------------------------------------- */

/* pa_plan_create with the context already entered */
static pa_status plan_create(pa_context *ctx, const pa_layer *layer, const pa_batch *batch, pa_plan **out)
{
    const struct pa_backend *b = ctx->backend;
    if (b->supports) {
        pa_status s = b->supports(layer);
        if (s) return s;
    }
    struct pa_plan *p = pa__calloc(1, sizeof *p);
    if (!p) return pa__fail(PA_STATUS_OUT_OF_MEMORY, "pa_plan_create: out of memory");
    p->backend = b;
    p->ctx_id = ctx->id;
    p->batch_id = batch->id;
    p->num_heads = layer->cfg.num_heads;
    p->num_kv_heads = layer->cfg.num_kv_heads;
    p->head_size = layer->cfg.head_size;
    p->attn_type = layer->cfg.attn_type;
    pa_status s = b->plan_create ? b->plan_create(ctx->impl, layer, batch, &p->impl) : PA_STATUS_OK;
    if (s) {
        pa__free(p);
        return s;
    }
    *out = p;
    return PA_STATUS_OK;
}

pa_status pa_plan_create(pa_context *ctx, const pa_layer *layer, const pa_batch *batch, pa_plan **out)
{
    if (!ctx || !layer || !batch || !out)
        return pa__fail(PA_STATUS_NULL_POINTER, "pa_plan_create: ctx, layer, batch and out must not be NULL");
    *out = NULL;
    pa_status s;
    PA__WITH_CTX(ctx, "pa_plan_create", s, plan_create(ctx, layer, batch, out));
    return s;
}

void pa_plan_destroy(pa_plan *p)
{
    if (!p) return;
    if (p->impl && p->backend->plan_destroy) p->backend->plan_destroy(p->impl);
    pa__free(p);
}

/* ---- forward validation ---------------------------------------------------------------------- */

/* Resolves a row stride (0 = contiguous) and checks it leaves rows disjoint, and that the last
 * of `rows` rows ends at a byte offset an int64 holds (elements of up to 4 bytes; a stride of
 * 2^62 + 1 wrapped to a small offset and wrote another row until an audit: bench/NOTES.md,
 * thirty-ninth pass). */
static pa_status row_stride(int64_t *stride, int64_t row, int64_t rows, const char *what)
{
    if (*stride == 0) *stride = row;
    if (*stride < row)
        return pa__fail(PA_STATUS_INVALID_ARGUMENT, "%s_row_stride %lld is less than a row (%lld elements)",
                        what, (long long)*stride, (long long)row);
    int64_t end;
    if (rows > 0 && (!pa__mul_i64(rows - 1, *stride, &end) || !pa__add_i64(end, row, &end) ||
                     !pa__mul_i64(end, 4, &end)))
        return pa__fail(PA_STATUS_OVERFLOW, "%s_row_stride %lld over %lld rows overflows a 64-bit offset", what,
                        (long long)*stride, (long long)rows);
    return PA_STATUS_OK;
}

/* A [rows, cols] array with strides (rs, cs) addresses distinct elements per (r, c); the offset of
 * its last element is known to fit an int64. */
static bool strides_2d_distinct(int64_t rows, int64_t cols, int64_t rs, int64_t cs)
{
    if (rows <= 1) return cols <= 1 || cs >= 1;
    if (cols <= 1) return rs >= 1;
    /* A product that overflows int64 exceeds any stride, so that ordering does not hold. */
    int64_t span;
    return (cs >= 1 && pa__mul_i64(cs, cols, &span) && rs >= span) ||
           (rs >= 1 && pa__mul_i64(rs, rows, &span) && cs >= span);
}

/* Resolves LSE strides ((0, 0) = [rows, cols] contiguous) and checks them: INVALID_ARGUMENT where
 * they are negative or two (row, col) share an element, OVERFLOW where the byte just past the last
 * LSE is beyond an int64 (forward reported that as an overlap until the fortieth pass). *bytes:
 * the span the LSEs cover, from the first to one past the last (0 when there are none). */
static pa_status lse_strides(const char *who, int64_t rows, int64_t cols, int64_t *rs, int64_t *cs,
                             int64_t *bytes)
{
    if (*rs == 0 && *cs == 0) {
        *rs = cols;
        *cs = 1;
    }
    *bytes = 0;
    if (*rs < 0 || *cs < 0)
        return pa__fail(PA_STATUS_INVALID_ARGUMENT, "%s: lse strides (token %lld, head %lld) are negative", who,
                        (long long)*rs, (long long)*cs);
    int64_t a, b;
    if (rows > 0 && cols > 0 &&
        (!pa__mul_i64(rows - 1, *rs, &a) || !pa__mul_i64(cols - 1, *cs, &b) || !pa__add_i64(a, b, &a) ||
         !pa__add_i64(a, 1, &a) || !pa__mul_i64(a, (int64_t)sizeof(float), bytes)))
        return pa__fail(PA_STATUS_OVERFLOW, "%s: lse strides (token %lld, head %lld) over [%lld, %lld] overflow a "
                        "64-bit offset", who, (long long)*rs, (long long)*cs, (long long)rows, (long long)cols);
    if (!strides_2d_distinct(rows, cols, *rs, *cs))
        return pa__fail(PA_STATUS_INVALID_ARGUMENT, "%s: lse strides (token %lld, head %lld) do not nest for [%lld, %lld] "
                        "(one must be at least the other times its extent)",
                        who, (long long)*rs, (long long)*cs, (long long)rows, (long long)cols);
    return PA_STATUS_OK;
}

/* The rows of new K/V a forward takes: cross-attention's are the encoder's tokens */
static int64_t nkt_of(const struct pa_batch *b, pa_attn_type t)
{
    return t == PA_ATTN_ENCODER_DECODER ? b->md.num_encoder_tokens : b->md.num_tokens;
}

static pa_status check_cache_for(const struct pa_context *ctx, const struct pa_layer *L,
                                 const struct pa_batch *b, const pa_cache *c, bool cross)
{
    const char *what = cross ? "forward (cross cache)" : "forward (cache)";
    pa_status s = pa__cache_validate(c, what);
    if (s) return s;
    if (c->dtype != L->cfg.cache_dtype || c->num_kv_heads != L->cfg.num_kv_heads ||
        c->head_size != L->cfg.head_size)
        return pa__fail(PA_STATUS_SHAPE_MISMATCH,
                        "%s: cache is %s x %d heads x %d; the layer expects %s x %d x %d", what,
                        pa_dtype_name(c->dtype), c->num_kv_heads, c->head_size,
                        pa_dtype_name(L->cfg.cache_dtype), L->cfg.num_kv_heads, L->cfg.head_size);
    if (c->block_size != b->md.block_size)
        return pa__fail(PA_STATUS_SHAPE_MISMATCH, "%s: cache block_size %d != batch block_size %d",
                        what, c->block_size, b->md.block_size);
    int64_t need = cross ? b->num_cross_blocks : b->num_blocks;
    if (need > c->num_blocks)
        return pa__fail(PA_STATUS_SHAPE_MISMATCH,
                        "%s: the batch was validated for %lld blocks; the cache has %lld", what,
                        (long long)need, (long long)c->num_blocks);
    if (c->memory != ctx->backend->memory)
        return pa__fail(PA_STATUS_INVALID_ARGUMENT, "%s: cache memory kind %d; backend %s needs %d",
                        what, (int)c->memory, ctx->backend->name, (int)ctx->backend->memory);
    return PA_STATUS_OK;
}

static pa_status check_type_rules(const struct pa_layer *L, const struct pa_batch *b,
                                  const pa_forward_args *a)
{
    const pa_batch_metadata *m = &b->md;
    pa_attn_type t = L->cfg.attn_type;
    if ((a->k == NULL) != (a->v == NULL))
        return pa__fail(PA_STATUS_NULL_POINTER, "forward: k and v must be both given or both NULL");
    if (t == PA_ATTN_DECODER && b->tableless_seq >= 0)
        return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                        "forward: decoder layer, but sequence %d has no block table", b->tableless_seq);
    if (t == PA_ATTN_ENCODER || t == PA_ATTN_ENCODER_ONLY) {
        if (!a->k)
            return pa__fail(PA_STATUS_NULL_POINTER, "forward: %s layers need k and v",
                            pa_attn_type_name(t));
        for (int32_t i = 0; i < m->num_seqs; i++)
            if (m->context_lens[i] != 0)
                return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                                "forward: %s layer, but seqs[%d] has context_len %d (must be 0)",
                                pa_attn_type_name(t), i, m->context_lens[i]);
    }
    if ((t == PA_ATTN_DECODER || t == PA_ATTN_ENCODER_DECODER) && !a->cache)
        return pa__fail(PA_STATUS_NULL_POINTER, "forward: %s layers need a cache",
                        pa_attn_type_name(t));
    return PA_STATUS_OK;
}

static pa_status check_plan(const struct pa_context *ctx, const struct pa_layer *L,
                            const struct pa_batch *b, const struct pa_plan *p)
{
    /* (ids, not addresses: a context made where a destroyed one was took its plans as its own,
     * and ran them on scratch sized for others, until an audit: bench/NOTES.md, thirty-ninth pass) */
    if (p->ctx_id != ctx->id || p->batch_id != b->id)
        return pa__fail(PA_STATUS_INVALID_ARGUMENT, "forward: the plan was made for another %s",
                        p->ctx_id != ctx->id ? "context" : "batch");
    if (p->num_heads != L->cfg.num_heads || p->num_kv_heads != L->cfg.num_kv_heads ||
        p->head_size != L->cfg.head_size || p->attn_type != L->cfg.attn_type)
        return pa__fail(PA_STATUS_SHAPE_MISMATCH,
                        "forward: the plan is for %d/%d heads x %d (%s); the layer is %d/%d x %d (%s)",
                        p->num_heads, p->num_kv_heads, p->head_size, pa_attn_type_name(p->attn_type),
                        L->cfg.num_heads, L->cfg.num_kv_heads, L->cfg.head_size,
                        pa_attn_type_name(L->cfg.attn_type));
    return PA_STATUS_OK;
}

/* Validates and resolves strides into *r. */
static pa_status check_forward(const struct pa_context *ctx, const struct pa_layer *L,
                               const struct pa_batch *b, const pa_forward_args *a, pa_forward_args *r)
{
    *r = *a;
    const pa_layer_config *c = &L->cfg;
    int64_t qrow = (int64_t)c->num_heads * c->head_size, kvrow = (int64_t)c->num_kv_heads * c->head_size;
    pa_status s;
    if (!a->q || !a->out)
        return pa__fail(PA_STATUS_NULL_POINTER, "forward: args->q and args->out must not be NULL");
    if ((s = check_type_rules(L, b, a))) return s;
    bool cached = c->attn_type == PA_ATTN_DECODER || c->attn_type == PA_ATTN_ENCODER_DECODER;
    if (cached && (s = check_cache_for(ctx, L, b, a->cache, c->attn_type == PA_ATTN_ENCODER_DECODER)))
        return s;
    if (!cached) r->cache = NULL;
    const int64_t nt = b->md.num_tokens;
    if ((s = row_stride(&r->q_row_stride, qrow, nt, "q")) || (s = row_stride(&r->out_row_stride, qrow, nt, "out")))
        return s;
    /* (cross-attention's new K/V rows are the encoder's tokens) */
    const int64_t nkt = nkt_of(b, c->attn_type);
    if (a->k &&
        ((s = row_stride(&r->k_row_stride, kvrow, nkt, "k")) || (s = row_stride(&r->v_row_stride, kvrow, nkt, "v"))))
        return s;
    /* new K/V go into the cache: its pools share no element, but for one pool as both where K and
     * V get the same values (V = K kept) */
    if (cached && a->k && nkt > 0 &&
        (s = pa__cache_validate_write(a->cache, c->attn_type == PA_ATTN_ENCODER_DECODER ? "forward (cross cache)"
                                                                                         : "forward (cache)",
                                      a->cache->key == a->cache->value && c->k_scale == c->v_scale &&
                                          pa__rows_equal(a->k, r->k_row_stride, a->v, r->v_row_stride, nkt, kvrow,
                                                         pa_dtype_size(c->kv_dtype),
                                                         ctx->backend->memory == PA_MEMORY_HOST))))
        return s;
    int64_t lse_bytes;
    if (a->lse &&
        (s = lse_strides("forward", nt, c->num_heads, &r->lse_token_stride, &r->lse_head_stride, &lse_bytes)))
        return s;
    return PA_STATUS_OK;
}

pa_status pa_attn_forward(pa_context *ctx, const pa_layer *layer, const pa_batch *batch,
                          const pa_plan *plan, const pa_forward_args *args)
{
    if (!ctx || !layer || !batch || !args)
        return pa__fail(PA_STATUS_NULL_POINTER, "pa_attn_forward: ctx, layer, batch and args must not be NULL");
    pa_forward_args r;
    pa_status s;
    if (ctx->backend->supports && (s = ctx->backend->supports(layer))) return s;
    if (plan && (s = check_plan(ctx, layer, batch, plan))) return s;
    if ((s = check_forward(ctx, layer, batch, args, &r))) return s;
    if ((s = ctx_enter(ctx, "pa_attn_forward"))) return s;
    pa_plan *tmp = NULL;
    if (!plan && (s = plan_create(ctx, layer, batch, &tmp)) == PA_STATUS_OK) plan = tmp;
    if (plan) {
        pa__fwd f = {layer, batch, &r, r.k != NULL};
        s = ctx->backend->forward(ctx->impl, &f, plan->impl);
    }
    pa_plan_destroy(tmp);
    ctx_leave(ctx);
    return s;
}

/* ---- cache operations -------------------------------------------------------------------------- */

static pa_memory ctx_memory(const pa_context *ctx) { return ctx ? ctx->backend->memory : PA_MEMORY_HOST; }

static pa_status check_memory(const pa_context *ctx, const pa_cache *c, const char *what)
{
    if (c->memory != ctx_memory(ctx))
        return pa__fail(PA_STATUS_INVALID_ARGUMENT, "%s: pool memory kind %d, but %s runs on %d", what,
                        (int)c->memory, ctx ? ctx->backend->name : "the host (ctx NULL)",
                        (int)ctx_memory(ctx));
    return PA_STATUS_OK;
}

pa_status pa_cache_write(pa_context *ctx, const pa_cache *c, pa_dtype src_dtype, const void *key,
                         int64_t k_row_stride, const void *value, int64_t v_row_stride,
                         const int64_t *slots, int64_t n, float k_scale, float v_scale)
{
    pa_status s = pa__cache_validate(c, "pa_cache_write");
    if (s || (s = check_memory(ctx, c, "pa_cache_write"))) return s;
    if (!pa__dtype_is_float(src_dtype))
        return pa__fail(PA_STATUS_INVALID_ARGUMENT, "pa_cache_write: src_dtype %d must be f32, f16 or bf16",
                        (int)src_dtype);
    if (n < 0) return pa__fail(PA_STATUS_INVALID_ARGUMENT, "pa_cache_write: num_tokens %lld < 0", (long long)n);
    if (n > 0 && (!key || !value || !slots))
        return pa__fail(PA_STATUS_NULL_POINTER, "pa_cache_write: key, value and slot_mapping must not be NULL");
    int64_t row = (int64_t)c->num_kv_heads * c->head_size;
    if ((s = row_stride(&k_row_stride, row, n, "k")) || (s = row_stride(&v_row_stride, row, n, "v"))) return s;
    if (!(isfinite(k_scale) && k_scale > 0 && isfinite(v_scale) && v_scale > 0) ||
        (!pa__dtype_is_fp8(c->dtype) && (k_scale != 1.0f || v_scale != 1.0f)))
        return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                        "pa_cache_write: k_scale %g, v_scale %g must be finite > 0, and 1 for a %s cache",
                        (double)k_scale, (double)v_scale, pa_dtype_name(c->dtype));
    int64_t pool = c->num_blocks * c->block_size;
    for (int64_t i = 0; i < n; i++)
        if (slots[i] >= pool)
            return pa__fail(PA_STATUS_OUT_OF_RANGE, "pa_cache_write: slot_mapping[%lld] = %lld is not < %lld",
                            (long long)i, (long long)slots[i], (long long)pool);
    /* one pool as key and value: only where K and V get the same values (V = K kept) */
    if (n > 0 && (s = pa__cache_validate_write(c, "pa_cache_write",
                                               c->key == c->value && k_scale == v_scale &&
                                                   pa__rows_equal(key, k_row_stride, value, v_row_stride, n, row,
                                                                  pa_dtype_size(src_dtype),
                                                                  c->memory == PA_MEMORY_HOST))))
        return s;
    bool dup;
    int64_t v;
    if ((s = pa__find_duplicate(slots, n, 1, true, &dup, &v))) return s;
    if (dup)
        return pa__fail(PA_STATUS_INVALID_ARGUMENT, "pa_cache_write: slot %lld appears twice in slot_mapping",
                        (long long)v);
    if (ctx && ctx->backend->cache_write) {
        PA__WITH_CTX(ctx, "pa_cache_write", s,
                     ctx->backend->cache_write(ctx->impl, c, src_dtype, key, k_row_stride, value, v_row_stride,
                                               slots, n, k_scale, v_scale));
        return s;
    }
    pa__fpenv fe;
    pa__fpenv_enter(&fe);
    pa__cache_write_host(c, src_dtype, key, k_row_stride, value, v_row_stride, slots, n, k_scale, v_scale);
    pa__fpenv_leave(&fe);
    return PA_STATUS_OK;
}

static pa_status check_block_ids(const int64_t *pairs, int64_t num_pairs, int side, int64_t limit,
                                 const char *what)
{
    for (int64_t p = 0; p < num_pairs; p++) {
        int64_t id = pairs[2 * p + side];
        if (id < 0 || id >= limit)
            return pa__fail(PA_STATUS_OUT_OF_RANGE, "%s: pairs[%lld][%d] = %lld is not a block id in [0, %lld)",
                            what, (long long)p, side, (long long)id, (long long)limit);
    }
    bool dup;
    int64_t v;
    pa_status s = side == 1 ? pa__find_duplicate(pairs + 1, num_pairs, 2, false, &dup, &v) : PA_STATUS_OK;
    if (!s && side == 1 && dup)
        s = pa__fail(PA_STATUS_INVALID_ARGUMENT, "%s: destination block %lld appears twice", what, (long long)v);
    return s;
}

pa_status pa_cache_copy_blocks(pa_context *ctx, const pa_cache *caches, int32_t num_layers,
                               const int64_t *pairs, int64_t num_pairs)
{
    const char *what = "pa_cache_copy_blocks";
    if (num_layers < 0 || num_pairs < 0)
        return pa__fail(PA_STATUS_INVALID_ARGUMENT, "%s: num_layers %d and num_pairs %lld must be >= 0", what,
                        num_layers, (long long)num_pairs);
    if ((num_layers > 0 && !caches) || (num_pairs > 0 && !pairs))
        return pa__fail(PA_STATUS_NULL_POINTER, "%s: caches and pairs must not be NULL", what);
    pa_status s;
    for (int32_t l = 0; l < num_layers; l++) {
        if ((s = num_pairs > 0 ? pa__cache_validate_write(&caches[l], what, true) : pa__cache_validate(&caches[l], what)) ||
            (s = check_memory(ctx, &caches[l], what)) ||
            (s = check_block_ids(pairs, num_pairs, 0, caches[l].num_blocks, what)) ||
            (s = check_block_ids(pairs, num_pairs, 1, caches[l].num_blocks, what)))
            return s;
    }
    bool chained;
    int64_t p, q; /* (by sorting: the pairwise loop took seconds over 40k pairs, an audit found) */
    if ((s = pa__find_chained_pair(pairs, num_pairs, &chained, &p, &q))) return s;
    if (chained)
        return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                        "%s: block %lld is the destination of pair %lld and the source of pair %lld", what,
                        (long long)pairs[2 * p + 1], (long long)p, (long long)q);
    if (ctx && ctx->backend->copy_blocks) {
        PA__WITH_CTX(ctx, what, s, ctx->backend->copy_blocks(ctx->impl, caches, num_layers, pairs, num_pairs));
        return s;
    }
    pa__cache_copy_blocks_host(caches, num_layers, pairs, num_pairs);
    return PA_STATUS_OK;
}

pa_status pa_cache_swap_blocks(pa_context *ctx, const pa_cache *src, const pa_cache *dst,
                               const int64_t *pairs, int64_t num_pairs)
{
    const char *what = "pa_cache_swap_blocks";
    pa_status s;
    if ((s = pa__cache_validate(src, "pa_cache_swap_blocks (src)")) ||
        (s = num_pairs > 0 ? pa__cache_validate_write(dst, "pa_cache_swap_blocks (dst)", src->key == src->value)
                           : pa__cache_validate(dst, "pa_cache_swap_blocks (dst)")))
        return s;
    if (src->dtype != dst->dtype || src->block_size != dst->block_size ||
        src->num_kv_heads != dst->num_kv_heads || src->head_size != dst->head_size)
        return pa__fail(PA_STATUS_SHAPE_MISMATCH, "%s: src and dst differ in dtype or block geometry", what);
    /* different pools: no byte of dst's two within src's (pointers alone let crossed pools, or
     * dst = src shifted by a block, through until an audit: bench/NOTES.md, thirty-ninth pass) */
    const size_t es = pa_dtype_size(src->dtype), sb = (size_t)pa_cache_pool_elems(src) * es,
                 db = (size_t)pa_cache_pool_elems(dst) * es;
    if (pa__ranges_overlap(dst->key, db, src->key, sb) || pa__ranges_overlap(dst->key, db, src->value, sb) ||
        pa__ranges_overlap(dst->value, db, src->key, sb) || pa__ranges_overlap(dst->value, db, src->value, sb))
        return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                        "%s: dst's pools overlap src's (swap needs different pools; within one, copy_blocks)", what);
    if (num_pairs < 0 || (num_pairs > 0 && !pairs))
        return pa__fail(num_pairs < 0 ? PA_STATUS_INVALID_ARGUMENT : PA_STATUS_NULL_POINTER,
                        num_pairs < 0 ? "%s: num_pairs %lld < 0" : "%s: num_pairs %lld with NULL pairs", what,
                        (long long)num_pairs);
    if ((s = check_block_ids(pairs, num_pairs, 0, src->num_blocks, what)) ||
        (s = check_block_ids(pairs, num_pairs, 1, dst->num_blocks, what)))
        return s;
    if (!ctx) {
        if ((s = check_memory(ctx, src, what)) || (s = check_memory(ctx, dst, what))) return s;
        pa__cache_swap_blocks_host(src, dst, pairs, num_pairs);
        return PA_STATUS_OK;
    }
    if (ctx->backend->swap_blocks) {
        PA__WITH_CTX(ctx, what, s, ctx->backend->swap_blocks(ctx->impl, src, dst, pairs, num_pairs));
        return s;
    }
    if ((s = check_memory(ctx, src, what)) || (s = check_memory(ctx, dst, what))) return s;
    pa__cache_swap_blocks_host(src, dst, pairs, num_pairs);
    return PA_STATUS_OK;
}

pa_status pa_merge_states(pa_context *ctx, const pa_merge_args *a)
{
    if (!a) return pa__fail(PA_STATUS_NULL_POINTER, "pa_merge_states: args is NULL");
    if (a->num_tokens < 0 || a->num_heads < 1 || a->head_size < 1 || !pa__dtype_is_float(a->dtype))
        return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                        "pa_merge_states: num_tokens %lld (>= 0), num_heads %d, head_size %d (>= 1), "
                        "dtype %d (f32/f16/bf16)",
                        (long long)a->num_tokens, a->num_heads, a->head_size, (int)a->dtype);
    if (a->num_tokens > 0 && (!a->out_a || !a->lse_a || !a->out_b || !a->lse_b || !a->out))
        return pa__fail(PA_STATUS_NULL_POINTER, "pa_merge_states: out_a, lse_a, out_b, lse_b and out are required");
    pa_merge_args r = *a;
    int64_t e, le;
    pa_status ls = lse_strides("pa_merge_states", r.num_tokens, r.num_heads, &r.lse_token_stride,
                               &r.lse_head_stride, &le);
    if (ls) return ls;
    if (!pa__mul_i64(r.num_tokens, (int64_t)r.num_heads * r.head_size, &e) ||
        !pa__mul_i64(e, (int64_t)pa_dtype_size(r.dtype), &e))
        return pa__fail(PA_STATUS_OVERFLOW, "pa_merge_states: size overflows");
    /* what the call writes shares no byte with what it reads, nor out with out_lse (pointer
     * equality alone let out = out_a + 1 through until an audit: bench/NOTES.md, thirty-ninth
     * pass; the cuda kernel reads a row's LSEs in every thread and writes out_lse from one) */
    const void *rd[4] = {r.out_a, r.lse_a, r.out_b, r.lse_b};
    const size_t rn[4] = {(size_t)e, (size_t)le, (size_t)e, (size_t)le};
    for (int i = 0; i < 4; i++)
        if (pa__ranges_overlap(r.out, (size_t)e, rd[i], rn[i]) ||
            (r.out_lse && pa__ranges_overlap(r.out_lse, (size_t)le, rd[i], rn[i])))
            return pa__fail(PA_STATUS_INVALID_ARGUMENT, "pa_merge_states: out or out_lse overlaps an input (%s)",
                            i == 0 ? "out_a" : i == 1 ? "lse_a" : i == 2 ? "out_b" : "lse_b");
    if (r.out_lse && pa__ranges_overlap(r.out, (size_t)e, r.out_lse, (size_t)le))
        return pa__fail(PA_STATUS_INVALID_ARGUMENT, "pa_merge_states: out and out_lse overlap");
    if (ctx && ctx->backend->merge_states) {
        pa_status s;
        PA__WITH_CTX(ctx, "pa_merge_states", s, ctx->backend->merge_states(ctx->impl, &r));
        return s;
    }
    if (ctx && ctx->backend->memory != PA_MEMORY_HOST)
        return pa__fail(PA_STATUS_UNSUPPORTED, "pa_merge_states: backend %s has no merge", ctx->backend->name);
    pa__fpenv fe;
    pa__fpenv_enter(&fe);
    pa__merge_states_host(&r);
    pa__fpenv_leave(&fe);
    return PA_STATUS_OK;
}
