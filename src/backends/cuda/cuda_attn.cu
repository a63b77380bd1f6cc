/* cuda_attn.cu: the attention kernels of the cuda backend.
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
 *   Decode-like sequences (query_len <= 16) with more than twice PA_CU_SPLIT_KEYS (704) keys
 *   are split into pieces of about that many (flash-decoding; the rule is in cuda_common.cuh);
 *   the pieces' (m, l, acc) go to the plan's workspace and the
 *   combine kernel merges them in split order. The split rule is a function of the sequence's
 *   own lengths, so the output is bitwise independent of the batch around it. Sinks are added
 *   once, at the end (finalize or combine).
 *
 * Short queries (query_len <= 16) over a 16-bit or fp8 paged cache at head sizes 64/128/256
 * take the decode kernel instead (below: registers straight from the cache, 16-byte loads, key
 * streams merged in a fixed order, on tensor cores when q and the cache share a 16-bit dtype);
 * long queries with 16-bit q and cache at head size 64/128 take the tensor-core tiles
 * (PAGEDATTN_CUDA_MMA=0 turns those off). Which kernel a sequence gets depends on the layer, the cache and the
 * sequence's own query length, never on the rest of the batch.
 */
#include "cuda_common.cuh"

#include <float.h>
#include <stdio.h>
#include <stdlib.h>

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

/* A query tile of sequence s: rows [row_begin, row_end) (row = token * group + head in group, at
 * most `rows` of them from row0), the sequence's query start, context and key lengths, and the key
 * ranges of its first row [lo_a, hi_a) and last row [lo_b, hi_b). Ranges are monotone in the
 * position, so [lo_a, hi_b) holds every key some row of the tile may see, and [lo_b, hi_a) the keys
 * every row sees (when the window lets one exist). */
struct tile_span {
    int64_t q0, row_begin, row_end, c, kv_len, lo_a, hi_a, lo_b, hi_b;
};

__device__ __forceinline__ tile_span tile_span_of(const pa_cu_attn_params &P, int s, int64_t row0, int rows)
{
    tile_span t;
    t.q0 = P.qstart[s];
    t.row_begin = row0;
    t.row_end = min(row0 + rows, (P.qstart[s + 1] - t.q0) * P.group);
    t.c = P.ctx_lens[s];
    t.kv_len = P.kv_lens[s];
    key_range(P, t.c + row0 / P.group, t.kv_len, &t.lo_a, &t.hi_a);
    key_range(P, t.c + (t.row_end - 1) / P.group, t.kv_len, &t.lo_b, &t.hi_b);
    return t;
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

/* The logit of visible key j for a row of head h at position p, from its scaled dot product:
 * the soft-cap, then ALiBi's distance penalty (every kernel's one definition of it). A NaN comes
 * out as +inf, which fmaxf cannot drop: the row's max becomes +inf, exp(inf - inf) makes its sum
 * NaN, and the stores below write NaN (the contract: a NaN or +inf logit makes the row NaN). */
__device__ __forceinline__ float logit(const pa_cu_attn_params &P, float x, int h, int64_t p, int64_t j)
{
    if (P.softcap > 0.f) x = P.softcap * tanhf(x / P.softcap);
    if (P.has_alibi) x -= P.alibi[h] * (float)(j > p ? j - p : p - j);
    return isnan(x) ? INFINITY : x;
}

/* scale * dot(q, k) from a dot product over raw cache codes: x P.kmul 2^P.kexp (the factor
 * split where it is no fp32 value; see pa_cu_attn_params) */
__device__ __forceinline__ float code_dot_scaled(const pa_cu_attn_params &P, float dot)
{
    const float x = dot * P.kmul;
    return P.kexp ? ldexpf(x, P.kexp) : x;
}

/* Adds head h's sink, if the layer has sinks, to a finished row's softmax state (mm, ll); returns
 * the factor for the row's accumulator (the sink joins the denominator only, exactly once). */
__device__ __forceinline__ float add_sink(const pa_cu_attn_params &P, int h, float &mm, float &ll)
{
    if (!P.has_sinks) return 1.f;
    const float sink = P.sinks[h];
    const float M2 = fmaxf(mm, sink);
    const float a = mm == -INFINITY ? 0.f : expf(mm - M2);
    ll = ll * a + expf(sink - M2);
    mm = M2;
    return a;
}

/* Softmax weights in the SIMT kernels: a masked key's is -0, which exp never returns; a visible
 * key's weight is >= +0 even where it underflows, and its v must still reach the output (0 x
 * NaN or inf is NaN: the contract's IEEE rule), so only -0 is skipped. */
__device__ __forceinline__ bool masked_weight(float w) { return __float_as_uint(w) == 0x80000000u; }

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
    pa_cu_pdl_begin();
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
    /* keys any row of the tile may see: [lo_a, hi_b), within this split below */
    const tile_span sp = tile_span_of(P, s, it.row0, PA_CU_TILE_ROWS);
    const int64_t q0 = sp.q0, row_begin = sp.row_begin, row_end = sp.row_end, c = sp.c, kv_len = sp.kv_len;
    const int ns = P.nsplit[s];
    const int64_t klo = ns == 1 ? 0 : (int64_t)it.split * P.split_len[s];
    const int64_t khi = ns == 1 ? kv_len : min(kv_len, klo + (int64_t)P.split_len[s]);
    const bool from_cache = P.attn_type == PA_ATTN_DECODER ||
                            P.attn_type == PA_ATTN_ENCODER_DECODER;

    const int64_t kbeg = max(sp.lo_a, klo), kend = min(sp.hi_b, khi);

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

        /* Scores of key kb + lane for this warp's rows: the head in chunks of 16 dims, their
         * sums in groups of 4, the group sums added up, as the cpu backend's prefill QK (its
         * cpu.h, CPU_QK_GROUP): one chain over a head of 512 erred 1.03x the case grid's
         * tolerance on row "sharp-512" (in the emulator), chains of 16, 4 and 8 err 0.74x. */
        float dot[PA_CU_ROWS_PER_WARP];
#pragma unroll
        for (int i = 0; i < PA_CU_ROWS_PER_WARP; i++) dot[i] = 0.f;
        {
            const float *krow = Ks + lane * (D + 1);
            const float *q0r = Qs + (warp)*D;
            for (int g0 = 0; g0 < D; g0 += 64) {
                float grp[PA_CU_ROWS_PER_WARP];
#pragma unroll
                for (int i = 0; i < PA_CU_ROWS_PER_WARP; i++) grp[i] = 0.f;
                const int g1 = min(D, g0 + 64);
                for (int c0 = g0; c0 < g1; c0 += 16) {
                    float ch[PA_CU_ROWS_PER_WARP];
#pragma unroll
                    for (int i = 0; i < PA_CU_ROWS_PER_WARP; i++) ch[i] = 0.f;
                    const int c1 = min(g1, c0 + 16);
#pragma unroll 4
                    for (int d = c0; d < c1; d++) {
                        const float kv = krow[d];
#pragma unroll
                        for (int i = 0; i < PA_CU_ROWS_PER_WARP; i++)
                            ch[i] = fmaf(q0r[i * PA_CU_WARPS * D + d], kv, ch[i]);
                    }
#pragma unroll
                    for (int i = 0; i < PA_CU_ROWS_PER_WARP; i++) grp[i] += ch[i];
                }
#pragma unroll
                for (int i = 0; i < PA_CU_ROWS_PER_WARP; i++) dot[i] += grp[i];
            }
        }

        const int64_t j = kb + lane;
#pragma unroll
        for (int i = 0; i < PA_CU_ROWS_PER_WARP; i++) {
            if (!rvalid[i]) continue; /* warp-uniform */
            bool vis = lane < nk && j >= rlo[i] && j < rhi[i] &&
                       blocksparse_visible(P, rh[i], rp[i], j);
            float sc = -INFINITY;
            if (vis) sc = logit(P, dot[i] * P.scale, rh[i], rp[i], j);
            const float cmax = warp_max(sc);
            const float m_new = fmaxf(m[i], cmax);
            if (m_new == -INFINITY) continue; /* nothing visible yet: warp-uniform */
            const float alpha = expf(m[i] - m_new); /* m = -inf: 0 */
            /* a masked key's weight is -0 (exp never gives it): it adds nothing, not even 0 * inf;
             * a visible key's weight may underflow to +0 and still carries a NaN or inf v */
            const float pexp = vis ? expf(sc - m_new) : -0.f;
            l[i] = l[i] * alpha + warp_sum(pexp);
#pragma unroll
            for (int k = 0; k < NI; k++) acc[i][k] *= alpha;
            for (int k = 0; k < nk; k++) {
                const float pk = __shfl_sync(0xffffffffu, pexp, k);
                if (!masked_weight(pk)) { /* warp-uniform */
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
            float mm = m[i], ll = l[i];
            const float a = add_sink(P, h, mm, ll);
            if (ll != 0.f) { /* 0: nothing visible; NaN: a poisoned row, stored NaN */
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
    pa_cu_pdl_begin();
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
    const bool empty = L == 0.f; /* a NaN sum (poisoned row) is stored as NaN */
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

/* ---- tensor-core tiles (long queries; PAGEDATTN_CUDA_MMA=0 turns them off) -------------------
 * FlashAttention-2 style with mma.sync m16n8k16 (f16 or bf16 in, f32 accumulate), for
 * sequences with query_len > 16, head sizes 64 and 128, q and cache both f16 or both bf16.
 * 4 warps x 16 rows; keys in chunks of 32 (same alignment as the SIMT kernel) staged in shared
 * memory as 16-bit; S = Q K^T and O += P V on the tensor cores, P rounded to the 16-bit dtype
 * (the contract allows it); masks, soft-cap, ALiBi and sinks elementwise on the S fragments.
 * Fragment layouts (PTX ISA, m16n8k16): g = lane / 4, t = lane % 4;
 *   A (16x16, row): a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]
 *   B (16x8, col):  b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]
 *   C (16x8):       c0,c1 = C[g][2t, 2t+1], c2,c3 = C[g+8][2t, 2t+1] */

__device__ __forceinline__ uint32_t pack16(uint16_t lo, uint16_t hi)
{
    return (uint32_t)lo | ((uint32_t)hi << 16);
}

__device__ __forceinline__ uint16_t f32_to_16(float x, bool bf16)
{
    return bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(x)) : __half_as_ushort(__float2half_rn(x));
}

__device__ __forceinline__ float f16_to_32(uint32_t b, bool bf16)
{
    return bf16 ? __uint_as_float((b & 0xffffu) << 16) : __half2float(__ushort_as_half((uint16_t)(b & 0xffffu)));
}

/* Whether either 16-bit value of w is NaN or inf (exponent all ones). */
__device__ __forceinline__ bool nonfinite2(uint32_t w, bool bf16)
{
    const uint32_t e = bf16 ? 0x7f80u : 0x7c00u;
    return (w & e) == e || ((w >> 16) & e) == e;
}

/* Masked keys and non-finite V (both tensor-core kernels): an mma multiplies every key of a
 * step for every row, a masked one with P = 0, and 0 x NaN or 0 x inf is NaN, while a row must
 * not see a key it masks. So the V of keys that some rows of a tile mask is checked, and where
 * it holds a NaN or inf the work goes to plain FMAs that skip each row's masked keys: the whole
 * tile (prefill, mma_tile_exact: checked once before the loop, so the mma loop keeps its
 * registers) or the one step (decode). Bad input only: the common path stays the mma. */

#ifdef PA_CU_EMULATE
/* The emulator computes the warp's product from every lane's fragments (layouts above). */
__device__ inline float val16(uint32_t w, int half, bool bf16)
{
    const uint16_t b = (uint16_t)(half ? w >> 16 : w & 0xffffu);
    return bf16 ? __uint_as_float((uint32_t)b << 16) : __half2float(__ushort_as_half(b));
}
__device__ inline void mma16816(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], bool bf16)
{
    uint32_t mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]}, all[32 * 6];
    pa_emu::warp_gather(mine, 6, all);
    const int lane = (int)(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
    for (int e = 0; e < 4; e++) {
        const int row = g + (e >= 2 ? 8 : 0), col = 2 * t + (e & 1);
        float acc = 0.f;
        for (int k = 0; k < 16; k++) {
            const int areg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
            const int alane = (row & 7) * 4 + ((k & 7) >> 1);
            const int blane = col * 4 + ((k & 7) >> 1);
            const int breg = k >= 8 ? 1 : 0;
            acc += val16(all[alane * 6 + areg], k & 1, bf16) * val16(all[blane * 6 + 4 + breg], k & 1, bf16);
        }
        c[e] += acc;
    }
}
#else
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], bool bf16)
{
    if (bf16)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

/* Two floats rounded to 16 bits (RNE) and packed, lo first: one cvt.rn.bf16x2/f16x2. */
__device__ __forceinline__ uint32_t pack2_16(float lo, float hi, bool bf16)
{
#ifdef PA_CU_EMULATE
    return pack16(f32_to_16(lo, bf16), f32_to_16(hi, bf16));
#else
    if (bf16) {
        const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *(const uint32_t *)&v;
    }
    const __half2 v = __floats2half2_rn(lo, hi);
    return *(const uint32_t *)&v;
#endif
}

/* 2^x by the special-function unit (ex2.approx, flush-to-zero: relative error ~2^-22, far below
 * the 16-bit rounding of P that follows it); exp2f on the emulator. */
__device__ __forceinline__ float fast_exp2(float x)
{
#ifdef PA_CU_EMULATE
    return exp2f(x);
#else
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
#endif
}

/* cp.async: 16 bytes global -> shared without a register stop; `ok` false zero-fills the
 * destination and reads nothing. */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool ok)
{
#ifdef PA_CU_EMULATE
    if (ok) memcpy(smem, gmem, 16);
    else memset(smem, 0, 16);
#else
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sa), "l"(gmem), "r"(ok ? 16 : 0) : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit()
{
#ifndef PA_CU_EMULATE
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
/* Waits until at most N committed groups of this thread are still in flight. */
template <int N>
__device__ __forceinline__ void cp_async_wait()
{
#ifndef PA_CU_EMULATE
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}
__device__ __forceinline__ void cp_async_wait_1() { cp_async_wait<1>(); }

/* ldmatrix .x4: four 8x8 matrices of 16-bit elements from shared memory; lane l gives the
 * address of row l % 8 of matrix l / 8; lane t gets, of matrix i, (row t/4, cols 2(t%4), +1) or
 * with .trans (rows 2(t%4), +1, col t/4), as one 32-bit register r[i]. */
#ifdef PA_CU_EMULATE
__device__ inline void ldsm_x4(uint32_t (&r)[4], const uint16_t *row, bool trans)
{
    const uintptr_t a = (uintptr_t)row;
    uint32_t mine[2] = {(uint32_t)a, (uint32_t)((uint64_t)a >> 32)}, all[32 * 2];
    pa_emu::warp_gather(mine, 2, all);
    const int t = (int)(threadIdx.x & 31);
    auto addr = [&](int l) { return (const uint16_t *)(uintptr_t)((uint64_t)all[2 * l] | ((uint64_t)all[2 * l + 1] << 32)); };
    for (int i = 0; i < 4; i++) {
        if (!trans) {
            const uint16_t *p = addr(8 * i + t / 4);
            r[i] = (uint32_t)p[2 * (t % 4)] | ((uint32_t)p[2 * (t % 4) + 1] << 16);
        } else {
            const uint16_t *p0 = addr(8 * i + 2 * (t % 4)), *p1 = addr(8 * i + 2 * (t % 4) + 1);
            r[i] = (uint32_t)p0[t / 4] | ((uint32_t)p1[t / 4] << 16);
        }
    }
}
#else
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const uint16_t *row, bool trans)
{
    const unsigned sa = (unsigned)__cvta_generic_to_shared(row);
    if (trans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(sa) : "memory");
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(sa) : "memory");
}
#endif

