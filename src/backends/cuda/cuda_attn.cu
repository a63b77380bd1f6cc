/* cuda_attn.cu: the attention kernels of the cuda backend. UNVERIFIED ON HARDWARE.
 *
 * One simple, general kernel (SIMT, fp32 throughout) serves every attention type and feature,
 * so that correctness on first contact with a GPU does not depend on many paths:
 *
 *   block = 4 warps, one work item: 8 rows of one sequence and one KV head, where a row is a
 *   (query token, query head of that KV head's group) pair. Rows run over a sequence's tokens
 *   with the group's heads innermost, so a decode token of a GQA-4 layer is one tile whose 4
 *   heads share every K/V load ("each KV byte loaded once per KV head", for groups up to 8).
 *
 *   The tile walks its keys in chunks of 32 (aligned to multiples of 32 from key 0): the block
 *   loads the chunk's K and V (dequantized to f32: fp8 times k_scale / v_scale) into shared
 *   memory; each warp owns 2 rows; lane i scores key i of the chunk for both rows (q rows
 *   broadcast from shared memory, K rows padded by one float: no bank conflicts); then an
 *   online softmax (max and sum over the warp by xor-shuffles) and P*V with lane i owning dims
 *   i, i+32, ... in registers.
 *
 *   Keys are visible by the contract: j < kv_len (keys beyond a sequence's length are never
 *   loaded, NaN or not), causal (decoder), window, block-sparse. A chunk a row sees nothing of
 *   changes nothing in that row bit for bit (alpha = exp(0) = 1, zero added), so a row's result
 *   does not depend on which tile (and which other rows) it shares a block with.
 *
 *   Decode-like sequences (query_len <= 16) with more than 512 keys are split into pieces of
 *   512 keys (flash-decoding); the pieces' (m, l, acc) go to the plan's workspace and the
 *   combine kernel merges them in split order. The split rule is a function of the sequence's
 *   own lengths, so the output is bitwise independent of the batch around it. Sinks are added
 *   once, at the end (finalize or combine).
 *
 * Not yet here (perf, not correctness): tensor-core (mma.sync) prefill tiles, 16-byte
 * vectorized K/V loads, cp.async pipelining.
 */
#include "cuda_common.cuh"

#include <float.h>

namespace {

__device__ __forceinline__ float warp_max(float x)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
__device__ __forceinline__ float warp_sum(float x)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

/* The contiguous visible key range [lo, hi) of position p (causality and window); mirrors
 * pa__key_range. */
__device__ __forceinline__ void key_range(const pa_cu_attn_params &P, int64_t p, int64_t kv_len,
                                          int64_t *lo, int64_t *hi)
{
    int64_t a = 0, b = kv_len;
    if (P.attn_type == PA_ATTN_DECODER && p + 1 < b) b = p + 1;
    if (P.window_left >= 0 && p - P.window_left > a) a = p - P.window_left;
    if (P.window_right >= 0 && p + P.window_right + 1 < b) b = p + P.window_right + 1;
    *lo = a;
    *hi = b;
}

__device__ __forceinline__ bool blocksparse_visible(const pa_cu_attn_params &P, int h, int64_t p,
                                                    int64_t j)
{
    if (P.bs_block <= 0) return true;
    const int64_t qb = p / P.bs_block, kb = j / P.bs_block;
    if (kb > qb) return false;
    if (qb - kb < P.bs_local) return true;
    return (kb + P.bs_off[h]) % P.bs_vert == 0;
}

/* Eight consecutive cache elements at element offset `off` (a multiple of 8), as f32 (fp8
 * unscaled): one 16-byte load for f16/bf16, one 8-byte load for fp8. */
__device__ __forceinline__ void load8(int dt, const void *base, int64_t off, float (&x)[8])
{
    if (dt == PA_DTYPE_F16 || dt == PA_DTYPE_BF16) {
        const uint4 raw = *(const uint4 *)((const uint16_t *)base + off);
        const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const unsigned short lo = (unsigned short)(w[i] & 0xffffu), hi = (unsigned short)(w[i] >> 16);
            if (dt == PA_DTYPE_BF16) {
                x[2 * i] = __uint_as_float((uint32_t)lo << 16);
                x[2 * i + 1] = __uint_as_float((uint32_t)hi << 16);
            } else {
                x[2 * i] = __half2float(__ushort_as_half(lo));
                x[2 * i + 1] = __half2float(__ushort_as_half(hi));
            }
        }
    } else {
        const uint2 raw = *(const uint2 *)((const uint8_t *)base + off);
        const uint32_t w[2] = {raw.x, raw.y};
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint8_t b = (uint8_t)(w[i >> 2] >> (8 * (i & 3)));
            x[i] = dt == PA_DTYPE_FP8_E4M3 ? pa_cu_e4m3_to_f32(b) : pa_cu_e5m2_to_f32(b);
        }
    }
}

