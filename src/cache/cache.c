/* cache.c: KV cache views: geometry, validation, and the host implementations of the cache
 * operations (write by slot mapping, copy_blocks, swap_blocks) and of merge_states. */
#include "internal.h"

pa_status pa_cache_init(pa_cache *c, pa_cache_layout layout, pa_dtype dtype, int64_t num_blocks,
                        int32_t block_size, int32_t num_kv_heads, int32_t head_size)
{
    if (!c) return pa__fail(PA_STATUS_NULL_POINTER, "pa_cache_init: cache is NULL");
    if (!pa__dtype_valid(dtype) || (layout != PA_LAYOUT_NHD && layout != PA_LAYOUT_HND))
        return pa__fail(PA_STATUS_INVALID_ARGUMENT, "pa_cache_init: bad dtype %d or layout %d",
                        (int)dtype, (int)layout);
    if (num_blocks < 1 || block_size < 1 || num_kv_heads < 1 || head_size < 1)
        return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                        "pa_cache_init: num_blocks %lld, block_size %d, num_kv_heads %d, "
                        "head_size %d must all be >= 1",
                        (long long)num_blocks, block_size, num_kv_heads, head_size);
    int64_t per_block, total;
    if (!pa__mul_i64((int64_t)block_size * num_kv_heads, head_size, &per_block) ||
        !pa__mul_i64(per_block, num_blocks, &total) ||
        (uint64_t)total > (uint64_t)INT64_MAX / 8)
        return pa__fail(PA_STATUS_OVERFLOW, "pa_cache_init: %lld blocks of %lld elements overflow",
                        (long long)num_blocks, (long long)per_block);
    memset(c, 0, sizeof *c);
    c->dtype = dtype;
    c->memory = PA_MEMORY_HOST;
    c->num_blocks = num_blocks;
    c->block_size = block_size;
    c->num_kv_heads = num_kv_heads;
    c->head_size = head_size;
    c->block_stride = per_block;
    c->token_stride = layout == PA_LAYOUT_NHD ? (int64_t)num_kv_heads * head_size : head_size;
    c->head_stride = layout == PA_LAYOUT_NHD ? head_size : (int64_t)block_size * head_size;
    return PA_STATUS_OK;
}

/* Largest addressed element + 1, or -1 on overflow / bad geometry. */
static int64_t span(const pa_cache *c)
{
    int64_t a, b, d, s;
    if (c->num_blocks < 1 || c->block_size < 1 || c->num_kv_heads < 1 || c->head_size < 1)
        return -1; /* also keeps the "- 1"s below from overflowing */
    if (!pa__mul_i64(c->num_blocks - 1, c->block_stride, &a) ||
        !pa__mul_i64(c->block_size - 1, c->token_stride, &b) ||
        !pa__mul_i64(c->num_kv_heads - 1, c->head_stride, &d) || !pa__add_i64(a, b, &s) ||
        !pa__add_i64(s, d, &s) || !pa__add_i64(s, c->head_size, &s) ||
        (uint64_t)s > (uint64_t)INT64_MAX / 8)
        return -1;
    return s;
}

int64_t pa_cache_pool_elems(const pa_cache *c) { return c ? span(c) : -1; }

/* The four dimensions' strides and extents (dim, head, token, block), sorted by stride */
static void dims_by_stride(const pa_cache *c, int64_t st[4], int64_t ex[4])
{
    st[0] = 1, st[1] = c->head_stride, st[2] = c->token_stride, st[3] = c->block_stride;
    ex[0] = c->head_size, ex[1] = c->num_kv_heads, ex[2] = c->block_size, ex[3] = c->num_blocks;
    for (int i = 1; i < 4; i++) /* insertion sort by stride */
        for (int j = i; j > 0 && st[j] < st[j - 1]; j--) {
            int64_t t = st[j]; st[j] = st[j - 1]; st[j - 1] = t;
            t = ex[j]; ex[j] = ex[j - 1]; ex[j - 1] = t;
        }
}

/* Distinct (b, t, h, d) map to distinct elements if, with the dimensions of extent > 1 sorted
 * by stride, each stride is at least the span of the dimensions inside it. */
static bool strides_injective(const pa_cache *c)
{
    int64_t st[4], ex[4];
    dims_by_stride(c, st, ex);
    int64_t inner = 0; /* span of the dimensions seen so far: max offset + 1 */
    for (int i = 0; i < 4; i++) {
        if (ex[i] == 1) continue;
        if (st[i] < inner || st[i] < 1) return false;
        int64_t extra;
        if (!pa__mul_i64(ex[i] - 1, st[i], &extra) || !pa__add_i64(inner == 0 ? 1 : inner, extra, &inner))
            return false;
    }
    return true;
}