/* The rows [row_begin, row_end) of an mma prefill tile of sequence s, KV head hk, exactly (fp32
 * scores and probabilities, masked keys skipped), a warp per row: for tiles whose masked keys
 * have a NaN or inf in V. 16-bit q and cache of the same dtype, as attn_mma_kernel's. */
template <int D>
__device__ __noinline__ void mma_tile_exact(const pa_cu_attn_params &P, int s, int hk, int64_t row_begin,
                                            int64_t row_end)
{
    constexpr int NL = D / 32 > 0 ? D / 32 : 1; /* dims per lane: lane + 32 i */
    const bool bf16 = P.cache_dtype == PA_DTYPE_BF16;
    const int G = P.group, lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5, nw = (int)blockDim.x >> 5;
    const int64_t q0 = P.qstart[s], c = P.ctx_lens[s], kv_len = P.kv_lens[s];
    const uint16_t *qp = (const uint16_t *)P.q, *kc = (const uint16_t *)P.kc, *vc = (const uint16_t *)P.vc;
    const int32_t *table = P.tables + (int64_t)s * P.table_stride;
    for (int64_t row = row_begin + warp; row < row_end; row += nw) {
        const int64_t t = row / G, p = c + t;
        const int h = hk * G + (int)(row - t * G);
        int64_t lo, hi;
        key_range(P, p, kv_len, &lo, &hi);
        float q[NL];
#pragma unroll
        for (int i = 0; i < NL; i++) {
            const int d = lane + 32 * i;
            q[i] = d < D ? f16_to_32(qp[(q0 + t) * P.q_rs + (int64_t)h * D + d], bf16) : 0.f;
        }
        float m = -INFINITY, l = 0.f, acc[NL];
#pragma unroll
        for (int i = 0; i < NL; i++) acc[i] = 0.f;
        for (int pass = 0; pass < 2; pass++) {
            for (int64_t j = lo; j < hi; j++) {
                if (!blocksparse_visible(P, h, p, j)) continue; /* warp-uniform */
                const int64_t off = (int64_t)table[j / P.c_bs] * P.c_block + (j % P.c_bs) * P.c_token +
                                    (int64_t)hk * P.c_head;
                float part = 0.f;
#pragma unroll
                for (int i = 0; i < NL; i++)
                    if (lane + 32 * i < D) part = fmaf(q[i], f16_to_32(kc[off + lane + 32 * i], bf16), part);
                const float x = logit(P, warp_sum(part) * P.scale, h, p, j);
                if (pass == 0) {
                    m = fmaxf(m, x);
                    continue;
                }
                const float w = expf(x - m);
                l += w;
#pragma unroll
                for (int i = 0; i < NL; i++)
                    if (lane + 32 * i < D) acc[i] = fmaf(w, f16_to_32(vc[off + lane + 32 * i], bf16), acc[i]);
            }
            if (m == -INFINITY) break; /* nothing visible */
        }
        float mm = m, ll = l;
        const float a = add_sink(P, h, mm, ll);
        const float inv = ll != 0.f ? a / ll : 0.f; /* NaN sum: a poisoned row, NaN */
        const int64_t base = (q0 + t) * P.out_rs + (int64_t)h * D;
#pragma unroll
        for (int i = 0; i < NL; i++)
            if (lane + 32 * i < D) pa_cu_store(P.out_dtype, P.out, base + lane + 32 * i, acc[i] * inv);
        if (P.lse && lane == 0)
            P.lse[(q0 + t) * P.lse_ts + (int64_t)h * P.lse_hs] = ll != 0.f ? mm + logf(ll) : -INFINITY;
    }
}

/* Whether the V of a key that some rows of an mma prefill tile mask and others see holds a NaN
 * or inf (then the tile goes to mma_tile_exact; bad input only). The tile's chunks cover
 * [chunk0, kend); every row sees [lo_b, hi_a) (lo of its last row, hi of its first) unless a
 * block-sparse pattern is set, when every key counts. Block-wide: every thread gets the answer. */
template <int D>
__device__ bool masked_v_nonfinite(const pa_cu_attn_params &P, int s, int hk, int64_t chunk0, int64_t kend,
                                   int64_t lo_b, int64_t hi_a)
{
    const bool bf16 = P.cache_dtype == PA_DTYPE_BF16;
    const uint16_t *vc = (const uint16_t *)P.vc;
    const bool all = P.bs_block > 0;
    const int64_t a0 = chunk0, a1 = all ? kend : min(max(lo_b, chunk0), kend);
    const int64_t b0 = all ? kend : max(hi_a, a1), b1 = kend;
    const int64_t n = (a1 - a0) + (b1 - b0);
    bool bad = false;
    for (int64_t e = threadIdx.x; e < n * (D / 2); e += blockDim.x) {
        const int64_t k = e / (D / 2), j = k < a1 - a0 ? a0 + k : b0 + (k - (a1 - a0));
        const int d = (int)(e - k * (D / 2)) * 2;
        const int64_t off = (int64_t)P.tables[(int64_t)s * P.table_stride + j / P.c_bs] * P.c_block +
                            (j % P.c_bs) * P.c_token + (int64_t)hk * P.c_head + d;
        bad |= nonfinite2(pack16(vc[off], vc[off + 1]), bf16);
    }
    return __syncthreads_or(bad) != 0;
}

/* masked_v_nonfinite for the fa tiles (P.vec8: 8-element rows): a 16-byte load per thread and
 * step (8 dims of one key), the table index by shift for power-of-two block sizes, key
 * positions in 32 bits (the plan's lengths are int32), loads of four steps in flight. Called
 * after the tile's first copies are issued, so it overlaps them. */
template <int D>
__device__ bool masked_v_nonfinite16(const pa_cu_attn_params &P, const int32_t *table, int hk, int64_t chunk0,
                                     int64_t kend, int64_t lo_b, int64_t hi_a)
{
    constexpr int TPR = D / 8; /* 16-byte loads per key row */
    const bool bf16 = P.cache_dtype == PA_DTYPE_BF16;
    const uint16_t *vc = (const uint16_t *)P.vc;
    const bool all = P.bs_block > 0;
    const int64_t a0 = chunk0, a1 = all ? kend : min(max(lo_b, chunk0), kend);
    const int64_t b0 = all ? kend : max(hi_a, a1), b1 = kend;
    const int64_t na = a1 - a0, n = na + (b1 - b0);
    const int bsh = P.c_bs_log2;
    const uint32_t bs = (uint32_t)P.c_bs;
    const int64_t head_off = (int64_t)hk * P.c_head;
    bool bad = false;
#pragma unroll 4
    for (int64_t e = threadIdx.x; e < n * TPR; e += blockDim.x) {
        const int64_t k = e / TPR;
        const uint32_t j = (uint32_t)(k < na ? a0 + k : b0 + (k - na));
        const uint32_t blk = bsh >= 0 ? j >> bsh : j / bs, in = j - blk * bs;
        const uint4 w = *(const uint4 *)(vc + (int64_t)table[blk] * P.c_block + (int64_t)in * P.c_token + head_off +
                                         (int)(e % TPR) * 8);
        bad |= nonfinite2(w.x, bf16) || nonfinite2(w.y, bf16) || nonfinite2(w.z, bf16) || nonfinite2(w.w, bf16);
    }
    return __syncthreads_or(bad) != 0;
}

template <int D>
__global__ void __launch_bounds__(256) attn_mma_kernel(const __grid_constant__ pa_cu_attn_params P)
{
    pa_cu_pdl_begin();
    constexpr int KS = D + 8; /* shared row stride in 16-bit elements (bank spread) */
    PA_CU_STATIC_SMEM __align__(16) uint16_t Ksh[2][PA_CU_KCHUNK * KS]; /* double-buffered */
    PA_CU_STATIC_SMEM __align__(16) uint16_t Vsh[2][PA_CU_KCHUNK * KS];
    const bool bf16 = P.cache_dtype == PA_DTYPE_BF16;
    const pa_cu_item it = P.items[blockIdx.x];
    const int hk = (int)blockIdx.y, G = P.group, s = it.seq;
    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
    const tile_span sp = tile_span_of(P, s, it.row0, PA_CU_MMA_ROWS);
    const int64_t q0 = sp.q0, row_begin = sp.row_begin, row_end = sp.row_end, c = sp.c, kv_len = sp.kv_len;
    const int64_t lo_a = sp.lo_a, hi_a = sp.hi_a, lo_b = sp.lo_b, hi_b = sp.hi_b;
    const int64_t kbeg = lo_a, kend = hi_b;

    /* this thread's two rows: r[0] = 16 * warp + g, r[1] = r[0] + 8 */
    bool rv[2];
    int64_t rp[2], rlo[2], rhi[2], rtok[2];
    int rh[2];
    for (int i = 0; i < 2; i++) {
        const int64_t row = row_begin + 16 * warp + g + 8 * i;
        rv[i] = row < row_end;
        rtok[i] = rv[i] ? row / G : 0;
        rh[i] = hk * G + (rv[i] ? (int)(row - rtok[i] * G) : 0);
        rp[i] = c + rtok[i];
        key_range(P, rp[i], kv_len, &rlo[i], &rhi[i]);
        if (!rv[i]) rhi[i] = rlo[i]; /* sees nothing */
    }
    /* Q fragments, straight from global memory (16-bit, same dtype as the cache) */
    uint32_t qa[D / 16][4];
    const uint16_t *qb = (const uint16_t *)P.q;
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const int i = r & 1, col = ks * 16 + 2 * t4 + (r >= 2 ? 8 : 0);
            uint32_t w = 0;
            if (rv[i]) {
                const int64_t off = (q0 + rtok[i]) * P.q_rs + (int64_t)rh[i] * D + col;
                w = pack16(qb[off], qb[off + 1]);
            }
            qa[ks][r] = w;
        }
    }
    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    const uint16_t *kc = (const uint16_t *)P.kc, *vc = (const uint16_t *)P.vc;
    const int64_t chunk0 = kbeg < kend ? (kbeg / PA_CU_KCHUNK) * PA_CU_KCHUNK : kend;
    if (masked_v_nonfinite<D>(P, s, hk, chunk0, kend, lo_b, hi_a)) {
        mma_tile_exact<D>(P, s, hk, row_begin, row_end);
        return;
    }

    /* 16-byte path (the host checked strides and alignment): chunk i + 1 streams into the other
     * shared buffer by cp.async while chunk i is computed; keys past the range are zero-filled,
     * never read. */
    const int32_t *table = P.tables + (int64_t)s * P.table_stride;
    auto issue = [&](int64_t kbx, int buf) {
        const int nkx = (int)min((int64_t)PA_CU_KCHUNK, kend - kbx), bs = P.c_bs, kb32 = (int)kbx;
        for (int e = tid; e < PA_CU_KCHUNK * (D / 8); e += blockDim.x) {
            const int k = e / (D / 8), d = (e - k * (D / 8)) * 8;
            const bool ok = k < nkx;
            int64_t off = 0;
            if (ok) {
                const int j = kb32 + k;
                off = (int64_t)table[j / bs] * P.c_block + (int64_t)(j % bs) * P.c_token + (int64_t)hk * P.c_head + d;
            }
            cp_async16(&Ksh[buf][k * KS + d], kc + off, ok);
            cp_async16(&Vsh[buf][k * KS + d], vc + off, ok);
        }
        cp_async_commit();
    };
    if (P.vec8 && chunk0 < kend) issue(chunk0, 0);

    int iter = 0;
    for (int64_t kb = chunk0; kb < kend; kb += PA_CU_KCHUNK, iter++) {
        const int nk = (int)min((int64_t)PA_CU_KCHUNK, kend - kb);
        const int buf = P.vec8 ? (iter & 1) : 0;
        __syncthreads(); /* every warp is done with the buffer about to be refilled */
        if (P.vec8) {
            if (kb + PA_CU_KCHUNK < kend) issue(kb + PA_CU_KCHUNK, buf ^ 1);
            else cp_async_commit(); /* an empty group keeps the count */
            cp_async_wait_1();      /* this chunk's group has landed */
        } else {
            for (int e = tid; e < PA_CU_KCHUNK * (D / 2); e += blockDim.x) {
                const int k = e / (D / 2), d = (e - k * (D / 2)) * 2;
                uint16_t k0 = 0, k1 = 0, v0 = 0, v1 = 0;
                if (k < nk) {
                    const int64_t j = kb + k;
                    const int64_t blk = P.tables[(int64_t)s * P.table_stride + j / P.c_bs];
                    const int64_t off = blk * P.c_block + (j % P.c_bs) * P.c_token + (int64_t)hk * P.c_head + d;
                    k0 = kc[off], k1 = kc[off + 1], v0 = vc[off], v1 = vc[off + 1];
                }
                Ksh[0][k * KS + d] = k0, Ksh[0][k * KS + d + 1] = k1;
                Vsh[0][k * KS + d] = v0, Vsh[0][k * KS + d + 1] = v1;
            }
        }
        __syncthreads();
        const uint16_t *Kb = Ksh[buf], *Vb = Vsh[buf];

        /* S = Q K^T: 4 tiles of 8 keys */
        float sc[4][4];
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
            /* ldmatrix x4: the B fragments of two k-steps for 8 keys in one instruction */
#pragma unroll
            for (int ks = 0; ks < D / 16; ks += 2) {
                uint32_t r[4];
                ldsm_x4(r, Kb + (nt * 8 + (lane & 7)) * KS + (ks + (lane >> 4)) * 16 + ((lane >> 3) & 1) * 8, false);
                const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
                mma16816(sc[nt], qa[ks], b0, bf16);
                mma16816(sc[nt], qa[ks + 1], b1, bf16);
            }
        }
        /* scores -> probabilities, online softmax per row (a row lives in a quad of lanes) */
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i = e >> 1;
                const int64_t j = kb + nt * 8 + 2 * t4 + (e & 1);
                const bool vis = j - kb < nk && j >= rlo[i] && j < rhi[i] &&
                                 blocksparse_visible(P, rh[i], rp[i], j);
                float x = -INFINITY;
                if (vis) x = logit(P, sc[nt][e] * P.scale, rh[i], rp[i], j);
                sc[nt][e] = x;
                mx[i] = fmaxf(mx[i], x);
            }
        float alpha[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
            const float m_new = fmaxf(m[i], mx[i]);
            alpha[i] = m_new == -INFINITY ? 1.f : expf(m[i] - m_new);
            m[i] = m_new;
        }
        float rs[2] = {0.f, 0.f};
        uint32_t pa[2][4];
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            uint16_t p16[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i = e >> 1;
                const float pr = sc[nt][e] == -INFINITY ? 0.f : expf(sc[nt][e] - m[i]);
                rs[i] += pr;
                p16[e] = f32_to_16(pr, bf16);
            }
            /* C layout of key tile nt -> A layout of key step nt / 2 */
            const int ks = nt >> 1, hi = nt & 1;
            pa[ks][hi * 2 + 0] = pack16(p16[0], p16[1]);
            pa[ks][hi * 2 + 1] = pack16(p16[2], p16[3]);
        }