/* Writes one finished row: out = acc * inv (rounded once to out dtype), lse. */
template <int NI>
__device__ __forceinline__ void store_row(const pa_cu_attn_params &P, int64_t token, int h,
                                          const float (&acc)[NI], float inv, float lse, int lane)
{
    const int D = P.head_size;
    const int64_t base = token * P.out_rs + (int64_t)h * D;
#pragma unroll
    for (int i = 0; i < NI; i++) {
        const int d = lane + 32 * i;
        if (d < D) pa_cu_store(P.out_dtype, P.out, base + d, acc[i] * inv);
    }
    if (P.lse && lane == 0) P.lse[token * P.lse_ts + (int64_t)h * P.lse_hs] = lse;
}

template <int NI>
__global__ void __launch_bounds__(PA_CU_WARPS * 32)
    attn_kernel(const __grid_constant__ pa_cu_attn_params P)
{
    PA_CU_DYN_SMEM(float, smem);
    const int D = P.head_size;
    float *Ks = smem;                                 /* [KCHUNK][D + 1] */
    float *Vs = Ks + PA_CU_KCHUNK * (D + 1);          /* [KCHUNK][D] */
    float *Qs = Vs + PA_CU_KCHUNK * D;                /* [TILE_ROWS][D] */

    const pa_cu_item it = P.items[blockIdx.x];
    const int hk = (int)blockIdx.y;
    const int G = P.group;
    const int s = it.seq;
    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t q0 = P.qstart[s];
    const int64_t qlen = P.qstart[s + 1] - q0;
    const int64_t nrows = qlen * G;
    const int64_t row_begin = it.row0;
    const int64_t row_end = min(row_begin + PA_CU_TILE_ROWS, nrows);
    const int64_t c = P.ctx_lens[s];
    const int64_t kv_len = P.kv_lens[s];
    const int ns = P.nsplit[s];
    const int64_t klo = ns == 1 ? 0 : (int64_t)it.split * P.split_len[s];
    const int64_t khi = ns == 1 ? kv_len : min(kv_len, klo + (int64_t)P.split_len[s]);
    const bool from_cache = P.attn_type == PA_ATTN_DECODER ||
                            P.attn_type == PA_ATTN_ENCODER_DECODER;

    /* Keys any row of the tile may see (ranges are monotone in p), within this split. */
    int64_t lo_a, hi_a, lo_b, hi_b;
    key_range(P, c + row_begin / G, kv_len, &lo_a, &hi_a);
    key_range(P, c + (row_end - 1) / G, kv_len, &lo_b, &hi_b);
    const int64_t kbeg = max(lo_a, klo), kend = min(hi_b, khi);

    /* The tile's queries. */
    for (int e = tid; e < PA_CU_TILE_ROWS * D; e += blockDim.x) {
        const int r = e / D, d = e - r * D;
        const int64_t row = row_begin + r;
        float x = 0.f;
        if (row < row_end) {
            const int64_t t = row / G;
            const int h = hk * G + (int)(row - t * G);
            x = pa_cu_load(P.q_dtype, P.q, (q0 + t) * P.q_rs + (int64_t)h * D + d);
        }
        Qs[e] = x;
    }

    /* This warp's rows. */
    int64_t rp[PA_CU_ROWS_PER_WARP], rlo[PA_CU_ROWS_PER_WARP], rhi[PA_CU_ROWS_PER_WARP];
    int rh[PA_CU_ROWS_PER_WARP];
    bool rvalid[PA_CU_ROWS_PER_WARP];
    float m[PA_CU_ROWS_PER_WARP], l[PA_CU_ROWS_PER_WARP], acc[PA_CU_ROWS_PER_WARP][NI];
#pragma unroll
    for (int i = 0; i < PA_CU_ROWS_PER_WARP; i++) {
        const int64_t row = row_begin + warp + PA_CU_WARPS * i;
        rvalid[i] = row < row_end;
        const int64_t t = rvalid[i] ? row / G : 0;
        rh[i] = hk * G + (rvalid[i] ? (int)(row - t * G) : 0);
        rp[i] = c + t;
        key_range(P, rp[i], kv_len, &rlo[i], &rhi[i]);
        rlo[i] = max(rlo[i], klo);
        rhi[i] = min(rhi[i], khi);
        m[i] = -INFINITY;
        l[i] = 0.f;
#pragma unroll
        for (int k = 0; k < NI; k++) acc[i][k] = 0.f;
    }

    const float kscale = pa_cu_is_fp8(P.cache_dtype) ? P.k_scale : 1.f;
    const float vscale = pa_cu_is_fp8(P.cache_dtype) ? P.v_scale : 1.f;
    const int64_t chunk0 = kbeg < kend ? (kbeg / PA_CU_KCHUNK) * PA_CU_KCHUNK : kend;

    for (int64_t kb = chunk0; kb < kend; kb += PA_CU_KCHUNK) {
        const int nk = (int)min((int64_t)PA_CU_KCHUNK, kend - kb);
        __syncthreads(); /* previous chunk consumed (and, first time round, nothing) */
        if (P.vec8 && from_cache) {
            /* 8 elements per load (16 bytes of f16/bf16, 8 of fp8): the host checked that
             * head_size, the strides and the pool bases allow it. */
            const int D8 = D >> 3;
            for (int e = tid; e < PA_CU_KCHUNK * D8; e += blockDim.x) {
                const int k = e / D8, d = (e - k * D8) * 8;
                float kx[8], vx[8];
                if (k < nk) {
                    const int64_t j = kb + k;
                    const int64_t blk = P.tables[(int64_t)s * P.table_stride + j / P.c_bs];
                    const int64_t off = blk * P.c_block + (j % P.c_bs) * P.c_token +
                                        (int64_t)hk * P.c_head + d;
                    load8(P.cache_dtype, P.kc, off, kx);
                    load8(P.cache_dtype, P.vc, off, vx);
                } else {
#pragma unroll
                    for (int i = 0; i < 8; i++) kx[i] = vx[i] = 0.f;
                }
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    Ks[k * (D + 1) + d + i] = kx[i] * kscale;
                    Vs[k * D + d + i] = vx[i] * vscale;
                }
            }
        } else
        for (int e = tid; e < PA_CU_KCHUNK * D; e += blockDim.x) {
            const int k = e / D, d = e - k * D;
            float kx = 0.f, vx = 0.f;
            if (k < nk) {
                const int64_t j = kb + k;
                if (from_cache) {
                    const int64_t blk = P.tables[(int64_t)s * P.table_stride + j / P.c_bs];
                    const int64_t off = blk * P.c_block + (j % P.c_bs) * P.c_token +
                                        (int64_t)hk * P.c_head + d;
                    kx = pa_cu_load(P.cache_dtype, P.kc, off) * kscale;
                    vx = pa_cu_load(P.cache_dtype, P.vc, off) * vscale;
                } else {
                    const int64_t row = q0 + j;
                    kx = pa_cu_load(P.kv_dtype, P.k, row * P.k_rs + (int64_t)hk * D + d);
                    vx = pa_cu_load(P.kv_dtype, P.v, row * P.v_rs + (int64_t)hk * D + d);
                }
            }
            Ks[k * (D + 1) + d] = kx;
            Vs[k * D + d] = vx;
        }
        __syncthreads();

        /* Scores of key kb + lane for this warp's rows. */
        float dot[PA_CU_ROWS_PER_WARP];
#pragma unroll
        for (int i = 0; i < PA_CU_ROWS_PER_WARP; i++) dot[i] = 0.f;
        {
            const float *krow = Ks + lane * (D + 1);
            const float *q0r = Qs + (warp)*D;
#pragma unroll 4
            for (int d = 0; d < D; d++) {
                const float kv = krow[d];
#pragma unroll
                for (int i = 0; i < PA_CU_ROWS_PER_WARP; i++)
                    dot[i] = fmaf(q0r[i * PA_CU_WARPS * D + d], kv, dot[i]);
            }
        }

        const int64_t j = kb + lane;
#pragma unroll
        for (int i = 0; i < PA_CU_ROWS_PER_WARP; i++) {
            if (!rvalid[i]) continue; /* warp-uniform */
            bool vis = lane < nk && j >= rlo[i] && j < rhi[i] &&
                       blocksparse_visible(P, rh[i], rp[i], j);
            float sc = -INFINITY;
            if (vis) {
                sc = dot[i] * P.scale;
                if (P.softcap > 0.f) sc = P.softcap * tanhf(sc / P.softcap);
                if (P.has_alibi) {
                    const int64_t dist = j > rp[i] ? j - rp[i] : rp[i] - j;
                    sc -= P.alibi[rh[i]] * (float)dist;
                }
            }
            const float cmax = warp_max(sc);
            const float m_new = fmaxf(m[i], cmax);
            if (m_new == -INFINITY) continue; /* nothing visible yet: warp-uniform */
            const float alpha = expf(m[i] - m_new); /* m = -inf: 0 */
            const float pexp = vis ? expf(sc - m_new) : 0.f;
            l[i] = l[i] * alpha + warp_sum(pexp);
#pragma unroll
            for (int k = 0; k < NI; k++) acc[i][k] *= alpha;
            for (int k = 0; k < nk; k++) {
                const float pk = __shfl_sync(0xffffffffu, pexp, k);
                if (pk != 0.f) { /* warp-uniform; masked keys add nothing, not even 0 * inf */
                    const float *vrow = Vs + k * D;
#pragma unroll
                    for (int q = 0; q < NI; q++) {
                        const int d = lane + 32 * q;
                        if (d < D) acc[i][q] = fmaf(pk, vrow[d], acc[i][q]);
                    }
                }
            }
            m[i] = m_new;
        }
    }

    /* Finish: normalize (adding the sink once) or hand the split's partials to combine. */