pa_status pa__cache_validate(const pa_cache *c, const char *what)
{
    if (!c) return pa__fail(PA_STATUS_NULL_POINTER, "%s: cache is NULL", what);
    if (!c->key || !c->value)
        return pa__fail(PA_STATUS_NULL_POINTER, "%s: cache key/value pool pointer is NULL", what);
    if (!pa__dtype_valid(c->dtype))
        return pa__fail(PA_STATUS_INVALID_ARGUMENT, "%s: cache dtype %d is not a pa_dtype", what,
                        (int)c->dtype);
    if (c->memory != PA_MEMORY_HOST && c->memory != PA_MEMORY_CUDA)
        return pa__fail(PA_STATUS_INVALID_ARGUMENT, "%s: cache memory %d is not a pa_memory", what,
                        (int)c->memory);
    if (c->num_blocks < 1 || c->block_size < 1 || c->num_kv_heads < 1 || c->head_size < 1)
        return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                        "%s: cache num_blocks %lld, block_size %d, num_kv_heads %d, head_size %d "
                        "must all be >= 1",
                        what, (long long)c->num_blocks, c->block_size, c->num_kv_heads,
                        c->head_size);
    if (c->block_stride < 0 || c->token_stride < 0 || c->head_stride < 0 || span(c) < 0)
        return pa__fail(PA_STATUS_OVERFLOW,
                        "%s: cache strides (block %lld, token %lld, head %lld) are negative or "
                        "overflow",
                        what, (long long)c->block_stride, (long long)c->token_stride,
                        (long long)c->head_stride);
    if (!strides_injective(c))
        return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                        "%s: cache strides (block %lld, token %lld, head %lld) with head_size %d "
                        "do not nest (sorted by stride, each must be at least the span of the "
                        "dimensions inside it), so distinct elements may overlap",
                        what, (long long)c->block_stride, (long long)c->token_stride,
                        (long long)c->head_stride, c->head_size);
    return PA_STATUS_OK;
}

pa_status pa_cache_validate(const pa_cache *c) { return pa__cache_validate(c, "pa_cache_validate"); }

/* Whether r = sum over the dims i < n of x_i st[i] for some |x_i| < ex[i], the dims sorted by
 * stride and nested (strides_injective): the offset between two elements of the pool. Each
 * level leaves at most two candidates (the dims inside span less than its stride), so at most 16
 * paths. */
static bool offset_difference(int64_t r, const int64_t *st, const int64_t *ex, const int64_t *inner, int n)
{
    if (n == 0) return r == 0;
    const int i = n - 1;
    if (ex[i] == 1) return offset_difference(r, st, ex, inner, i);
    /* x with |r - x st| <= inner[i] - 1: x within [(r - inner + 1) / st, (r + inner - 1) / st] */
    const int64_t lo = r - (inner[i] - 1), hi = r + (inner[i] - 1);
    int64_t x0 = lo / st[i] - 1, x1 = hi / st[i] + 1; /* (a step wider each way: C's division truncates) */
    for (int64_t x = x0; x <= x1; x++) {
        if (x <= -ex[i] || x >= ex[i]) continue;
        int64_t rest = r - x * st[i]; /* (|r| and |x st| are within the pool's span: no overflow) */
        if (rest < -(inner[i] - 1) || rest > inner[i] - 1) continue;
        if (offset_difference(rest, st, ex, inner, i)) return true;
    }
    return false;
}

/* A cache about to be written: pa__cache_validate, and no element of the value pool on one of the
 * key pool (a cache with value == key took a write's keys as values and returned OK until an
 * audit: bench/NOTES.md, fortieth pass). Pools may interleave (FlashInfer's [num_blocks, 2,
 * ...] is key and value one block-half apart, the block stride twice a half): the test is by
 * element, not by span. Reading a cache whose pools coincide stays allowed (V = K), and so does
 * writing one where the caller writes the same data to both (same_data: V = K kept). */