#pragma unroll
        for (int i = 0; i < 2; i++) {
            rs[i] += __shfl_xor_sync(0xffffffffu, rs[i], 1);
            rs[i] += __shfl_xor_sync(0xffffffffu, rs[i], 2);
            l[i] = l[i] * alpha[i] + rs[i];
        }
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            o[n][0] *= alpha[0], o[n][1] *= alpha[0];
            o[n][2] *= alpha[1], o[n][3] *= alpha[1];
        }
        /* O += P V: B[k = key][n = dim] */
        /* ldmatrix x4 .trans: the B fragments of two dim tiles for 16 keys */
#pragma unroll
        for (int n = 0; n < D / 8; n += 2) {
#pragma unroll
            for (int ks = 0; ks < 2; ks++) {
                uint32_t r[4];
                ldsm_x4(r, Vb + (ks * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * KS + (n + (lane >> 4)) * 8, true);
                const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
                mma16816(o[n], pa[ks], b0, bf16);
                mma16816(o[n + 1], pa[ks], b1, bf16);
            }
        }
    }

    /* finish each row: sinks once, normalize, store */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        float mm = m[i], ll = l[i];
        const float a = add_sink(P, rh[i], mm, ll);
        const float inv = ll != 0.f ? a / ll : 0.f; /* NaN sum: a poisoned row, NaN */
        if (!rv[i]) continue;
        const int64_t base = (q0 + rtok[i]) * P.out_rs + (int64_t)rh[i] * D;
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            const int d = n * 8 + 2 * t4;
            pa_cu_store(P.out_dtype, P.out, base + d, o[n][2 * i] * inv);
            pa_cu_store(P.out_dtype, P.out, base + d + 1, o[n][2 * i + 1] * inv);
        }
        if (P.lse && t4 == 0)
            P.lse[(q0 + rtok[i]) * P.lse_ts + (int64_t)rh[i] * P.lse_hs] =
                ll != 0.f ? mm + logf(ll) : -INFINITY;
    }
}

/* ---- FlashAttention-2 style prefill tiles ----------------------------------------------------
 *
 * attn_fa_kernel<D, BF, FEAT>: 16-bit q == cache dtype, head size D = 64/128, 16-byte cache loads
 * (P.vec8). A block of 4 warps takes PA_CU_MMA_ROWS = 128 rows (warp w: rows 32w .. 32w + 31 as
 * two 16-row m-tiles, so every K/V fragment read from shared memory feeds two mma), the tile's Q
 * rows in shared memory, keys in chunks of BN = 32 or 64 (aligned to multiples of BN from key
 * 0; fa_choose says which layers take which) double-buffered by cp.async. Scores and the online softmax run in base 2 (the scale times
 * log2 e goes into the exponent's FMA on whole chunks, into logit()'s result on masked ones; m is
 * kept in log2 units and turned back for sinks and the LSE).
 * The rescale is lazy: a warp rescales its output and sums only when one of its rows' maxima grew
 * by more than 8 (log2 units); otherwise every row keeps its old m, and the chunk's probabilities,
 * up to 2^8, are taken relative to it. That is exact in exact arithmetic (out and the LSE divide
 * the same stale scale out of O and l), P's 16-bit rounding is relative, and fp32 has the range.
 * Only chunks that some row masks (the causal diagonal, a window's edge, the end of the keys)
 * or layers with a soft-cap, ALiBi or a block-sparse pattern evaluate the mask per element;
 * every other chunk is the plain scaled product. FEAT (fa_feat: the layer has one of those
 * features) puts logit() and the block-sparse test in the masked chunks' code; without it a
 * masked chunk only compares each key with its row's range, in 32 bits (the general code there
 * cost 11 registers and its spills slowed the unmasked chunks). P is rounded to the cache dtype
 * for P V (allowed by the contract), the row sums stay fp32. Rows and chunking are fixed by
 * the sequence alone, so a row's bits do not depend on the batch. */
/* keys per chunk of the kernels with table entries in registers or loaded per key (64 there:
 * more registers, spills and 4% slower); the shared-memory-offset kernels (TBM 2) also take 64 */
constexpr int FA_BN = 32;
template <int D, bool BF, bool FEAT, int TBM, int BN = FA_BN>
__global__ void __launch_bounds__(128) attn_fa_kernel(const __grid_constant__ pa_cu_attn_params P)
{
    pa_cu_pdl_begin();
    constexpr bool TB = TBM == 1;
    constexpr int KS = D + 8;  /* shared row stride in 16-bit elements (bank spread, 16-byte rows) */
    constexpr int NT = BN / 8; /* 8-key score tiles per chunk */
    constexpr int DT = D / 8;  /* 8-dim output tiles */
    constexpr float LOG2E = 1.4426950408889634f, LN2 = 0.6931471805599453f;
    PA_CU_DYN_SMEM(uint16_t, fa_smem);
    uint16_t *const Qs = fa_smem;                        /* [PA_CU_MMA_ROWS][KS] */
    uint16_t *const Ks = Qs + PA_CU_MMA_ROWS * KS;       /* [2][BN][KS] */
    uint16_t *const Vs = Ks + 2 * BN * KS;               /* [2][BN][KS] */
    int64_t *const Ts = (int64_t *)(Vs + 2 * BN * KS);   /* [2][BN] key offsets (TBM 2) */
    /* the last tiles of a sequence (the most keys under a causal mask) start first */
    const pa_cu_item it = P.items[gridDim.x - 1 - blockIdx.x];
    const int hk = (int)blockIdx.y, G = P.group, s = it.seq;
    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
    const tile_span sp = tile_span_of(P, s, it.row0, PA_CU_MMA_ROWS);
    const int64_t q0 = sp.q0, row_begin = sp.row_begin, row_end = sp.row_end, c = sp.c, kv_len = sp.kv_len;
    const int64_t lo_a = sp.lo_a, hi_a = sp.hi_a, lo_b = sp.lo_b, hi_b = sp.hi_b;
    const int64_t kbeg = lo_a, kend = hi_b;
    const int64_t chunk0 = kbeg < kend ? (kbeg / BN) * BN : kend;

    /* the tile's Q rows (zeros past the last row) */
    const uint16_t *qb = (const uint16_t *)P.q, *kc = (const uint16_t *)P.kc, *vc = (const uint16_t *)P.vc;
    const bool q16 = ((uintptr_t)qb & 15) == 0 && P.q_rs % 8 == 0;
    for (int e = tid; e < PA_CU_MMA_ROWS * (D / 8); e += 128) {
        const int r = e / (D / 8), d = (e - r * (D / 8)) * 8;
        const int64_t row = row_begin + r;
        const bool ok = row < row_end;
        int64_t off = 0;
        if (ok) {
            const int64_t t = row / G;
            off = (q0 + t) * P.q_rs + (int64_t)(hk * G + (int)(row - t * G)) * D + d;
        }
        if (q16) {
            cp_async16(&Qs[r * KS + d], qb + off, ok);
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) Qs[r * KS + d + i] = ok ? qb[off + i] : (uint16_t)0;
        }
    }
    /* chunk kbx's K and V into buffer `buf`: each thread copies the same 16 bytes (dims d0..+7)
     * of keys k0, k0 + 128 / (D/8), ...; keys past the range are zero-filled, never read. Key
     * positions fit 32 bits (the plan's lengths are int32): the table index is a shift and a
     * mask for power-of-two block sizes, one 32-bit division otherwise. */
    constexpr int TPR = D / 8, KPP = 128 / TPR; /* threads per key row, keys per pass */
    const int k0 = tid / TPR, d0 = (tid % TPR) * 8;
    const int32_t *table = P.tables + (int64_t)s * P.table_stride;
    const int64_t head_off = (int64_t)hk * P.c_head + d0;
    const int bsh = P.c_bs_log2;
    const uint32_t bs = (uint32_t)P.c_bs;
    /* TBM 1 (TB): the block-table entries of a chunk's keys are loaded a chunk ahead into tb
     * (keys past the range take the last key's entry, never used), so no table load waits
     * between the barriers. TBM 2: thread k < BN computes key k's element offset in the pool a
     * chunk ahead (load at the chunk's start, into Ts slot chunk % 2 at its end), so a copy
     * takes its offset from shared memory, with no index math. TBM 0: each key's entry is
     * loaded where its copy is issued. */
    int32_t tb[TB ? BN / KPP : 1];
    auto key_off = [&](int64_t kbx) -> int64_t { /* TBM 2: key kbx + tid's offset, tid < BN */
        const uint32_t j = (uint32_t)min(kbx + (int64_t)tid, kend - 1);
        const uint32_t blk = bsh >= 0 ? j >> bsh : j / bs, in = j - blk * bs;
        return (int64_t)table[blk] * P.c_block + (int64_t)in * P.c_token;
    };
    auto key_pos = [&](int64_t kbx, int i, uint32_t &blk, uint32_t &in) {
        const uint32_t j = (uint32_t)min(kbx + (int64_t)(k0 + KPP * i), kend - 1);
        blk = bsh >= 0 ? j >> bsh : j / bs;
        in = j - blk * bs;
    };
    auto load_tb = [&](int64_t kbx) {
#pragma unroll
        for (int i = 0; i < BN / KPP; i++) {
            uint32_t blk, in;
            key_pos(kbx, i, blk, in);
            tb[i] = table[blk];
        }
    };
    auto issue = [&](int64_t kbx, int buf) {
        const int nkx = (int)min((int64_t)BN, kend - kbx);
#pragma unroll
        for (int i = 0; i < BN / KPP; i++) {
            const int k = k0 + KPP * i;
            const bool ok = k < nkx;
            int64_t off = 0;
            if (TBM == 2) {
                off = Ts[buf * BN + k] + head_off;
            } else if (TB) {
                uint32_t blk, in;
                key_pos(kbx, i, blk, in);
                off = (int64_t)tb[i] * P.c_block + (int64_t)in * P.c_token + head_off;
            } else if (ok) {
                const uint32_t j = (uint32_t)kbx + (uint32_t)k;
                const uint32_t blk = bsh >= 0 ? j >> bsh : j / bs, in = j - blk * bs;
                off = (int64_t)table[blk] * P.c_block + (int64_t)in * P.c_token + head_off;
            }
            cp_async16(&Ks[(buf * BN + k) * KS + d0], kc + off, ok);
            cp_async16(&Vs[(buf * BN + k) * KS + d0], vc + off, ok);
        }
        cp_async_commit(); /* with the Q rows in the first group */
    };
    if (chunk0 < kend) {
        if (TBM == 2) {
            if (tid < BN) Ts[tid] = key_off(chunk0);
            __syncthreads();
        }
        if (TB) load_tb(chunk0);
        issue(chunk0, 0);
        if (TB && chunk0 + BN < kend) load_tb(chunk0 + BN);
        /* (slot 1 is read after the loop's first barrier) */
        if (TBM == 2 && tid < BN && chunk0 + BN < kend) Ts[BN + tid] = key_off(chunk0 + BN);
    } else {
        cp_async_commit();
    }
    /* with the first copies on their way: a masked key's non-finite V sends the tile to the
     * exact path (bad input only) */
    if (masked_v_nonfinite16<D>(P, table, hk, chunk0, kend, lo_b, hi_a)) {
        cp_async_wait<0>();
        mma_tile_exact<D>(P, s, hk, row_begin, row_end);
        return;
    }

    const bool feat = FEAT; /* the launch's fa_feat(P) */
    const float sl2 = P.scale * LOG2E;
    float o[2][DT][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int n = 0; n < DT; n++) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
    float m[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, l[4] = {0.f, 0.f, 0.f, 0.f}; /* [2 mt + i] */

    int iter = 0;
    for (int64_t kb = chunk0; kb < kend; kb += BN, iter++) {
        const int buf = iter & 1;
        __syncthreads(); /* every warp is done with the buffer about to be refilled */
        int64_t ts_next = 0; /* TBM 2: chunk iter + 2's key offset, stored at the end */
        if (kb + BN < kend) {
            issue(kb + BN, buf ^ 1);
            if (TB && kb + 2 * BN < kend) load_tb(kb + 2 * BN);
            if (TBM == 2 && tid < BN && kb + 2 * BN < kend) ts_next = key_off(kb + 2 * BN);
        } else {
            cp_async_commit(); /* an empty group keeps the count */
        }
        cp_async_wait_1(); /* this chunk's group (and the Q rows) have landed */
        __syncthreads();
        const uint16_t *Kb = Ks + buf * BN * KS, *Vb = Vs + buf * BN * KS;

        /* S = Q K^T: per 16-dim step, the A fragments of both m-tiles, then per 16 keys one
         * ldmatrix x4 (two 8-key B fragments) for four mma */
        float sc[2][NT][4];
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) sc[mt][nt][0] = sc[mt][nt][1] = sc[mt][nt][2] = sc[mt][nt][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < D / 16; ks++) {
            uint32_t a[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
                ldsm_x4(a[mt], Qs + (32 * warp + 16 * mt + (lane & 15)) * KS + ks * 16 + (lane >> 4) * 8, false);
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                uint32_t r[4];
                ldsm_x4(r, Kb + (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * KS + ks * 16 + ((lane >> 3) & 1) * 8, false);
                const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    mma16816(sc[mt][2 * np], a[mt], b0, BF);
                    mma16816(sc[mt][2 * np + 1], a[mt], b1, BF);
                }
            }
        }
        /* logits in log2 units are x * mul: a chunk every row sees whole (block-uniform) keeps
         * the raw products (mul = scale log2 e, applied inside the exponent's FMA); the others
         * are masked and transformed per element (mul = 1) */
        const bool whole = !feat && kb >= lo_b && kb + BN <= hi_a;
        const float mul = whole ? sl2 : 1.f;
        if (!whole) {
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const int64_t row = row_begin + 32 * warp + 16 * mt + 8 * i + g;
                    const int64_t t = row / G, p = c + t;
                    const int h = hk * G + (int)(row - t * G);
                    int64_t lo, hi;
                    key_range(P, p, kv_len, &lo, &hi);
                    if (row >= row_end) hi = lo; /* sees nothing */
                    if (FEAT) {
#pragma unroll
                        for (int nt = 0; nt < NT; nt++)
#pragma unroll
                            for (int e = 0; e < 2; e++) {
                                const int64_t j = kb + nt * 8 + 2 * t4 + e;
                                float &x = sc[mt][nt][2 * i + e];
                                if (j < lo || j >= hi || !blocksparse_visible(P, h, p, j)) x = -INFINITY;
                                else x = logit(P, x * P.scale, h, p, j) * LOG2E;
                            }
                    } else {
                        /* the range relative to the chunk, clamped into 32 bits */
                        const int rlo = (int)max(min(lo - kb, (int64_t)BN), (int64_t)0);
                        const int rhi = (int)max(min(hi - kb, (int64_t)BN), (int64_t)0);
#pragma unroll
                        for (int nt = 0; nt < NT; nt++)
#pragma unroll
                            for (int e = 0; e < 2; e++) {
                                const int jj = nt * 8 + 2 * t4 + e;
                                float &x = sc[mt][nt][2 * i + e];
                                x = jj < rlo || jj >= rhi ? -INFINITY : x * sl2;
                            }
                    }
                }
        }
        /* online softmax per row (a row lives in a quad of lanes); a NaN logit makes l NaN */
        float mx[4];
        bool grow = false;
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const int mt = r >> 1, i = r & 1;
            float x = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) x = fmaxf(x, fmaxf(sc[mt][nt][2 * i], sc[mt][nt][2 * i + 1]));
            x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
            x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
            mx[r] = x * mul; /* mul > 0: the max of x * mul */
            grow |= !(mx[r] <= m[r] + 8.f); /* also a first visible key (m = -inf) */
        }
        if (__any_sync(0xffffffffu, grow)) {
            float alpha[4];
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const float m_new = fmaxf(m[r], mx[r]);
                alpha[r] = m_new == -INFINITY ? 1.f : fast_exp2(m[r] - m_new);
                m[r] = m_new;
                l[r] *= alpha[r]; /* this lane's share of the row sum (the quad's shares are added at the end) */
            }
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int n = 0; n < DT; n++) {
                    o[mt][n][0] *= alpha[2 * mt], o[mt][n][1] *= alpha[2 * mt];
                    o[mt][n][2] *= alpha[2 * mt + 1], o[mt][n][3] *= alpha[2 * mt + 1];
                }
        }
        /* exp2(x mul - m); a row that has seen nothing (m = -inf) has only x = -inf so far and
         * takes 0 for m, which gives exp2(-inf) = 0 without a per-element test; NaN stays NaN */
        float nm[4];
