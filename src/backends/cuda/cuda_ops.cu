/* cuda_ops.cu: cache write (reshape_and_cache_flash), block copies and merge_states on the
 * device. Each kernel is one block per row of work with threads over
 * the contiguous elements, through the caches' strides (so NHD, HND and interleaved pools all
 * work, and elements outside the addressed blocks are never touched). */
#include "cuda_common.cuh"

namespace {

struct cache_geom {
    int64_t block, token, head;
    int32_t bs, heads, dim;
};

cache_geom geom_of(const pa_cache *c)
{
    cache_geom g;
    g.block = c->block_stride;
    g.token = c->token_stride;
    g.head = c->head_stride;
    g.bs = c->block_size;
    g.heads = c->num_kv_heads;
    g.dim = c->head_size;
    return g;
}

/* grid-stride over tokens; threads over heads * dims. */
__global__ void cache_write_kernel(cache_geom g, int cache_dtype, void *kc, void *vc,
                                   int src_dtype, const void *key, int64_t k_rs,
                                   const void *value, int64_t v_rs, const int64_t *slots,
                                   int64_t n, float k_scale, float v_scale)
{
    pa_cu_pdl_begin();
    const bool fp8 = cache_dtype == PA_DTYPE_FP8_E4M3 || cache_dtype == PA_DTYPE_FP8_E5M2;
    const int hd = g.heads * g.dim;
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const int64_t slot = slots[i];
        if (slot < 0) continue;
        const int64_t blk = slot / g.bs, t = slot % g.bs;
        const int64_t cbase = blk * g.block + t * g.token;
        for (int e = (int)threadIdx.x; e < hd; e += blockDim.x) {
            const int h = e / g.dim, d = e - h * g.dim;
            const int64_t co = cbase + (int64_t)h * g.head + d;
            float kx = pa_cu_load(src_dtype, key, i * k_rs + e);
            float vx = pa_cu_load(src_dtype, value, i * v_rs + e);
            if (fp8) {
                kx = kx / k_scale;
                vx = vx / v_scale;
            }
            pa_cu_store(cache_dtype, kc, co, kx);
            pa_cu_store(cache_dtype, vc, co, vx);
        }
    }
}

template <typename T>
__global__ void block_copy_kernel(cache_geom gs, const T *src, cache_geom gd, T *dst,
                                  const int64_t *pairs, int64_t num_pairs)
{
    const int per_block = gs.bs * gs.heads * gs.dim;
    for (int64_t p = blockIdx.x; p < num_pairs; p += gridDim.x) {
        const int64_t sb = pairs[2 * p], db = pairs[2 * p + 1];
        for (int e = (int)threadIdx.x; e < per_block; e += blockDim.x) {
            const int d = e % gs.dim;
            const int th = e / gs.dim;
            const int h = th % gs.heads, t = th / gs.heads;
            dst[db * gd.block + t * gd.token + h * gd.head + d] =
                src[sb * gs.block + t * gs.token + h * gs.head + d];
        }
    }
}

__global__ void merge_kernel(int dtype, int num_heads, int head_size, const void *out_a,
                             const float *lse_a, const void *out_b, const float *lse_b, void *out,
                             float *out_lse, int64_t lse_ts, int64_t lse_hs)
{
    const int64_t i = blockIdx.x;
    const int h = (int)blockIdx.y;
    const int64_t li = i * lse_ts + (int64_t)h * lse_hs;
    float a = lse_a[li], b = lse_b[li];
    if (a == INFINITY) a = -INFINITY;
    if (b == INFINITY) b = -INFINITY;
    /* the header's formula in IEEE arithmetic, as pa__merge_states_host: a NaN LSE gives a NaN
     * row and LSE, a part of weight 0 by underflow still multiplies in, an empty part (LSE
     * -inf) adds nothing whatever its out holds */
    const float M = isnan(a) || isnan(b) ? NAN : fmaxf(a, b);
    const bool empty = M == -INFINITY;
    const float wa = empty ? 0.f : expf(a - M);
    const float wb = empty ? 0.f : expf(b - M);
    const float den = wa + wb;
    const int64_t base = (i * num_heads + h) * (int64_t)head_size;
    for (int d = (int)threadIdx.x; d < head_size; d += blockDim.x) {
        float o = 0.f;
        if (!empty) {
            float acc = 0.f;
            if (a != -INFINITY) acc += pa_cu_load(dtype, out_a, base + d) * wa;
            if (b != -INFINITY) acc += pa_cu_load(dtype, out_b, base + d) * wb;
            o = acc / den;
        }
        pa_cu_store(dtype, out, base + d, o);
    }
    if (out_lse && threadIdx.x == 0) out_lse[li] = empty ? -INFINITY : M + logf(den);
}