#pragma unroll
    for (int i = 0; i < PA_CU_ROWS_PER_WARP; i++) {
        if (!rvalid[i]) continue;
        const int64_t row = row_begin + warp + PA_CU_WARPS * i;
        const int64_t t = row / G;
        const int h = rh[i];
        if (ns == 1) {
            float mm = m[i], ll = l[i], a = 1.f;
            if (P.has_sinks) {
                const float sink = P.sinks[h];
                const float M2 = fmaxf(mm, sink);
                a = mm == -INFINITY ? 0.f : expf(mm - M2);
                ll = ll * a + expf(sink - M2);
                mm = M2;
            }
            if (ll > 0.f) {
                store_row<NI>(P, q0 + t, h, acc[i], a / ll, mm + logf(ll), lane);
            } else {
                store_row<NI>(P, q0 + t, h, acc[i], 0.f, -INFINITY, lane);
            }
        } else {
            const int64_t part = P.part_base[s] + (t * P.num_heads + h) * ns + it.split;
            float *pa = P.ws_acc + part * D;
#pragma unroll
            for (int q = 0; q < NI; q++) {
                const int d = lane + 32 * q;
                if (d < D) pa[d] = acc[i][q];
            }
            if (lane == 0) {
                P.ws_ml[2 * part] = m[i];
                P.ws_ml[2 * part + 1] = l[i];
            }
        }
    }
}