#pragma unroll
        for (int r = 0; r < 4; r++) nm[r] = m[r] == -INFINITY ? 0.f : -m[r];
        uint32_t pa[2][BN / 16][4];
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                float pr[4];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int r = 2 * mt + (e >> 1);
                    pr[e] = fast_exp2(fmaf(sc[mt][nt][e], mul, nm[r]));
                    l[r] += pr[e];
                }
                /* C layout of key tile nt -> A layout of key step nt / 2 */
                pa[mt][nt >> 1][(nt & 1) * 2 + 0] = pack2_16(pr[0], pr[1], BF);
                pa[mt][nt >> 1][(nt & 1) * 2 + 1] = pack2_16(pr[2], pr[3], BF);
            }
        /* O += P V: per 16 keys and two 8-dim tiles, one ldmatrix x4 .trans for four mma */
#pragma unroll
        for (int kst = 0; kst < BN / 16; kst++)
#pragma unroll
            for (int n = 0; n < DT; n += 2) {
                uint32_t r[4];
                ldsm_x4(r, Vb + (kst * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * KS + (n + (lane >> 4)) * 8, true);
                const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    mma16816(o[mt][n], pa[mt][kst], b0, BF);
                    mma16816(o[mt][n + 1], pa[mt][kst], b1, BF);
                }
            }
        /* slot buf was last read by this chunk's copies, issued an iteration ago; the next
         * iteration's first barrier orders this store before chunk iter + 2's copies */
        if (TBM == 2 && tid < BN && kb + 2 * BN < kend) Ts[buf * BN + tid] = ts_next;
    }
    cp_async_wait<0>(); /* nothing in flight when the block ends (an empty range loads only Q) */
    /* a 16-bit output goes through the warp's own Q rows in shared memory (only this warp reads
     * them) and leaves in 16-byte row pieces; after the barrier no Q copy of any thread is in
     * flight (an empty key range skips the loop's barriers) */
    const bool o16 = P.fa_o16 && (P.out_dtype == PA_DTYPE_F16 || P.out_dtype == PA_DTYPE_BF16) &&
                     ((uintptr_t)P.out & 15) == 0 && P.out_rs % 8 == 0;
    if (o16) __syncthreads();

    /* finish each row: the quad's sum shares added (every lane, before any leaves), back to
     * natural units, sinks once, normalize, store */
#pragma unroll
    for (int r = 0; r < 4; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const int mt = r >> 1, i = r & 1;
        const int64_t row = row_begin + 32 * warp + 16 * mt + 8 * i + g;
        if (row >= row_end) continue;
        const int64_t t = row / G;
        const int h = hk * G + (int)(row - t * G);
        float mm = m[r] * LN2, ll = l[r];
        const float a = add_sink(P, h, mm, ll);
        const float inv = ll != 0.f ? a / ll : 0.f; /* NaN sum: a poisoned row, NaN */
        if (o16) {
            uint16_t *const dst = Qs + (32 * warp + 16 * mt + 8 * i + g) * KS + 2 * t4;
            const bool obf = P.out_dtype == PA_DTYPE_BF16;
#pragma unroll
            for (int n = 0; n < DT; n++)
                *(uint32_t *)(dst + n * 8) = pack16(pa_cu_to16(o[mt][n][2 * i] * inv, obf),
                                                    pa_cu_to16(o[mt][n][2 * i + 1] * inv, obf));
        } else {
            const int64_t base = (q0 + t) * P.out_rs + (int64_t)h * D;
#pragma unroll
            for (int n = 0; n < DT; n++) {
                const int d = n * 8 + 2 * t4;
                pa_cu_store(P.out_dtype, P.out, base + d, o[mt][n][2 * i] * inv);
                pa_cu_store(P.out_dtype, P.out, base + d + 1, o[mt][n][2 * i + 1] * inv);
            }
        }
        if (P.lse && t4 == 0) P.lse[(q0 + t) * P.lse_ts + (int64_t)h * P.lse_hs] = ll != 0.f ? mm + logf(ll) : -INFINITY;
    }
    if (o16) {
        __syncwarp();
        /* 32 / TPR rows per pass, TPR lanes of 8 elements per row; row r of the tile is token
         * t_base + (r_base + r) / G, head (r_base + r) % G of the group */
        const int64_t t_base = row_begin / G;
        const int r_base = (int)(row_begin - t_base * G);
        for (int rr = lane / TPR; rr < 32; rr += 32 / TPR) {
            const int x = r_base + 32 * warp + rr;
            if (row_begin + 32 * warp + rr >= row_end) break;
            const int64_t t = t_base + x / G;
            const int h = hk * G + x % G, d = (lane % TPR) * 8;
            *(uint4 *)((uint16_t *)P.out + (q0 + t) * P.out_rs + (int64_t)h * D + d) =
                *(const uint4 *)(Qs + (32 * warp + rr) * KS + d);
        }
    }
}
/* Dynamic shared memory of attn_fa_kernel<D, *, *, *, BN>: Q rows, two K and two V chunks, two
 * chunks' key offsets (TBM 2). */
constexpr size_t fa_smem_bytes(int D, int bn) { return (size_t)(PA_CU_MMA_ROWS + 4 * bn) * (D + 8) * 2 + 2 * bn * 8; }

/* ---- decode tiles (short queries over a paged 16-bit or fp8 cache) ---------------------------
 *
 * Memory-bound work wants every K/V byte streamed once per KV head at full width, so this kernel
 * reads the cache straight into registers (no shared-memory staging): a key row of D elements is
 * split over D/8 lanes, 8 elements (16 bytes of f16/bf16, 8 of fp8) each; the block's 128
 * threads form 128/(D/8) key streams that walk the tile's keys interleaved (stream s takes keys
 * s, s + KS, ...), U keys per stream per step with every load issued before the first use. A
 * step's scores come from the lane's 8-element partial dots reduced over the D/8 lanes by
 * xor-shuffles; each stream keeps its own online softmax (m, l, acc) per row, rescaled once per
 * step. At the end the streams' states are merged in stream order through shared memory:
 * either finished (sinks, normalization, LSE) or written as the split's partial for the
 * combine kernel, in the SIMT kernel's format. Rows are the same (token, head-in-group) tiles
 * as the SIMT kernel's items, taken 4 at a time (a decode token of a GQA-4 layer: one pass).
 * Masked keys add nothing, not even 0 * inf. The stream count, step and merge order are fixed,
 * so a row's bits do not depend on the batch. */
constexpr int DEC_NR = 4;      /* rows per pass */
constexpr int DEC_U = 4;       /* keys per stream per step */
constexpr int DEC_THREADS = 128;

template <int CD>
__device__ __forceinline__ uint4 dec_raw(const void *base, int64_t off)
{
    if (CD == PA_DTYPE_F16 || CD == PA_DTYPE_BF16)
        return *(const uint4 *)((const uint16_t *)base + off);
    const uint2 r = *(const uint2 *)((const uint8_t *)base + off);
    return make_uint4(r.x, r.y, 0u, 0u);
}

/* Eight elements of a raw load as f32 (fp8 unscaled; exact). */
template <int CD>
__device__ __forceinline__ void dec_cvt(const uint4 &r, float (&x)[8])
{
    if (CD == PA_DTYPE_F16 || CD == PA_DTYPE_BF16) {
        const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (CD == PA_DTYPE_BF16) {
                x[2 * i] = __uint_as_float(w[i] << 16);
                x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
            } else {
                x[2 * i] = __half2float(__ushort_as_half((unsigned short)(w[i] & 0xffffu)));
                x[2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(w[i] >> 16)));
            }
        }
    } else {
        const uint32_t w[2] = {r.x, r.y};
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint8_t b = (uint8_t)(w[i >> 2] >> (8 * (i & 3)));
            if (CD == PA_DTYPE_FP8_E5M2)
                x[i] = __half2float(__ushort_as_half((unsigned short)((unsigned)b << 8)));
            else
                x[i] = pa_cu_e4m3_to_f32(b);
        }
    }
}