pa_status pa__cache_validate_write(const pa_cache *c, const char *what, bool same_data)
{
    pa_status s = pa__cache_validate(c, what);
    if (s) return s;
    if (c->key == c->value && same_data) return PA_STATUS_OK; /* (one pool, V = K, written alike) */
    const int64_t es = (int64_t)pa_dtype_size(c->dtype), n = span(c);
    const uintptr_t k = (uintptr_t)c->key, v = (uintptr_t)c->value;
    const uint64_t gap = k > v ? (uint64_t)(k - v) : (uint64_t)(v - k);
    if (gap >= (uint64_t)n * (uint64_t)es) return PA_STATUS_OK; /* (the spans apart: most caches) */
    bool clash = gap % (uint64_t)es != 0; /* (elements that overlap in part: refused) */
    if (!clash) {
        int64_t st[4], ex[4];
        dims_by_stride(c, st, ex);
        int64_t inner[4]; /* inner[i]: span of the dims below i (their largest offset + 1) */
        inner[0] = 1;
        for (int i = 1; i < 4; i++) inner[i] = inner[i - 1] + (ex[i - 1] - 1) * st[i - 1];
        clash = offset_difference((int64_t)(gap / (uint64_t)es), st, ex, inner, 4);
    }
    if (clash)
        return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                        "%s: the cache's key and value pools overlap (value - key = %s%llu bytes): a write to "
                        "one would change the other", what, k > v ? "-" : "", (unsigned long long)gap);
    return PA_STATUS_OK;
}

pa_status pa_cache_alloc(pa_cache *c)
{
    if (!c) return pa__fail(PA_STATUS_NULL_POINTER, "pa_cache_alloc: cache is NULL");
    int64_t n = span(c);
    if (c->num_blocks < 1 || c->block_size < 1 || c->num_kv_heads < 1 || c->head_size < 1 ||
        !pa__dtype_valid(c->dtype) || n < 0)
        return pa__fail(PA_STATUS_INVALID_ARGUMENT, "pa_cache_alloc: invalid cache geometry");
    size_t bytes = (size_t)n * pa_dtype_size(c->dtype);
    void *k = pa__alloc_pool(bytes), *v = pa__alloc_pool(bytes);
    if (!k || !v) {
        pa__free(k);
        pa__free(v);
        return pa__fail(PA_STATUS_OUT_OF_MEMORY, "pa_cache_alloc: %zu bytes per pool", bytes);
    }
    c->key = k;
    c->value = v;
    c->memory = PA_MEMORY_HOST;
    return PA_STATUS_OK;
}

void pa_cache_free(pa_cache *c)
{
    if (!c) return;
    pa__free(c->key);
    pa__free(c->value);
    c->key = c->value = NULL;
}

pa_status pa_cache_read_token(const pa_cache *c, int64_t slot, float k_scale, float v_scale,
                              float *key_out, float *value_out)
{
    pa_status s = pa__cache_validate(c, "pa_cache_read_token");
    if (s) return s;
    if (c->memory != PA_MEMORY_HOST)
        return pa__fail(PA_STATUS_INVALID_ARGUMENT, "pa_cache_read_token: host memory only");
    if (slot < 0 || slot / c->block_size >= c->num_blocks)
        return pa__fail(PA_STATUS_OUT_OF_RANGE, "pa_cache_read_token: slot %lld not in [0, %lld)",
                        (long long)slot, (long long)(c->num_blocks * c->block_size));
    const bool fp8 = pa__dtype_is_fp8(c->dtype);
    if (fp8 && !(isfinite(k_scale) && k_scale > 0 && isfinite(v_scale) && v_scale > 0))
        return pa__fail(PA_STATUS_INVALID_ARGUMENT,
                        "pa_cache_read_token: k_scale %g, v_scale %g must be finite > 0 for a %s cache",
                        (double)k_scale, (double)v_scale, pa_dtype_name(c->dtype));
    float ks = fp8 ? k_scale : 1.0f;
    float vs = fp8 ? v_scale : 1.0f;
    pa__fpenv fe; /* (the products in the default environment, as every call that computes) */
    pa__fpenv_enter(&fe);
    for (int32_t h = 0; h < c->num_kv_heads; h++) {
        int64_t off = pa__cache_offset(c, slot / c->block_size, slot % c->block_size, h);
        for (int32_t d = 0; d < c->head_size; d++) {
            if (key_out) key_out[h * c->head_size + d] = pa__load_f32(c->dtype, c->key, off + d) * ks;
            if (value_out)
                value_out[h * c->head_size + d] = pa__load_f32(c->dtype, c->value, off + d) * vs;
        }
    }
    pa__fpenv_leave(&fe);
    return PA_STATUS_OK;
}

/* One row of num_kv_heads * head_size source elements into one token slot of a pool; fp8
 * pools store quant(x / scale). */