/* Merges the splits of one (token, head) in split order; grid (num_comb, num_heads). */
__global__ void __launch_bounds__(128) combine_kernel(const __grid_constant__ pa_cu_attn_params P)
{
    const pa_cu_comb cb = P.comb[blockIdx.x];
    const int h = (int)blockIdx.y;
    const int s = cb.seq;
    const int ns = P.nsplit[s];
    const int D = P.head_size;
    const int64_t part0 = P.part_base[s] + ((int64_t)cb.token * P.num_heads + h) * ns;
    const int64_t token = P.qstart[s] + cb.token;

    float M = -INFINITY;
    for (int k = 0; k < ns; k++) M = fmaxf(M, P.ws_ml[2 * (part0 + k)]);
    if (P.has_sinks) M = fmaxf(M, P.sinks[h]);
    float L = 0.f;
    if (M != -INFINITY) {
        for (int k = 0; k < ns; k++) {
            const float mk = P.ws_ml[2 * (part0 + k)];
            if (mk != -INFINITY) L += P.ws_ml[2 * (part0 + k) + 1] * expf(mk - M);
        }
        if (P.has_sinks) L += expf(P.sinks[h] - M);
    }
    const bool empty = !(L > 0.f);
    const float inv = empty ? 0.f : 1.f / L;
    const int64_t obase = token * P.out_rs + (int64_t)h * D;
    for (int d = (int)threadIdx.x; d < D; d += blockDim.x) {
        float o = 0.f;
        if (!empty) {
            for (int k = 0; k < ns; k++) {
                const float mk = P.ws_ml[2 * (part0 + k)];
                if (mk != -INFINITY) o += P.ws_acc[(part0 + k) * D + d] * expf(mk - M);
            }
        }
        pa_cu_store(P.out_dtype, P.out, obase + d, o * inv);
    }
    if (P.lse && threadIdx.x == 0)
        P.lse[token * P.lse_ts + (int64_t)h * P.lse_hs] = empty ? -INFINITY : M + logf(L);
}