/* The end of a decode tile: KS key streams' states (acc[k][r][d] unnormalized, rows S floats
 * apart; w[k][r] = m, lsum[k][r] = l) merged in stream order, then either finished (sinks once,
 * normalized, LSE) or written as split `split`'s partial for the combine kernel. Called by the
 * whole block after a barrier that follows the writes of acc, w and lsum; rows rg .. rg + nr - 1.
 * Each row's head, destination and scale are worked out once (threads 0 .. nr - 1), so the
 * per-element loop is a weighted sum and a store. */
template <int D, int KS, int NR, int S = D>
__device__ void dec_merge_store(const pa_cu_attn_params &P, float (*acc)[NR][S], float (*w)[NR],
                                float (*lsum)[NR], float (*fin)[2], int nr, int64_t rg, int hk,
                                int s, int64_t q0, int ns, int split)
{
    PA_CU_STATIC_SMEM int64_t row_dst[NR]; /* output element offset of (row, dim 0), or the partial's index */
    const int tid = (int)threadIdx.x, G = P.group;
    if (tid < nr) {
        const int r = tid;
        float M = -INFINITY, Ls = 0.f;
        for (int k = 0; k < KS; k++) M = fmaxf(M, w[k][r]);
        for (int k = 0; k < KS; k++) {
            const float mk = w[k][r];
            const float wk = mk == -INFINITY ? -0.f : expf(mk - M); /* -0: an empty stream */
            w[k][r] = wk;
            Ls += lsum[k][r] * wk;
        }
        const int64_t row = rg + r, t = row / G;
        const int h = hk * G + (int)(row - t * G);
        if (ns == 1) {
            const float a = add_sink(P, h, M, Ls);
            const bool empty = Ls == 0.f; /* NaN: a poisoned row, stored NaN */
            fin[r][0] = empty ? 0.f : a / Ls; /* an empty row's sum is exactly +0: stored 0 */
            row_dst[r] = (q0 + t) * P.out_rs + (int64_t)h * D;
            if (P.lse) P.lse[(q0 + t) * P.lse_ts + (int64_t)h * P.lse_hs] = empty ? -INFINITY : M + logf(Ls);
        } else {
            const int64_t part = P.part_base[s] + (t * P.num_heads + h) * ns + split;
            row_dst[r] = part;
            P.ws_ml[2 * part] = M;
            P.ws_ml[2 * part + 1] = Ls;
        }
    }
    __syncthreads();
    for (int idx = tid; idx < nr * D; idx += (int)blockDim.x) {
        const int r = idx / D, d = idx - r * D;
        float o = 0.f;
        for (int k = 0; k < KS; k++) {
            const float wk = w[k][r];
            if (!masked_weight(wk)) o += acc[k][r][d] * wk; /* an underflowed weight keeps a NaN */
        }
        if (ns == 1) pa_cu_store(P.out_dtype, P.out, row_dst[r] + d, o * fin[r][0]);
        else P.ws_acc[row_dst[r] * D + d] = o;
    }
}

/* The work item and KV head of a decode block. The grid is (items, KV heads), so the blocks
 * resident side by side are one KV head's items; with dec_hfast it is one dimension with the KV
 * head fastest, so the blocks of one item's KV heads run side by side and read neighbouring
 * bytes of the same cache rows (NHD: a token's heads are adjacent) at about the same time. */
__device__ __forceinline__ pa_cu_item dec_block(const pa_cu_attn_params &P, int *hk)
{
    if (P.dec_hfast) {
        const unsigned b = blockIdx.x, n = (unsigned)P.num_kv_heads;
        *hk = (int)(b % n);
        return P.items[b / n];
    }
    *hk = (int)blockIdx.y;
    return P.items[blockIdx.x];
}

template <int D, int CD>
__global__ void __launch_bounds__(DEC_THREADS) decode_kernel(const __grid_constant__ pa_cu_attn_params P)
{
    pa_cu_pdl_begin();
    constexpr int L = D / 8;                /* lanes per key row */
    constexpr int KS = DEC_THREADS / L;     /* key streams */
    constexpr int STEP = KS * DEC_U;        /* keys per block step */
    PA_CU_STATIC_SMEM float sh_acc[KS][DEC_NR][D];
    PA_CU_STATIC_SMEM float sh_w[KS][DEC_NR]; /* m, then the stream's merge weight */
    PA_CU_STATIC_SMEM float sh_l[KS][DEC_NR];
    PA_CU_STATIC_SMEM float sh_fin[DEC_NR][2]; /* merged M, L */

    int hk;
    const pa_cu_item it = dec_block(P, &hk);
    const int G = P.group, s = it.seq;
    const int tid = (int)threadIdx.x, stream = tid / L, sub = tid % L, d0 = sub * 8;
    const int64_t q0 = P.qstart[s], qlen = P.qstart[s + 1] - q0, nrows = qlen * G;
    const int64_t tile_end = min((int64_t)it.row0 + PA_CU_TILE_ROWS, nrows);
    /* positions and key indices fit in 32 bits (the batch builder caps lengths at INT32_MAX) */
    const int c = P.ctx_lens[s], kv_len = P.kv_lens[s];
    const int ns = P.nsplit[s];
    const int klo = ns == 1 ? 0 : it.split * P.split_len[s];
    const int khi = ns == 1 ? kv_len : (int)min((int64_t)kv_len, (int64_t)klo + P.split_len[s]);
    const float vmul = pa_cu_is_fp8(P.cache_dtype) ? P.v_scale : 1.f;
    const int32_t *table = P.tables + (int64_t)s * P.table_stride;
    const uint32_t bs = (uint32_t)P.c_bs;
    const int64_t head_off = (int64_t)hk * P.c_head + d0;

    for (int64_t rg = it.row0; rg < tile_end; rg += DEC_NR) {
        const int nr = (int)min((int64_t)DEC_NR, tile_end - rg);
        float q[DEC_NR][8], m[DEC_NR], l[DEC_NR], acc[DEC_NR][8];
        int rp[DEC_NR], rlo[DEC_NR], rhi[DEC_NR], rh[DEC_NR];
        int kbeg = INT32_MAX, kend = 0;
#pragma unroll
        for (int r = 0; r < DEC_NR; r++) {
            const bool rv = r < nr;
            const int64_t row = rg + r, t = rv ? row / G : 0;
            rh[r] = hk * G + (rv ? (int)(row - t * G) : 0);
            rp[r] = c + (int)t;
            int64_t lo64, hi64;
            key_range(P, rp[r], kv_len, &lo64, &hi64);
            rlo[r] = (int)max(lo64, (int64_t)klo);
            rhi[r] = (int)min(hi64, (int64_t)khi);
            if (!rv || rhi[r] < rlo[r]) rhi[r] = rlo[r]; /* sees nothing */
            if (rhi[r] > rlo[r]) {
                kbeg = min(kbeg, rlo[r]);
                kend = max(kend, rhi[r]);
            }
            const int64_t qoff = (q0 + t) * P.q_rs + (int64_t)rh[r] * D + d0;
#pragma unroll
            for (int e = 0; e < 8; e++) q[r][e] = rv ? pa_cu_load(P.q_dtype, P.q, qoff + e) : 0.f;
            m[r] = -INFINITY;
            l[r] = 0.f;
#pragma unroll
            for (int e = 0; e < 8; e++) acc[r][e] = 0.f;
        }

        for (int jb = kbeg; jb < kend; jb = kend - jb > STEP ? jb + STEP : kend) {
            uint4 kr[DEC_U], vr[DEC_U];
            int jj[DEC_U];
#pragma unroll
            for (int u = 0; u < DEC_U; u++) {
                jj[u] = jb + u * KS + stream;
                if (jj[u] < kend) {
                    const uint32_t j32 = (uint32_t)jj[u];
                    const int64_t blk = table[j32 / bs];
                    const int64_t off = blk * P.c_block + (int64_t)(j32 % bs) * P.c_token + head_off;
                    kr[u] = dec_raw<CD>(P.kc, off);
                    vr[u] = dec_raw<CD>(P.vc, off);
                } else {
                    kr[u] = vr[u] = make_uint4(0u, 0u, 0u, 0u);
                }
            }
            float sc[DEC_U][DEC_NR];
#pragma unroll
            for (int u = 0; u < DEC_U; u++) {
                float kx[8];
                dec_cvt<CD>(kr[u], kx);
#pragma unroll
                for (int r = 0; r < DEC_NR; r++) {
                    float dot = 0.f;
#pragma unroll
                    for (int e = 0; e < 8; e++) dot = fmaf(q[r][e], kx[e], dot);
#pragma unroll
                    for (int o = L / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
                    const int j = jj[u];
                    float x = -INFINITY;
                    if (j >= rlo[r] && j < rhi[r] && blocksparse_visible(P, rh[r], rp[r], j))
                        x = logit(P, code_dot_scaled(P, dot), rh[r], rp[r], j);
                    sc[u][r] = x;
                }
            }
            float (&pr)[DEC_U][DEC_NR] = sc; /* probabilities replace the scores */
#pragma unroll
            for (int r = 0; r < DEC_NR; r++) {
                float mx = m[r];
#pragma unroll
                for (int u = 0; u < DEC_U; u++) mx = fmaxf(mx, sc[u][r]);
                const float alpha = mx == -INFINITY ? 1.f : expf(m[r] - mx); /* m = -inf: 0 */
                float psum = 0.f;
#pragma unroll
                for (int u = 0; u < DEC_U; u++) {
                    pr[u][r] = sc[u][r] == -INFINITY ? -0.f : expf(sc[u][r] - mx); /* -0: masked */
                    psum += pr[u][r];
                }
                l[r] = l[r] * alpha + psum;
#pragma unroll
                for (int e = 0; e < 8; e++) acc[r][e] *= alpha;
                m[r] = mx;
            }
#pragma unroll
            for (int u = 0; u < DEC_U; u++) {
                float vx[8];
                dec_cvt<CD>(vr[u], vx);
#pragma unroll
                for (int r = 0; r < DEC_NR; r++) {
                    const float p = pr[u][r];
#pragma unroll
                    for (int e = 0; e < 8; e++) acc[r][e] = masked_weight(p) ? acc[r][e] : fmaf(p, vx[e], acc[r][e]);
                }
            }
        }

        /* Merge the streams in stream order. */
        __syncthreads(); /* the previous pass's readers are done */
#pragma unroll
        for (int r = 0; r < DEC_NR; r++) {
#pragma unroll
            for (int e = 0; e < 8; e++) sh_acc[stream][r][d0 + e] = acc[r][e] * vmul;
            if (sub == 0) {
                sh_w[stream][r] = m[r];
                sh_l[stream][r] = l[r];
            }
        }
        __syncthreads();
        dec_merge_store<D, KS, DEC_NR>(P, sh_acc, sh_w, sh_l, sh_fin, nr, rg, hk, s, q0, ns, it.split);
    }
}

/* Element offset (before the head and dim offsets) of key j of a sequence's table. */
__device__ __forceinline__ int64_t dec_key_off(const pa_cu_attn_params &P, const int32_t *table, int j)
{
    if (P.c_bs_log2 >= 0) /* a power-of-two block size (the usual): no integer division */
        return (int64_t)table[j >> P.c_bs_log2] * P.c_block + (int64_t)(j & (P.c_bs - 1)) * P.c_token;
    return (int64_t)table[j / P.c_bs] * P.c_block + (int64_t)(j % P.c_bs) * P.c_token;
}

/* Keys of a 16-key step (jb a multiple of 16) share one block when the block size is a power
 * of two >= 16 (the usual 16, 32, ...): one table lookup serves the step, and key jb + i sits
 * i tokens after key jb. dec_step_key_off: key j's element offset, given the step's (one_block:
 * the shared lookup in step_off) or by its own lookup. */
struct dec_step {
    bool one_block;
    int64_t step_off;
};
__device__ __forceinline__ dec_step dec_step_of(const pa_cu_attn_params &P, const int32_t *table, int jb, int kend)
{
    dec_step st; /* (a step at or past kend loads nothing: no lookup, the table may end before it) */
    st.one_block = P.c_bs_log2 >= 4;
    st.step_off = st.one_block && jb < kend ? dec_key_off(P, table, jb) : 0;
    return st;
}
__device__ __forceinline__ int64_t dec_step_key_off(const pa_cu_attn_params &P, const int32_t *table,
                                                    const dec_step &st, int jb, int j)
{
    return st.one_block ? st.step_off + (int64_t)(j - jb) * P.c_token : dec_key_off(P, table, j);
}

/* One 16-key step of a tensor-core decode warp (keys jb .. jb + 15, only those in [kbeg, kend)
 * read; the rest zero): K rows jb + g and jb + 8 + g, real dims 32c + 8t4 .. + 8 (KC loads of 16
 * bytes each); V rows jb + {2t4, 2t4 + 1, 8 + 2t4, 9 + 2t4}, real dims [NT g, NT g + NT) (VW
 * loads each). */
template <int KC, int VW, int NT>
__device__ __forceinline__ void dec_load_step(const pa_cu_attn_params &P, const int32_t *table, int jb,
                                              int kbeg, int kend, int g, int t4, int64_t head_off,
                                              const uint16_t *kc, const uint16_t *vc,
                                              uint4 (&kr)[2][KC], uint4 (&vr)[4][VW])
{
    const dec_step st = dec_step_of(P, table, jb, kend);
#pragma unroll
    for (int T = 0; T < 2; T++) {
        const int j = jb + 8 * T + g;
        if (j >= kbeg && j < kend) {
            const int64_t base = dec_step_key_off(P, table, st, jb, j) + head_off + 8 * t4;
#pragma unroll
            for (int cc = 0; cc < KC; cc++) kr[T][cc] = *(const uint4 *)(kc + base + 32 * cc);
        } else {
#pragma unroll
            for (int cc = 0; cc < KC; cc++) kr[T][cc] = make_uint4(0u, 0u, 0u, 0u);
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int j = jb + 8 * (i >> 1) + 2 * t4 + (i & 1);
        if (j >= kbeg && j < kend) {
            const int64_t base = dec_step_key_off(P, table, st, jb, j) + head_off + NT * g;
#pragma unroll
            for (int w = 0; w < VW; w++) vr[i][w] = *(const uint4 *)(vc + base + 8 * w);
        } else {
#pragma unroll
            for (int w = 0; w < VW; w++) vr[i][w] = make_uint4(0u, 0u, 0u, 0u);
        }
    }
}

/* ---- fp8 elements as mma operands ---------------------------------------------------------
 *
 * The tensor-core decode takes fp8 caches without a conversion instruction: a byte permute puts
 * two codes in the upper bytes of a 16-bit pair (with the lower code's sign copied into the byte
 * above it), one arithmetic shift and one mask move them into place, and the 16-bit value then
 * reads as the code's value times a power of two, subnormals included, because both formats
 * keep sign, exponent and mantissa in that order:
 *   E4M3 as bf16 (shift 4): value x 2^-120, scaled back by one exact bf16x2 FMA (x 2^120);
 *   E4M3 as f16  (shift 1): value x 2^-8, which the kernel folds into k_scale / v_scale;
 *   E5M2 as bf16 (shift 3): value x 2^-112, scaled back by one bf16x2 FMA (x 2^112);
 *   E5M2 as f16  (shift 0): the value itself (E5M2 is the upper byte of an f16).
 * The forms get some codes wrong: E4M3's NaN (S.1111.111 reads as 480) and, as bf16, E5M2's
 * infinities and NaNs (S.11111.mm). A step that holds such a code (f8_special, voted over the
 * warp) converts its pairs element by element instead (pa_cu_e4m3_to_f32 / pa_cu_e5m2_to_f32,
 * exact in either 16-bit type), into the same scaled forms. */
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel)
{
#ifdef PA_CU_EMULATE
    const uint64_t v = ((uint64_t)b << 32) | a;
    uint32_t r = 0;
    for (int n = 0; n < 4; n++) {
        const uint32_t s = (sel >> (4 * n)) & 15u;
        uint32_t byte = (uint32_t)(v >> (8 * (s & 7u))) & 0xffu;
        if (s & 8u) byte = (byte & 0x80u) ? 0xffu : 0u; /* the byte's sign, replicated */
        r |= byte << (8 * n);
    }
    return r;
#else
    uint32_t r;
    asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
#endif
}

/* The two values of a bf16x2 times the bf16x2 c (both halves the same power of two): exact. */
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t x, uint32_t c)
{
#ifdef PA_CU_EMULATE
    return pack16(f32_to_16(f16_to_32(x, true) * f16_to_32(c, true), true),
                  f32_to_16(f16_to_32(x >> 16, true) * f16_to_32(c, true), true));
#else
    uint32_t r;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(x), "r"(c), "r"(0x80008000u)); /* + (-0) */
    return r;