static void write_row(const pa_cache *c, void *pool, int64_t slot, pa_dtype src_dtype,
                      const void *src, int64_t src_off, float scale)
{
    int64_t block = slot / c->block_size, t = slot % c->block_size;
    bool fp8 = pa__dtype_is_fp8(c->dtype);
    size_t es = pa_dtype_size(src_dtype);
    for (int32_t h = 0; h < c->num_kv_heads; h++) {
        int64_t dst = pa__cache_offset(c, block, t, h);
        int64_t s = src_off + (int64_t)h * c->head_size;
        if (src_dtype == c->dtype) {
            memcpy((char *)pool + dst * es, (const char *)src + s * es, (size_t)c->head_size * es);
            continue;
        }
        for (int32_t d = 0; d < c->head_size; d++) {
            float x = pa__load_f32(src_dtype, src, s + d);
            pa__store_f32(c->dtype, pool, dst + d, fp8 ? x / scale : x);
        }
    }
}

void pa__cache_write_host(const pa_cache *c, pa_dtype src_dtype, const void *key,
                          int64_t k_row_stride, const void *value, int64_t v_row_stride,
                          const int64_t *slots, int64_t n, float k_scale, float v_scale)
{
    for (int64_t i = 0; i < n; i++) {
        if (slots[i] < 0) continue;
        write_row(c, c->key, slots[i], src_dtype, key, i * k_row_stride, k_scale);
        write_row(c, c->value, slots[i], src_dtype, value, i * v_row_stride, v_scale);
    }
}

/* Copies one block's tokens and heads (strides may differ between the two caches). */
static void copy_block(const pa_cache *src, const void *src_pool, int64_t sb, const pa_cache *dst,
                       void *dst_pool, int64_t db)
{
    size_t es = pa_dtype_size(src->dtype), row = (size_t)src->head_size * es;
    for (int32_t t = 0; t < src->block_size; t++)
        for (int32_t h = 0; h < src->num_kv_heads; h++)
            memcpy((char *)dst_pool + pa__cache_offset(dst, db, t, h) * es,
                   (const char *)src_pool + pa__cache_offset(src, sb, t, h) * es, row);
}

void pa__cache_copy_blocks_host(const pa_cache *caches, int32_t num_layers, const int64_t *pairs,
                                int64_t num_pairs)
{
    for (int32_t l = 0; l < num_layers; l++)
        for (int64_t p = 0; p < num_pairs; p++) {
            const pa_cache *c = &caches[l];
            copy_block(c, c->key, pairs[2 * p], c, c->key, pairs[2 * p + 1]);
            copy_block(c, c->value, pairs[2 * p], c, c->value, pairs[2 * p + 1]);
        }
}

void pa__cache_swap_blocks_host(const pa_cache *src, const pa_cache *dst, const int64_t *pairs,
                                int64_t num_pairs)
{
    for (int64_t p = 0; p < num_pairs; p++) {
        copy_block(src, src->key, pairs[2 * p], dst, dst->key, pairs[2 * p + 1]);
        copy_block(src, src->value, pairs[2 * p], dst, dst->value, pairs[2 * p + 1]);
    }
}

void pa__merge_states_host(const pa_merge_args *a)
{
    int64_t ts = a->lse_token_stride, hs = a->lse_head_stride;
    for (int64_t t = 0; t < a->num_tokens; t++)
        for (int32_t h = 0; h < a->num_heads; h++) {
            int64_t li = t * ts + h * hs;
            float la = a->lse_a[li], lb = a->lse_b[li];
            if (la == INFINITY) la = -INFINITY;
            if (lb == INFINITY) lb = -INFINITY;
            /* the header's formula as IEEE arithmetic has it: a NaN LSE makes the row and its
             * LSE NaN; a part of weight 0 by underflow still multiplies in (0 times a NaN out is
             * NaN); only an empty part (LSE -inf) adds nothing, whatever its out holds. (Until
             * 2026-11-30 a NaN LSE gave "both empty" and any weight of 0 skipped its part: an
             * independent oracle found it, bench/NOTES.md, thirty-sixth pass.) */
            const float m = isnan(la) || isnan(lb) ? NAN : la > lb ? la : lb;
            const bool empty = m == -INFINITY;
            const float wa = empty ? 0.0f : expf(la - m), wb = empty ? 0.0f : expf(lb - m);
            const float sum = wa + wb;
            const float ca = empty ? 0.0f : wa / sum, cb = empty ? 0.0f : wb / sum;
            const bool ua = la != -INFINITY, ub = lb != -INFINITY; /* the parts that count */
            int64_t base = (t * a->num_heads + h) * (int64_t)a->head_size;
            for (int32_t d = 0; d < a->head_size; d++) {
                float x = 0.0f;
                if (ua) x += pa__load_f32(a->dtype, a->out_a, base + d) * ca;
                if (ub) x += pa__load_f32(a->dtype, a->out_b, base + d) * cb;
                pa__store_f32(a->dtype, a->out, base + d, x);
            }
            if (a->out_lse) a->out_lse[li] = empty ? -INFINITY : m + logf(sum);
        }
}