typedef void (*attn_fn)(const pa_cu_attn_params);

/* Head-size buckets: registers per lane = ceil(head_size / 32) rounded up to one of these. */
struct bucket {
    int max_d;
    attn_fn fn;
};
const bucket kBuckets[] = {
    {32, attn_kernel<1>},  {64, attn_kernel<2>},  {96, attn_kernel<3>},  {128, attn_kernel<4>},
    {192, attn_kernel<6>}, {256, attn_kernel<8>}, {512, attn_kernel<16>},
};

const bucket *find_bucket(int head_size)
{
    for (const bucket &b : kBuckets)
        if (head_size <= b.max_d) return &b;
    return nullptr;
}

} // namespace

pa_status pa_cu_attn_prepare(const pa_cu_ctx *ctx)
{
    for (const bucket &b : kBuckets) {
        size_t need = pa_cu_attn_smem(b.max_d);
        if (need > ctx->smem_optin) need = ctx->smem_optin;
        if (need > 48 * 1024)
            PA_CU_TRY(cudaFuncSetAttribute((const void *)b.fn,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)need));
    }
    return PA_STATUS_OK;
}

pa_status pa_cu_attn_launch(const pa_cu_ctx *ctx, const pa_cu_plan *plan,
                            const pa_cu_attn_params *p)
{
    const bucket *b = find_bucket(p->head_size);
    if (!b) return pa__fail(PA_STATUS_UNSUPPORTED, "cuda: head_size %d > 512", p->head_size);
    if (plan->num_items > 0) {
        if (plan->num_items > INT32_MAX)
            return pa__fail(PA_STATUS_UNSUPPORTED, "cuda: %lld work items exceed one grid",
                            (long long)plan->num_items);
        dim3 grid((unsigned)plan->num_items, (unsigned)p->num_kv_heads);
        PA_CU_LAUNCH(b->fn, grid, PA_CU_WARPS * 32, plan->smem_bytes, ctx->stream, *p);
        PA_CU_CHECK_LAUNCH("attention kernel");
    }
    if (plan->num_comb > 0) {
        dim3 grid((unsigned)plan->num_comb, (unsigned)p->num_heads);
        PA_CU_LAUNCH(combine_kernel, grid, 128, 0, ctx->stream, *p);
        PA_CU_CHECK_LAUNCH("split-combine kernel");
    }
    return PA_STATUS_OK;
}