#endif
}

/* Shift, mask and bf16 scale-back (0: none) of fp8 format CD's form as a 16-bit type (BF). */
template <int CD, bool BF>
struct f8form {
    static constexpr bool E4 = CD == PA_DTYPE_FP8_E4M3;
    static constexpr int shift = E4 ? (BF ? 4 : 1) : (BF ? 3 : 0);
    static constexpr uint32_t mask = E4 ? (BF ? 0x87f087f0u : 0xbf80bf80u) : (BF ? 0x8fe08fe0u : 0xff00ff00u);
    static constexpr uint32_t scale = !BF ? 0u : E4 ? 0x7b807b80u /* 2^120 */ : 0x77807780u /* 2^112 */;
    /* the form's value over the code's value (f16 E4M3: 2^-8) */
    static constexpr float ratio = (E4 && !BF) ? 0.00390625f : 1.f;
    /* codes the form gets wrong: bit 7 of a byte of (x & smask) + sadd; none when smask is 0 */
    static constexpr uint32_t smask = E4 ? 0x7f7f7f7fu : (BF ? 0x7c7c7c7cu : 0u);
    static constexpr uint32_t sadd = E4 ? 0x01010101u : 0x04040404u;
};

/* prmt selectors: codes 0, 1 (lo) or 2, 3 (hi) of one word as a pair; byte b of word a (lower
 * value) and of word b (upper value) as a pair */
constexpr uint32_t F8_SEL_LO = 0x1804u, F8_SEL_HI = 0x3a24u;
__device__ __forceinline__ uint32_t f8_sel2(int b)
{
    return ((4u + b) << 12) | ((8u | b) << 8) | ((uint32_t)b << 4) | (uint32_t)b;
}

/* One code as its 16-bit form, element by element (exact; NaN and inf kept). */
template <int CD, bool BF>
__device__ __forceinline__ uint16_t f8_form1(uint32_t code)
{
    const uint8_t b = (uint8_t)code;
    const float x = CD == PA_DTYPE_FP8_E4M3 ? pa_cu_e4m3_to_f32(b) : pa_cu_e5m2_to_f32(b);
    return f32_to_16(x * f8form<CD, BF>::ratio, BF);
}

/* The pair that prmt(a, b, sel) places: the codes named by sel's nibbles 1 (lower value) and 3
 * (upper), as 16-bit forms; `exact` (warp-uniform): element by element. */
template <int CD, bool BF>
__device__ __forceinline__ uint32_t f8_pair(uint32_t a, uint32_t b, uint32_t sel, bool exact)
{
    typedef f8form<CD, BF> F;
    if (exact) {
        const uint64_t v = ((uint64_t)b << 32) | a;
        const uint32_t lo = (uint32_t)(v >> (8 * ((sel >> 4) & 7u))), hi = (uint32_t)(v >> (8 * ((sel >> 12) & 7u)));
        return pack16(f8_form1<CD, BF>(lo), f8_form1<CD, BF>(hi));
    }
    const uint32_t t = (uint32_t)((int32_t)prmt(a, b, sel) >> F::shift) & F::mask;
    return F::scale ? bf16x2_mul(t, F::scale) : t;
}

/* Accumulates the special-code test of word x (see f8form::smask). */
template <int CD, bool BF>
__device__ __forceinline__ void f8_special(uint32_t &acc, uint32_t x)
{
    typedef f8form<CD, BF> F;
    if (F::smask) acc |= (x & F::smask) + F::sadd;
}

/* One 16-key step's raw K and V of a lane of the tensor-core decode (layouts at the kernel):
 * 16-bit caches: K rows jb + g, jb + 8 + g, dims 32c + 8t4 .. + 8 (D/32 loads of 16 bytes);
 * V rows jb + {2t4, 2t4 + 1, 8 + 2t4, 9 + 2t4}, dims [D/8 g, D/8 (g + 1)) (D/64 loads).
 * fp8 caches: the same keys; K dims [D/4 t4, D/4 (t4 + 1)) (D/64 loads of 16 bytes), V dims
 * [D/8 g, D/8 (g + 1)) (one load of D/8 bytes; head 64: the upper half of v[i] zero). */
template <int D, bool F8>
struct dec_regs {
    uint4 k[2][D / 32];
    uint4 v[4][D / 64];
};
template <int D>
struct dec_regs<D, true> {
    uint4 k[2][D / 64];
    uint4 v[4][1];
};

__device__ __forceinline__ uint32_t word4(const uint4 &r, int i)
{
    return i == 0 ? r.x : i == 1 ? r.y : i == 2 ? r.z : r.w;
}