unsigned grid_for(int64_t n)
{
    const int64_t cap = 1 << 20;
    return (unsigned)(n < cap ? (n > 0 ? n : 1) : cap);
}

int threads_for(int64_t elems)
{
    if (elems >= 256) return 256;
    if (elems >= 128) return 128;
    if (elems >= 64) return 64;
    return 32;
}

} // namespace

pa_status pa_cu_launch_cache_write(cudaStream_t stream, bool pdl, const pa_cache *c, int src_dtype,
                                   const void *key, int64_t k_rs, const void *value, int64_t v_rs,
                                   const int64_t *slots_dev, int64_t n, float k_scale,
                                   float v_scale)
{
    if (n <= 0) return PA_STATUS_OK;
    const cache_geom g = geom_of(c);
    PA_CU_LAUNCH_PDL(pdl, cache_write_kernel, grid_for(n), threads_for((int64_t)g.heads * g.dim), 0, stream,
        g, (int)c->dtype, c->key, c->value, src_dtype, key, k_rs, value, v_rs, slots_dev, n,
        k_scale, v_scale);
    PA_CU_CHECK_LAUNCH("cache write kernel");
    return PA_STATUS_OK;
}

pa_status pa_cu_launch_block_copy(cudaStream_t stream, const pa_cache *src, const void *src_pool,
                                  const pa_cache *dst, void *dst_pool, const int64_t *pairs_dev,
                                  int64_t num_pairs)
{
    if (num_pairs <= 0) return PA_STATUS_OK;
    const cache_geom gs = geom_of(src), gd = geom_of(dst);
    const unsigned grid = grid_for(num_pairs);
    const int threads = threads_for((int64_t)gs.bs * gs.heads * gs.dim);
    switch (pa_dtype_size(src->dtype)) {
    case 4:
        PA_CU_LAUNCH(block_copy_kernel<uint32_t>, grid, threads, 0, stream,
            gs, (const uint32_t *)src_pool, gd, (uint32_t *)dst_pool, pairs_dev, num_pairs);
        break;
    case 2:
        PA_CU_LAUNCH(block_copy_kernel<uint16_t>, grid, threads, 0, stream,
            gs, (const uint16_t *)src_pool, gd, (uint16_t *)dst_pool, pairs_dev, num_pairs);
        break;
    case 1:
        PA_CU_LAUNCH(block_copy_kernel<uint8_t>, grid, threads, 0, stream,
            gs, (const uint8_t *)src_pool, gd, (uint8_t *)dst_pool, pairs_dev, num_pairs);
        break;
    default: return pa__fail(PA_STATUS_INTERNAL, "cuda: bad cache dtype %d", (int)src->dtype);
    }
    PA_CU_CHECK_LAUNCH("block copy kernel");
    return PA_STATUS_OK;
}

pa_status pa_cu_launch_merge(cudaStream_t stream, const pa_merge_args *a, int64_t lse_ts,
                             int64_t lse_hs)
{
    if (a->num_tokens <= 0) return PA_STATUS_OK;
    if (a->num_tokens > INT32_MAX || a->num_heads > 65535)
        return pa__fail(PA_STATUS_UNSUPPORTED,
                        "cuda: merge_states grid too large (%lld tokens, %d heads; at most "
                        "2^31-1 and 65535)",
                        (long long)a->num_tokens, a->num_heads);
    dim3 grid((unsigned)a->num_tokens, (unsigned)a->num_heads);
    PA_CU_LAUNCH(merge_kernel, grid, threads_for(a->head_size), 0, stream,
        (int)a->dtype, a->num_heads, a->head_size, a->out_a, a->lse_a, a->out_b, a->lse_b, a->out,
        a->out_lse, lse_ts, lse_hs);
    PA_CU_CHECK_LAUNCH("merge_states kernel");
    return PA_STATUS_OK;
}