/* dec_load_step over an fp8 cache (dec_regs<D, true>: 16-byte aligned rows, see dec_pick). */
template <int D>
__device__ __forceinline__ void dec_load_step8(const pa_cu_attn_params &P, const int32_t *table, int jb, int kbeg,
                                               int kend, int g, int t4, int64_t head_off, const uint8_t *kc,
                                               const uint8_t *vc, dec_regs<D, true> &r)
{
    const dec_step st = dec_step_of(P, table, jb, kend);
#pragma unroll
    for (int T = 0; T < 2; T++) {
        const int j = jb + 8 * T + g;
        if (j >= kbeg && j < kend) {
            const int64_t base = dec_step_key_off(P, table, st, jb, j) + head_off + (D / 4) * t4;
#pragma unroll
            for (int cc = 0; cc < D / 64; cc++) r.k[T][cc] = *(const uint4 *)(kc + base + 16 * cc);
        } else {
#pragma unroll
            for (int cc = 0; cc < D / 64; cc++) r.k[T][cc] = make_uint4(0u, 0u, 0u, 0u);
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int j = jb + 8 * (i >> 1) + 2 * t4 + (i & 1);
        r.v[i][0] = make_uint4(0u, 0u, 0u, 0u);
        if (j >= kbeg && j < kend) {
            const uint8_t *p = vc + dec_step_key_off(P, table, st, jb, j) + head_off + (D / 8) * g;
            if (D == 128) {
                r.v[i][0] = *(const uint4 *)p;
            } else {
                const uint2 h = *(const uint2 *)p;
                r.v[i][0].x = h.x, r.v[i][0].y = h.y;
            }
        }
    }
}

/* The tensor-core decode's lazy rescale threshold: ln 256 */
constexpr float DEC_LAZY_LN = 5.545177444479562f;

/* P^T fragments of the tensor-core decode from a lane's 16-bit probabilities p (rows 2t4 and
 * 2t4 + 1 of keys g and g + 8 of S^T): b0 = (P[key 2t4][row g], P[key 2t4 + 1][row g]), b1 the
 * same keys + 8, gathered by four shuffles (sources srcA, srcB; hi_half: odd g). */
__device__ __forceinline__ void dec_p_frag(const uint16_t (&p)[4], int srcA, int srcB, bool hi_half, uint32_t (&b)[2])
{
    const uint32_t w01 = pack16(p[0], p[1]), w23 = pack16(p[2], p[3]); /* rows 2t4, 2t4+1 */
    const uint32_t a01 = __shfl_sync(0xffffffffu, w01, srcA), b01 = __shfl_sync(0xffffffffu, w01, srcB);
    const uint32_t a23 = __shfl_sync(0xffffffffu, w23, srcA), b23 = __shfl_sync(0xffffffffu, w23, srcB);
    if (hi_half) {
        b[0] = (a01 >> 16) | (b01 & 0xffff0000u);
        b[1] = (a23 >> 16) | (b23 & 0xffff0000u);
    } else {
        b[0] = (a01 & 0xffffu) | (b01 << 16);
        b[1] = (a23 & 0xffffu) | (b23 << 16);
    }
}

/* ---- tensor-core decode tiles (head size 64 or 128; a 16-bit cache with q of its dtype, or an
 * fp8 cache with f16 or bf16 q) -------------------------------------------------------------
 *
 * The same work items and results as decode_kernel, with the arithmetic on mma.sync so that a
 * warp spends its time waiting for memory, not computing. Every K and V element reaches the lane
 * that needs it as part of a 16-byte load, because a sum does not care about the order of its
 * terms: the head dims of each 16-wide mma step are a permutation of real dims (lane quad t4
 * supplies real dims 32c + 8t4 .. + 8, the same permutation applied to Q's fragments), and the
 * keys of a 16-key step are taken in the order the fragments want them. (A first version
 * computed S = Q K^T with the tile's 8 rows as mma rows 0-7, rows 8-15 idle: 202 registers,
 * 46% of the copy bandwidth on an H200; the transposed form below reached 70%.) */
/* The products transposed: S^T = K Q^T (16 keys x the tile's 8 rows) and O^T += V^T P^T (16
 * dims x 8 rows), so that no half of an mma tile idles and a lane keeps 32 accumulators, not
 * 64 (more warps fit on a multiprocessor to keep loads in flight). K and V arrive by
 * dec_load_step, four warps walk interleaved 16-key steps; P^T's fragments are gathered from the
 * S^T accumulators with four shuffles of packed 16-bit pairs per 16 keys. Lane (g, t4) owns
 * rows 2t4 and 2t4 + 1 in S^T and O^T; O^T row g of m-tile mt is real dim (D/8) g + 2 mt (and
 * + 1 for row g + 8).
 * fp8 caches (F8): K and V as 16-bit forms built from the codes (f8_pair): S^T in q's dtype
 * (QB), O^T in f16 as two products, P = p16 + plo (P rounded to f16, and the remainder rounded
 * to f16: ~22 bits, as the contract keeps P in fp32 where the value dtype is not 16-bit; a
 * NaN V times a P of 0 stays NaN); lane quad t4
 * supplies K's real dims D/4 t4 + 4 ks .. + 4 in k-step ks (two 16-byte loads per key at head
 * 128, dec_regs); a loop turn takes two 16-key steps with all their loads issued first, as many
 * bytes per warp as one 16-bit step. (Two 16-key steps per turn over a 16-bit cache, every load
 * of both issued first, took 218 registers and 2 blocks per SM: 56% of the copy bandwidth on an
 * H200 against 69.5%; removed.) */
template <int D, int CD, int MINB, bool QB = CD == PA_DTYPE_BF16>
__global__ void __launch_bounds__(DEC_THREADS, MINB) decode_mmat_kernel(const __grid_constant__ pa_cu_attn_params P)
{
    pa_cu_pdl_begin();
    constexpr int NT = D / 8;  /* real dims per lane group g in P V */
    constexpr int MT = D / 16; /* O^T m-tiles */
    constexpr int KC = D / 32; /* 16-byte K loads per key row */
    constexpr int VW = NT / 8; /* 16-byte V loads per key row */
    constexpr int NW = DEC_THREADS / 32;
    constexpr bool F8 = CD == PA_DTYPE_FP8_E4M3 || CD == PA_DTYPE_FP8_E5M2;
    constexpr bool BF = F8 ? QB : CD == PA_DTYPE_BF16; /* S^T's operands */
    constexpr bool VB = F8 ? false : BF;               /* O^T's operands */
    constexpr int SUB = F8 ? 2 : 1;                    /* 16-key steps per loop turn */
    typedef f8form<F8 ? CD : PA_DTYPE_FP8_E4M3, BF> FK; /* fp8 forms of K and V */
    typedef f8form<F8 ? CD : PA_DTYPE_FP8_E4M3, false> FV;
    /* rows padded by 2 floats: the accumulators' 8-byte stores below hit each bank at most twice
     * per half-warp (unpadded, a warp's 4-byte stores fell on 2 banks: 16-way conflicts) */
    constexpr int AS = D + 2;
    PA_CU_STATIC_SMEM __align__(8) float sh_acc[NW][8][AS];
    PA_CU_STATIC_SMEM float sh_w[NW][8];
    PA_CU_STATIC_SMEM float sh_l[NW][8];
    PA_CU_STATIC_SMEM __align__(16) uint16_t sh_fv[NW][16 * D]; /* masked keys with non-finite V: */
    PA_CU_STATIC_SMEM float sh_fp[NW][16 * 8];                   /* one step, per warp */
    PA_CU_STATIC_SMEM float sh_fin[8][2];

    int hk;
    const pa_cu_item it = dec_block(P, &hk);
    const int G = P.group, s = it.seq;
    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
    const int64_t q0 = P.qstart[s], qlen = P.qstart[s + 1] - q0, nrows = qlen * G;
    const int64_t tile_end = min((int64_t)it.row0 + PA_CU_TILE_ROWS, nrows);
    const int nr = (int)(tile_end - it.row0);
    const int c = P.ctx_lens[s], kv_len = P.kv_lens[s];
    const int ns = P.nsplit[s];
    const int klo = ns == 1 ? 0 : it.split * P.split_len[s];
    const int khi = ns == 1 ? kv_len : (int)min((int64_t)kv_len, (int64_t)klo + P.split_len[s]);
    const int32_t *table = P.tables + (int64_t)s * P.table_stride;
    const int64_t head_off = (int64_t)hk * P.c_head;
    const uint16_t *kc = (const uint16_t *)P.kc, *vc = (const uint16_t *)P.vc;
    const uint8_t *kc8 = (const uint8_t *)P.kc, *vc8 = (const uint8_t *)P.vc;

    /* Row r of the tile: valid, head, position, visible keys. Lane (g, t4) needs row g (its Q
     * fragment) and rows 2t4, 2t4 + 1 (its scores). */
    int rh[3], rp[3], rlo[3], rhi[3];
    bool rvv[3];
    const int rows[3] = {g, 2 * t4, 2 * t4 + 1};
    int64_t tq = 0;
#pragma unroll
    for (int i = 0; i < 3; i++) {
        const bool rv = rows[i] < nr;
        const int64_t t = rv ? (it.row0 + rows[i]) / G : 0;
        if (i == 0) tq = t;
        rvv[i] = rv;
        rh[i] = hk * G + (rv ? (int)(it.row0 + rows[i] - t * G) : 0);
        rp[i] = c + (int)t;
        int64_t lo64, hi64;
        key_range(P, rp[i], kv_len, &lo64, &hi64);
        rlo[i] = (int)max(lo64, (int64_t)klo);
        rhi[i] = (int)min(hi64, (int64_t)khi);
        if (!rv || rhi[i] < rlo[i]) rhi[i] = rlo[i];
    }
    int kbeg = rhi[0] > rlo[0] ? rlo[0] : INT32_MAX, kend = rhi[0] > rlo[0] ? rhi[0] : 0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        kbeg = min(kbeg, __shfl_xor_sync(0xffffffffu, kbeg, o));
        kend = max(kend, __shfl_xor_sync(0xffffffffu, kend, o));
    }

    /* Q^T fragments b0 (row g, real dims d, d+1) and b1 (d+2, d+3), d = 32c + 8t4 + 4 half */
    uint32_t qb[D / 16][2];
    {
        const uint16_t *qp = (const uint16_t *)P.q + (q0 + tq) * P.q_rs + (int64_t)rh[0] * D;
#pragma unroll
        for (int ks = 0; ks < D / 16; ks++) {
            const int d = F8 ? (D / 4) * t4 + 4 * ks : 32 * (ks >> 1) + 8 * t4 + 4 * (ks & 1);
            qb[ks][0] = rvv[0] ? pack16(qp[d], qp[d + 1]) : 0u;
            qb[ks][1] = rvv[0] ? pack16(qp[d + 2], qp[d + 3]) : 0u;
        }
    }
    float o[MT][4];
#pragma unroll
    for (int n = 0; n < MT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}; /* rows 2t4, 2t4 + 1 */
    /* fp8: S^T and O^T over the forms (f8form::ratio), scaled back with k_scale and v_scale */
    const float kratio = F8 ? 1.f / FK::ratio : 1.f, vratio = F8 ? 1.f / FV::ratio : 1.f;
    /* P^T sources: keys 2t4 (+1) of S^T live in lanes 4 (2t4) + g/2 and 4 (2t4 + 1) + g/2 */
    const int srcA = 4 * (2 * t4) + (g >> 1), srcB = 4 * (2 * t4 + 1) + (g >> 1);
    const bool hi_half = (g & 1) != 0;

    const int chunk0 = kbeg < kend ? (kbeg & ~15) : kend;
    /* can a step hold a key that one row masks and another sees? (warp-uniform; not when every
     * row has the same range and there is no block-sparse pattern: the usual decode) */
    const bool mixed = __any_sync(0xffffffffu, P.bs_block > 0 || (rvv[1] && (rlo[1] != kbeg || rhi[1] != kend)) ||
                                                   (rvv[2] && (rlo[2] != kbeg || rhi[2] != kend)));
    constexpr int TURN = 16 * SUB;
    for (int jt = chunk0 + TURN * warp; jt < kend; jt = kend - jt > TURN * NW ? jt + TURN * NW : kend) {
        dec_regs<D, F8> rr[SUB];
#pragma unroll
        for (int h = 0; h < SUB; h++) { /* every load of the turn before the first use */
            if constexpr (F8)
                dec_load_step8<D>(P, table, jt + 16 * h, kbeg, kend, g, t4, head_off, kc8, vc8, rr[h]);
            else
                dec_load_step<KC, VW, NT>(P, table, jt + 16 * h, kbeg, kend, g, t4, head_off, kc, vc, rr[h].k,
                                          rr[h].v);
        }
#pragma unroll
        for (int h = 0; h < SUB; h++) {
        const int jb = jt + 16 * h;
        if (jb >= kend) break;
        auto &kr = rr[h].k;
        auto &vr = rr[h].v;
        /* fp8: a code the fast forms get wrong anywhere in the warp's step: element by element */
        bool ex = false;
        if constexpr (F8) {
            uint32_t sp = 0;
#pragma unroll
            for (int T = 0; T < 2; T++)
#pragma unroll
                for (int cc = 0; cc < D / 64; cc++)
#pragma unroll
                    for (int w = 0; w < 4; w++) f8_special<CD, BF>(sp, word4(kr[T][cc], w));
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int w = 0; w < D / 32; w++) f8_special<CD, false>(sp, word4(vr[i][0], w));
            if (FK::smask || FV::smask) ex = __any_sync(0xffffffffu, (sp & 0x80808080u) != 0u);
        }

        /* S^T = K Q^T: c0 (key jb + g, row 2t4), c1 (.., 2t4 + 1), c2/c3 key jb + 8 + g */
        float sc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int ks = 0; ks < D / 16; ks++) {
            uint32_t a[4];
            if constexpr (F8) {
                const uint32_t x0 = word4(kr[0][ks >> 2], ks & 3), x1 = word4(kr[1][ks >> 2], ks & 3);
                a[0] = f8_pair<CD, BF>(x0, 0u, F8_SEL_LO, ex);
                a[1] = f8_pair<CD, BF>(x1, 0u, F8_SEL_LO, ex);
                a[2] = f8_pair<CD, BF>(x0, 0u, F8_SEL_HI, ex);
                a[3] = f8_pair<CD, BF>(x1, 0u, F8_SEL_HI, ex);
            } else {
                const uint4 &r0 = kr[0][ks >> 1], &r1 = kr[1][ks >> 1];
                const bool h1 = (ks & 1) != 0;
                a[0] = h1 ? r0.z : r0.x, a[1] = h1 ? r1.z : r1.x, a[2] = h1 ? r0.w : r0.y, a[3] = h1 ? r1.w : r1.y;
            }
            const uint32_t b[2] = {qb[ks][0], qb[ks][1]};
            mma16816(sc, a, b, BF);
        }
        float x[4];
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int i = 1 + (e & 1); /* row 2t4 + (e & 1) */
            const int j = jb + g + 8 * (e >> 1);
            float v = -INFINITY;
            if (j >= rlo[i] && j < rhi[i] && blocksparse_visible(P, rh[i], rp[i], j))
                v = logit(P, code_dot_scaled(P, F8 ? sc[e] * kratio : sc[e]), rh[i], rp[i], j);
            x[e] = v;
        }
        bool fix = false;
        if (mixed) { /* a masked key in range, and a NaN or inf in this step's V? */
            bool mk = false, bad = false;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int j = jb + g + 8 * (e >> 1);
                mk |= x[e] == -INFINITY && j >= kbeg && j < kend;
            }
            if (__any_sync(0xffffffffu, mk)) {
                if constexpr (F8) { /* E4M3: NaN codes; E5M2: infinities and NaNs (the bf16 forms' test) */
                    uint32_t sp = 0;
#pragma unroll
                    for (int i = 0; i < 4; i++)
#pragma unroll
                        for (int w = 0; w < D / 32; w++) f8_special<CD, true>(sp, word4(vr[i][0], w));
                    bad = (sp & 0x80808080u) != 0u;
                } else {
#pragma unroll
                    for (int i = 0; i < 4; i++)
#pragma unroll
                        for (int w = 0; w < VW; w++)
                            bad |= nonfinite2(vr[i][w].x, BF) || nonfinite2(vr[i][w].y, BF) ||
                                   nonfinite2(vr[i][w].z, BF) || nonfinite2(vr[i][w].w, BF);
                }
                fix = __any_sync(0xffffffffu, bad);
            }
        }
        uint16_t p16[4], plo[4]; /* fp8: P = p16 + plo (f16 each), see the kernel's comment */
        float p32[4];
#pragma unroll
        for (int r = 0; r < 2; r++) { /* row 2t4 + r: x[r] (key g), x[2 + r] (key g + 8) */
            float mx = fmaxf(x[r], x[2 + r]);
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
            /* lazy rescale: the row's reference maximum moves (and O and l are rescaled) only
             * when a logit exceeds it by more than ln 256, so most steps skip the D/4 multiplies;
             * the weights stay <= 256, well inside f16 and bf16 (the prefill tiles do the same) */
            const float m_new = fmaxf(m[r], mx);
            if (m_new > m[r] + DEC_LAZY_LN) {
                const float alpha = expf(m[r] - m_new); /* 0 when m was -inf or m_new is +inf */
                l[r] *= alpha;
#pragma unroll
                for (int n = 0; n < MT; n++) o[n][r] *= alpha, o[n][2 + r] *= alpha;
                m[r] = m_new;
            }
            const float p0 = x[r] == -INFINITY ? 0.f : expf(x[r] - m[r]);
            const float p1 = x[2 + r] == -INFINITY ? 0.f : expf(x[2 + r] - m[r]);
            l[r] += p0 + p1;
            p16[r] = f32_to_16(p0, VB);
            p16[2 + r] = f32_to_16(p1, VB);
            if (F8) {
                p32[r] = p0, p32[2 + r] = p1;
                plo[r] = f32_to_16(p0 - f16_to_32(p16[r], false), false);
                plo[2 + r] = f32_to_16(p1 - f16_to_32(p16[2 + r], false), false);
            }
        }
        uint32_t pb[2], pl[2];
        dec_p_frag(p16, srcA, srcB, hi_half, pb);
        if (F8) dec_p_frag(plo, srcA, srcB, hi_half, pl); /* the low parts alike */
        if (fix) {
            /* the step's V (key x dim, as loaded) and probabilities (key x row, -0 = masked)
             * through this warp's shared scratch, then plain FMAs that skip masked entries */
            uint16_t *fv = sh_fv[warp];
            float *fp = sh_fp[warp];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                uint16_t *dst = fv + (2 * t4 + (i & 1) + 8 * (i >> 1)) * D + NT * g;
                if constexpr (F8) { /* the f16 forms, element by element */
#pragma unroll
                    for (int e = 0; e < NT; e++) dst[e] = f8_form1<CD, false>(word4(vr[i][0], e >> 2) >> (8 * (e & 3)));
                } else {
#pragma unroll
                    for (int w = 0; w < VW; w++) *(uint4 *)(dst + 8 * w) = vr[i][w];
                }
            }
#pragma unroll
            for (int e = 0; e < 4; e++)
                fp[(g + 8 * (e >> 1)) * 8 + 2 * t4 + (e & 1)] =
                    x[e] == -INFINITY ? -0.f : F8 ? p32[e] : f16_to_32(p16[e], VB);
            __syncwarp();
#pragma unroll 1
            for (int k = 0; k < 16; k++) {
                const float p0 = fp[k * 8 + 2 * t4], p1 = fp[k * 8 + 2 * t4 + 1];
                const bool u0 = !(p0 == 0.f && signbit(p0)), u1 = !(p1 == 0.f && signbit(p1));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    const uint32_t w = *(const uint32_t *)(fv + k * D + NT * g + 2 * mt);
                    const float v0 = f16_to_32(w, VB), v1 = f16_to_32(w >> 16, VB);
                    if (u0) o[mt][0] = fmaf(p0, v0, o[mt][0]), o[mt][2] = fmaf(p0, v1, o[mt][2]);
                    if (u1) o[mt][1] = fmaf(p1, v0, o[mt][1]), o[mt][3] = fmaf(p1, v1, o[mt][3]);
                }
            }
            __syncwarp(); /* read before the next step's writes */
            continue;
        }
        /* O^T += V^T P^T: A row g of m-tile mt = real dim NT g + 2 mt, row g + 8 = that + 1 */
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            uint32_t a[4];
            if constexpr (F8) { /* byte 2 mt (rows g) and 2 mt + 1 (rows g + 8) of each key's dims */
                const int w = mt >> 1, b = 2 * (mt & 1);
                const uint32_t x0 = word4(vr[0][0], w), x1 = word4(vr[1][0], w);
                const uint32_t x2 = word4(vr[2][0], w), x3 = word4(vr[3][0], w);
                a[0] = f8_pair<CD, false>(x0, x1, f8_sel2(b), ex);
                a[1] = f8_pair<CD, false>(x0, x1, f8_sel2(b + 1), ex);
                a[2] = f8_pair<CD, false>(x2, x3, f8_sel2(b), ex);
                a[3] = f8_pair<CD, false>(x2, x3, f8_sel2(b + 1), ex);
            } else {
                const int q = mt >> 2, cpt = mt & 3;
                uint32_t wv[4];
#pragma unroll
                for (int i = 0; i < 4; i++) wv[i] = word4(vr[i][q], cpt);
                a[0] = (wv[0] & 0xffffu) | (wv[1] << 16), a[1] = (wv[0] >> 16) | (wv[1] & 0xffff0000u);
                a[2] = (wv[2] & 0xffffu) | (wv[3] << 16), a[3] = (wv[2] >> 16) | (wv[3] & 0xffff0000u);
            }
            mma16816(o[mt], a, pb, VB);
            if (F8) mma16816(o[mt], a, pl, VB);
        }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 4);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 8);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 16);
    }
    /* o[mt][r] = O[row 2t4 + r][NT g + 2 mt], o[mt][2 + r] = O[row 2t4 + r][NT g + 2 mt + 1] */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            /* fp8: the forms' ratio first (exact), then v_scale, as decode_kernel rounds */
            *(float2 *)&sh_acc[warp][2 * t4 + r][NT * g + 2 * mt] =
                F8 ? make_float2(o[mt][r] * vratio * P.v_scale, o[mt][2 + r] * vratio * P.v_scale)
                   : make_float2(o[mt][r], o[mt][2 + r]);
        }
    if (g == 0) {
        sh_w[warp][2 * t4] = m[0], sh_w[warp][2 * t4 + 1] = m[1];
        sh_l[warp][2 * t4] = l[0], sh_l[warp][2 * t4 + 1] = l[1];
    }
    __syncthreads();
    dec_merge_store<D, NW, 8, AS>(P, sh_acc, sh_w, sh_l, sh_fin, nr, it.row0, hk, s, q0, ns, it.split);
}

/* The decode kernel for (head size, cache dtype), or NULL when it has none. */
typedef void (*dec_fn)(const pa_cu_attn_params);
template <int D>
dec_fn dec_pick_dtype(int cd)
{
    switch (cd) {
    case PA_DTYPE_F16: return decode_kernel<D, PA_DTYPE_F16>;
    case PA_DTYPE_BF16: return decode_kernel<D, PA_DTYPE_BF16>;
    case PA_DTYPE_FP8_E4M3: return decode_kernel<D, PA_DTYPE_FP8_E4M3>;
    case PA_DTYPE_FP8_E5M2: return decode_kernel<D, PA_DTYPE_FP8_E5M2>;
    default: return nullptr;
    }
}
template <int D, int CD, bool QB>
dec_fn dec_pick_mma_cd(int variant)
{
    switch (variant) {
    case PA_CU_DEC_MMAT: return decode_mmat_kernel<D, CD, 1, QB>;
    case PA_CU_DEC_MMAT4: return decode_mmat_kernel<D, CD, 4, QB>;
    default: return nullptr;
    }
}
/* fp8 caches: one kernel whatever the mmat variant, 4 blocks per multiprocessor (128 registers,
 * ~110 bytes spilled): E4M3 64 x 4096 on an H200 0.506 ms against 0.584 ms
 * for 1 block (168 registers, 3 blocks fit) */
template <int D>
dec_fn dec_pick_mma(int variant, int cd, bool qbf)
{
    switch (cd) {
    case PA_DTYPE_F16: return dec_pick_mma_cd<D, PA_DTYPE_F16, false>(variant);
    case PA_DTYPE_BF16: return dec_pick_mma_cd<D, PA_DTYPE_BF16, true>(variant);
    case PA_DTYPE_FP8_E4M3:
        return qbf ? decode_mmat_kernel<D, PA_DTYPE_FP8_E4M3, 4, true> : decode_mmat_kernel<D, PA_DTYPE_FP8_E4M3, 4, false>;
    case PA_DTYPE_FP8_E5M2:
        return qbf ? decode_mmat_kernel<D, PA_DTYPE_FP8_E5M2, 4, true> : decode_mmat_kernel<D, PA_DTYPE_FP8_E5M2, 4, false>;
    default: return nullptr;
    }
}
/* The decode kernel of a layer and cache (never of a batch): tensor cores when q and the cache
 * share a 16-bit dtype, or over an fp8 cache with f16 or bf16 q whose rows start 16-byte
 * aligned (al16: block, token and head strides); else the SIMT decode kernel. */
dec_fn dec_pick(int head_size, int cd, int qd, int variant, bool al16)
{
    const bool f8 = cd == PA_DTYPE_FP8_E4M3 || cd == PA_DTYPE_FP8_E5M2;
    const bool mma16 = qd == cd && (cd == PA_DTYPE_F16 || cd == PA_DTYPE_BF16);
    const bool mma8 = f8 && al16 && (qd == PA_DTYPE_F16 || qd == PA_DTYPE_BF16);
    if (variant != PA_CU_DEC_SIMT && (mma16 || mma8)) {
        if (head_size == 64) return dec_pick_mma<64>(variant, cd, qd == PA_DTYPE_BF16);
        if (head_size == 128) return dec_pick_mma<128>(variant, cd, qd == PA_DTYPE_BF16);
    }
    switch (head_size) {
    case 64: return dec_pick_dtype<64>(cd);
    case 128: return dec_pick_dtype<128>(cd);
    case 256: return dec_pick_dtype<256>(cd);
    default: return nullptr;
    }
}

typedef void (*attn_fn)(const pa_cu_attn_params);

/* The FlashAttention-2 style prefill kernel for (head size 64/128, dtype, layer features) and
 * the prefill variant (PAGEDATTN_CUDA_PREFILL), with its dynamic shared memory. */
typedef void (*fa_fn)(const pa_cu_attn_params);
struct fa_choice {
    fa_fn fn;
    size_t smem;
};
/* 32-key chunks: table entries a chunk ahead in registers (tbm 1: layers without per-element
 * features; not fa-ldg), else loaded per key */
template <int D>
fa_fn fa_pick_d(bool bf, bool feat, bool tb)
{
    if (tb && !feat) return bf ? attn_fa_kernel<D, true, false, 1> : attn_fa_kernel<D, false, false, 1>;
    return bf ? (feat ? attn_fa_kernel<D, true, true, 0> : attn_fa_kernel<D, true, false, 0>)
              : (feat ? attn_fa_kernel<D, false, true, 0> : attn_fa_kernel<D, false, false, 0>);
}
/* Head size 128 without per-element features: key offsets a chunk ahead in shared memory (tbm
 * 2) over 64-key chunks (fa, the default: 0.580 against 0.624 ms for 32-key chunks on an H200)
 * (fa; fa-st the same with per-element stores); everything else, and the fa32/fa-ldg variants:
 * 32-key chunks. */
fa_choice fa_choose(int head_size, bool bf, bool feat, int variant)
{
    if (head_size == 128 && !feat && (variant == PA_CU_PF_FA || variant == PA_CU_PF_FA_ST))
        return {bf ? attn_fa_kernel<128, true, false, 2, 64> : attn_fa_kernel<128, false, false, 2, 64>,
                fa_smem_bytes(128, 64)};
    const bool tb = variant != PA_CU_PF_FA_LDG;
    return {head_size == 64 ? fa_pick_d<64>(bf, feat, tb) : fa_pick_d<128>(bf, feat, tb), fa_smem_bytes(head_size, FA_BN)};
}
/* a layer feature that changes logits or masks per element (a property of the layer) */
bool fa_feat(const pa_cu_attn_params *p) { return p->softcap > 0.f || p->has_alibi || p->bs_block > 0; }

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
    /* the FlashAttention-2 style prefill tiles take 36-106 KB of shared memory; a device that
     * cannot give one of them its share runs the ldm tiles there (see pa_cu_attn_launch) */
    for (int d = 64; d <= 128; d += 64)
        for (int k = 0; k < 4; k++) /* dtype bf16 (bit 0), layer features (bit 1) */
            for (int v = 0; v < PA_CU_PF_COUNT; v++) {
                const fa_choice c = fa_choose(d, (k & 1) != 0, (k & 2) != 0, v);
                if (c.smem > 48 * 1024 && c.smem <= ctx->smem_optin)
                    PA_CU_TRY(cudaFuncSetAttribute((const void *)c.fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   (int)c.smem));
            }
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
    const bool mma = plan->mma_ok && p->q_dtype == p->cache_dtype &&
                     (p->cache_dtype == PA_DTYPE_F16 || p->cache_dtype == PA_DTYPE_BF16);
    /* The decode kernel takes the short-query tiles when the cache allows 8-element loads and
     * it has the head size and cache dtype; a property of the layer and cache, never of the
     * batch, so a sequence's bits never depend on what else is in the batch. */
    const bool from_cache = p->attn_type == PA_ATTN_DECODER || p->attn_type == PA_ATTN_ENCODER_DECODER;
    const dec_fn dec = from_cache && p->vec8 && p->tables && ctx->decode_variant != PA_CU_DEC_OFF
                           ? dec_pick(p->head_size, p->cache_dtype, p->q_dtype, ctx->decode_variant,
                                      p->c_block % 16 == 0 && p->c_token % 16 == 0 && p->c_head % 16 == 0)
                           : nullptr;
    const int64_t n_dec = dec ? plan->num_small : 0;
    const pa_cu_item *simt_items = plan->items + n_dec;
    const int64_t n_simt = (mma ? plan->num_small : plan->num_items) - n_dec;
    if (n_simt > INT32_MAX || plan->num_mitems > INT32_MAX || n_dec > INT32_MAX)
        return pa__fail(PA_STATUS_UNSUPPORTED, "cuda: %lld work items exceed one grid",
                        (long long)plan->num_items);
    if (n_dec > 0) {
        pa_cu_attn_params pd = *p;
        pd.items = plan->small_items;
        pd.dec_hfast = ctx->dec_heads_fast && n_dec * p->num_kv_heads <= INT32_MAX;
        dim3 grid = pd.dec_hfast ? dim3((unsigned)(n_dec * p->num_kv_heads)) : dim3((unsigned)n_dec, (unsigned)p->num_kv_heads);
        PA_CU_LAUNCH_PDL(ctx->pdl & PA_CU_PDL_ATTN, dec, grid, DEC_THREADS, 0, ctx->stream, pd);
        PA_CU_CHECK_LAUNCH("decode kernel");
    }
    if (n_simt > 0) {
        pa_cu_attn_params ps = *p;
        ps.items = simt_items;
        dim3 grid((unsigned)n_simt, (unsigned)p->num_kv_heads);
        PA_CU_LAUNCH_PDL(ctx->pdl & PA_CU_PDL_ATTN, b->fn, grid, PA_CU_WARPS * 32, plan->smem_bytes, ctx->stream, ps);
        PA_CU_CHECK_LAUNCH("attention kernel");
    }
    if (mma && plan->num_mitems > 0) {
        pa_cu_attn_params pm = *p;
        pm.items = plan->mitems;
        pm.fa_o16 = ctx->prefill_variant != PA_CU_PF_FA_ST;
        dim3 grid((unsigned)plan->num_mitems, (unsigned)p->num_kv_heads);
        const int v = ctx->prefill_variant;
        const bool bf = p->cache_dtype == PA_DTYPE_BF16;
        fa_choice fc = fa_choose(p->head_size, bf, fa_feat(p), v);
        /* a device without the 64-key chunks' ~106 KB (sm_86: 99 KB) takes the 32-key ones */
        if (fc.smem > ctx->smem_optin) fc = fa_choose(p->head_size, bf, fa_feat(p), PA_CU_PF_FA32);
        if (v != PA_CU_PF_LDM && p->vec8 && fc.smem <= ctx->smem_optin) {
            /* FlashAttention-2 style tiles: 4 warps x 32 rows */
            PA_CU_LAUNCH_PDL(ctx->pdl & PA_CU_PDL_ATTN, fc.fn, grid, 128, fc.smem, ctx->stream, pm);
        } else {
            /* the first tensor-core tiles: 8 warps x 16 rows */
            if (p->head_size == 64) PA_CU_LAUNCH_PDL(ctx->pdl & PA_CU_PDL_ATTN, (attn_mma_kernel<64>), grid, 256, 0, ctx->stream, pm);
            else PA_CU_LAUNCH_PDL(ctx->pdl & PA_CU_PDL_ATTN, (attn_mma_kernel<128>), grid, 256, 0, ctx->stream, pm);
        }
        PA_CU_CHECK_LAUNCH("tensor-core attention kernel");
    }
    if (plan->num_comb > 0) {
        dim3 grid((unsigned)plan->num_comb, (unsigned)p->num_heads);
        PA_CU_LAUNCH_PDL(ctx->pdl & PA_CU_PDL_COMB, combine_kernel, grid, 128, 0, ctx->stream, *p);
        PA_CU_CHECK_LAUNCH("split-combine kernel");
    }
    return PA_STATUS_OK;
}
