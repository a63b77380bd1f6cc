/*
 * cpu.h: what the files of the cpu backend share (kernel table, thread pool, plan, context).
 *
 * Algorithm. One "item" = one sequence x one or more KV heads x up to CPU_ROWS query rows x one
 * KV chunk. The item's query rows (every query head of its KV heads, times a tile of tokens) are
 * converted to fp32 and pre-scaled; keys are walked in tiles: each tile's K and V rows are read
 * once per KV head and serve every query head that shares it (GQA-aware); scores S = Q K^T,
 * soft-cap, ALiBi and the mask, an online-softmax update, O += P V (FlashAttention-2).
 *  - Prefill tiles (16 tokens x 4 heads, say) convert K (transposed) and V into fp32 scratch once
 *    and run register-blocked outer-product kernels over it.
 *  - Decode tiles (one token: a few rows per KV head) take all KV heads of the sequence in one
 *    item, so each cache block is read front to back across its heads, and read K and V straight
 *    from the cache, converting in registers.
 * Long key ranges are cut into chunks at fixed multiples of a chunk size that depends only on the
 * sequence's own query and key lengths; chunked rows are merged by LSE in chunk order afterwards,
 * so results are bitwise identical for any thread count and any batch around the sequence. A
 * plan serves every layer of its geometry, so it follows causality, not a layer's window: forward
 * passes over the chunks the layer's window hides from a whole tile. Prompts of 1024 tokens or
 * more, whose tiles already give the threads work, are not cut, shorter ones into at most 1024 /
 * query_len chunks, decodes into at most 128 (cpu_plan.c).
 */
#ifndef PAGEDATTN_CPU_H
#define PAGEDATTN_CPU_H

#include "internal.h"

#include <float.h>
#include <pthread.h>
#include <stdatomic.h>

#define CPU_ROWS 128 /* max query rows (heads x tokens) of one item */
#define CPU_KT 64   /* keys per tile (at most) */
#define CPU_KROWS 256 /* rows of the K and V tile scratch: keys per tile x KV heads per item */
#define CPU_DPAD 16 /* head_size is padded to a multiple of this in the fp32 scratch */
/* The prefill QK kernels (qk_t, qk_t_bf16) keep one fp32 accumulator per (row, key) over a whole
 * head; they sum the head in chunks of CPU_QK_CHUNK dims, each from zero, the chunk sums of each
 * group of CPU_QK_GROUP chunks into a group sum (kept in a scratch beside the accumulators), and
 * add the group sums to the running total in S, in order. The rounding error of a sequential fp32
 * sum grows with its length, and on sharp rows the scores' errors reach the output: one chain over
 * 512 dims erred 5x more than the reference's tolerance allowed (a random sweep found it, grid row
 * "long-head"); chunks of 64 added straight to the total still erred 1.1x over it at head 136 with
 * scaled fp8 keys (grid row "sharp-fp8"; 32: 0.59x, 16: 0.50x, the generic kernel's 8 chains and
 * tree 0.38x), and chunks of 16 1.05x at head 512 (32 chunk sums in one chain; grid row
 * "sharp-512": 0.51x with groups of 4, generic 0.54x). Chains of 16, 4 and d / 64: cost nothing
 * measurable against chunks alone (bench/NOTES.md, thirty-fourth pass). Heads of at most 16 dims
 * are one chain. */
#define CPU_QK_CHUNK 16
#define CPU_QK_GROUP 4
/* Around a kernel with a group scratch: gcc 12 cannot see that each group's first chunk writes
 * the scratch before the group's other chunks read it (-Wmaybe-uninitialized) */
#if defined(__GNUC__) && !defined(__clang__)
#  define PA__QK_GROUP_SCRATCH_BEGIN                                                               \
      _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#  define PA__QK_GROUP_SCRATCH_END _Pragma("GCC diagnostic pop")
#else
#  define PA__QK_GROUP_SCRATCH_BEGIN
#  define PA__QK_GROUP_SCRATCH_END
#endif

/* ---- ISA kernels -------------------------------------------------------------------------- */

/* How many kernel calls ahead a decode prefetches by default (pa__cpu_kernels.decode_pf), on
 * Zen 4 (into L2: cpu_backend.c, decode_prefetch), and at most. Overridable for experiments. */
#ifndef CPU_DECODE_PF
#  define CPU_DECODE_PF 1
#endif
#ifndef CPU_DECODE_PF_ZEN4
#  define CPU_DECODE_PF_ZEN4 2
#endif
#define CPU_DECODE_PF_MAX 4
_Static_assert(CPU_DECODE_PF >= 1 && CPU_DECODE_PF <= CPU_DECODE_PF_MAX, "decode prefetch distance");
_Static_assert(CPU_DECODE_PF_ZEN4 >= 1 && CPU_DECODE_PF_ZEN4 <= CPU_DECODE_PF_MAX, "decode prefetch distance");

/* Rows a decode kernel call should prefetch for the next one: n rows of `bytes` each. */
typedef struct pa__cpu_pf {
    const void *const *rows;
    int n, bytes;
    bool l2; /* into L2 (PREFETCHT1) instead of at locality CPU_KPFL: pa__cpu_kernels.decode_pf_l2 */
} pa__cpu_pf;

#ifndef CPU_KPFL
#  define CPU_KPFL 3 /* locality of the decode kernels' prefetches (where not l2) */
#endif

/* One decode prefetch of the line at a: PREFETCHT1 where l2, else locality CPU_KPFL. */
static inline __attribute__((always_inline)) void pf_line(uintptr_t a, bool l2)
{
    if (l2) __builtin_prefetch((const void *)a, 0, 2);
    else __builtin_prefetch((const void *)a, 0, CPU_KPFL);
}

/* Prefetches rows [i0, i1) of pf (every 64-byte line they touch). The decode kernels call it a
 * few rows at a time from inside their loops, so the next call's rows stream in while this one
 * computes, instead of one burst of misses before the call. Always inlined (gcc deletes a call
 * to a function whose only effect is __builtin_prefetch). */
static inline __attribute__((always_inline)) void pf_rows(const pa__cpu_pf *pf, int i0, int i1)
{
    if (!pf) return;
    if (i1 > pf->n) i1 = pf->n;
    for (int i = i0; i < i1; i++) {
        uintptr_t a = (uintptr_t)pf->rows[i] & ~(uintptr_t)63, e = (uintptr_t)pf->rows[i] + (uintptr_t)pf->bytes;
        for (; a < e; a += 64) pf_line(a, pf->l2);
    }
}

/* A cursor over the 64-byte lines of pf's rows, for a kernel that prefetches them a line or two
 * at a time from its innermost loop: even spacing keeps the core's few L1 miss buffers busy
 * without the bursts that stall on them (Intel cores, 16 buffers: a burst of 64 prefetches
 * before a PV chunk held the core until most of them had come back). */
typedef struct pa__cpu_pfc {
    const pa__cpu_pf *pf; /* NULL: nothing (left) */
    int i;                /* current row */
    uintptr_t a, e;       /* next line, end of the row */
} pa__cpu_pfc;

static inline __attribute__((always_inline)) pa__cpu_pfc pfc_init(const pa__cpu_pf *pf)
{
    pa__cpu_pfc c = {NULL, 0, 0, 0};
    if (pf && pf->n > 0) {
        c.pf = pf;
        c.a = (uintptr_t)pf->rows[0] & ~(uintptr_t)63;
        c.e = (uintptr_t)pf->rows[0] + (uintptr_t)pf->bytes;
    }
    return c;
}

/* Lines per step for a cursor over pf spread over `steps` steps of a kernel's loop: pf's lines
 * (where its rows are 64-byte aligned; one more per row at most otherwise, which the kernel's
 * final pfc_step(c, -1) takes) over the steps, rounded up; 0 without steps. */
static inline int pfc_per(const pa__cpu_pf *pf, int steps)
{
    const int lines = pf ? pf->n * ((pf->bytes + 63) / 64) : 0;
    return steps > 0 ? (lines + steps - 1) / steps : 0;
}

/* The next k lines (k < 0: all that are left). */
static inline __attribute__((always_inline)) void pfc_step(pa__cpu_pfc *c, int k)
{
    for (; k != 0 && c->pf; k--) {
        pf_line(c->a, c->pf->l2);
        c->a += 64;
        if (c->a >= c->e) {
            if (++c->i >= c->pf->n) {
                c->pf = NULL;
                break;
            }
            c->a = (uintptr_t)c->pf->rows[c->i] & ~(uintptr_t)63;
            c->e = (uintptr_t)c->pf->rows[c->i] + (uintptr_t)c->pf->bytes;
        }
    }
}

/* Locality of the prefill kernels' prefetches: the rows of the next step, asked for while a
 * qk_t or pv call computes. 2 (PREFETCHT1): measured faster than 3 for f32 prefill, and equal
 * for bf16; 3 (into L1) competes with the tiles the kernels are working on. */
#ifndef CPU_PPFL
#  define CPU_PPFL 2
#endif

/* The share of pf that units [u0, u1) of `total` take: rows [u0 * n / total, u1 * n / total)
 * (NULL stays NULL: an empty part). */
static inline pa__cpu_pf pf_range(const pa__cpu_pf *pf, int u0, int u1, int total)
{
    pa__cpu_pf r = {NULL, 0, 0, false};
    if (pf && total > 0) {
        r.l2 = pf->l2;
        int a = (int)((int64_t)u0 * pf->n / total), b = (int)((int64_t)u1 * pf->n / total);
        r.rows = pf->rows + a;
        r.n = b - a;
        r.bytes = pf->bytes;
    }
    return r;
}

/* The part [g * n / ng, (g + 1) * n / ng) of pf, for group g of ng (NULL stays NULL). */
static inline pa__cpu_pf pf_part(const pa__cpu_pf *pf, int g, int ng)
{
    return pf_range(pf, g, g + 1, ng);
}

/* Prefetches part g of ng of pf (every line of its rows) at locality CPU_PPFL: a prefill kernel
 * calls it once per block of its work, g = 0 .. ng - 1, so the rows arrive spread over the call
 * instead of in one burst (which stalls on the miss buffers as long as the loads it replaces). */
static inline __attribute__((always_inline)) void pf_share(const pa__cpu_pf *pf, int g, int ng)
{
    if (!pf) return;
    pa__cpu_pf r = pf_part(pf, g, ng);
    for (int i = 0; i < r.n; i++) {
        uintptr_t a = (uintptr_t)r.rows[i] & ~(uintptr_t)63, e = (uintptr_t)r.rows[i] + (uintptr_t)r.bytes;
        for (; a < e; a += 64) __builtin_prefetch((const void *)a, 0, CPU_PPFL);
    }
}

/* The hot loops; the generic table is always filled, ISA files override entries. All fp32
 * buffers are 64-byte aligned, rows dp (multiple of CPU_DPAD) floats apart. */
/* The tables' soft-cap (softcap_rows): tanh(y) = y + y^3 P(y^2) for |y| < 0.5, P's
 * coefficients from y^15's down (the odd Taylor series of tanh; truncation below 1e-8
 * relative); beyond, (1 - e) / (1 + e) with e = exp(-2 |y|). */
#define PA__CPU_TANH_SERIES_N 7
static const float pa__cpu_tanh_series[PA__CPU_TANH_SERIES_N] = {
    -0.0014558344f, /* -929569/638512875 */
    0.0035921280f,  /* 21844/6081075 */
    -0.0088632355f, /* -1382/155925 */
    0.0218694885f,  /* 62/2835 */
    -0.0539682540f, /* -17/315 */
    0.1333333333f,  /* 2/15 */
    -0.3333333333f, /* -1/3 */
};

typedef struct pa__cpu_kernels {
    const char *name;
    /* dst[i][0..d) = convert(rows[i][0..d)) for i < n, dst[i][d..dp) = 0. dtype: any. */
    void (*load_rows)(pa_dtype dtype, const void *const *rows, int n, int d, int dp, float *dst);
    /* S[r * lds + c] = dot(Q[r], K[c]) over dp for r < nr, c < nc. */
    void (*qk)(const float *q, int nr, const float *k, int nc, int dp, float *s, int lds);
    /* Max of s[0..n) (-inf for all -inf); NaN if some s[i] is NaN. */
    float (*row_max)(const float *s, int n);
    /* s[i] = exp(s[i] - m), and -0.0f where s[i] is -inf (the mark of a masked key, apart from
     * a visible one whose weight underflowed to +0); returns the sum. m finite. */
    float (*exp_row)(float *s, int n, float m);
    /* Optional (NULL: the driver's scalar loop on the bits). Whether some s[r * lds + c], r < nr,
     * c < nc, is -inf: a visible key's logit of -inf (an infinite q or k value) before the
     * driver masks the hidden keys (score_fix, PA__CPU_NEG_INF_LOGIT). nc <= CPU_KT. */
    bool (*any_neg_inf)(const float *s, int lds, int nr, int nc);
    /* Optional (NULL: the driver's scalar loop, cap * tanhf(s / cap)). s[r * lds + c] = cap *
     * tanh(s / cap) for r < nr, c < nc, within ~2 fp32 ulps of tanh; NaN stays NaN, +-inf
     * becomes +-cap. nc <= CPU_KT. */
    void (*softcap_rows)(float *s, int lds, int nr, int nc, float cap);
    /* Optional (NULL: row_max and exp_row row by row). One tile's online-softmax step for nr
     * rows none of which is marked bad or sees no key of the tile (hidden keys' scores -inf):
     * with mx the maximum of s[r * lds + 0..nc) and mn = (mx > m[r] ? mx : m[r]),
     * alpha[r] = (m[r] == mn ? 1 : m[r] == -inf ? 0 : expf(m[r] - mn)), the row's s = exp_row's
     * values and l[r] = l[r] * alpha[r] + exp_row's sum, m[r] = mn: bit for bit what the
     * driver's loop computes with this table's row_max and exp_row. Returns false, having written nothing, when some mx is NaN, +inf or -inf (the
     * driver's loop takes those rows), and may for widths it does not take (the AVX2 table:
     * nc not a multiple of 8); takes every other tile whose nc is a multiple of 16. */
    bool (*softmax_rows)(float *s, int lds, int nr, int nc, float *m, float *l, float *alpha);
    /* O[r][0..dp) = O[r] * alpha[r] + sum_{c < nc, colmask == NULL or colmask[c]} P[r][c] V[c].
     * A listed column may hold masked entries (-0) for some rows; the ISA kernels multiply them
     * (a no-op for finite V), so the driver sends a tile where such a column has a NaN or inf in
     * V to pa__cpu_pv_masked instead (a masked key must never reach the row). pf (NULL: none):
     * rows the driver reads next (the next tile's K rows), prefetched by pf_share over the call. */
    void (*pv)(const float *p, int ldp, int nr, const float *v, int nc, int dp,
               const float *alpha, const unsigned char *colmask, float *o, const struct pa__cpu_pf *pf);
    /* Optional (NULL: load_rows, then pv). pv over fp32 V rows where they lie (vrows[c]: key c's
     * row, dp == d), for tiles whose V the driver would otherwise copy to scratch unchanged (an
     * f32 cache, or f32 rows of the step's own keys); the same sums in the same order as pv. */
    void (*pv_rows)(const float *p, int ldp, int nr, const void *const *vrows, int nc, int dp,
                    const float *alpha, const unsigned char *colmask, float *o, const struct pa__cpu_pf *pf);
    /* Optional (NULL: load_rows + qk). Prefill tiles: kt[j * CPU_KT + i] = convert(rows[i][j])
     * (transposed, zero for j >= d and for i in [n, n rounded up to 16)); then
     * S[r][c] = dot(Q[r], K[c]) as outer products (no horizontal sums); S columns up to nc
     * rounded up to 16 are written. pf (NULL: none): rows to prefetch over the call, as for pv
     * (the driver passes this tile's V rows). */
    void (*load_rows_t)(pa_dtype dtype, const void *const *rows, int n, int d, int dp, float *kt);
    void (*qk_t)(const float *q, int nr, const float *kt, int nc, int dp, float *s, int lds,
                 const struct pa__cpu_pf *pf);
    /* Optional (NULL: convert to scratch with load_rows, then qk / pv). The same products
     * straight from the cache rows, converting in registers; only for head_size % 16 == 0
     * (so dp == d) and short tiles (decode). pf (NULL: none) names the rows that the next call
     * will read; a table with pf_spread set prefetches them itself, spread over its loops, and
     * the driver prefetches them in one sweep before the call otherwise. */
    void (*qk_src)(pa_dtype dtype, const void *const *krows, int nc, const float *q, int nr, int dp,
                   float *s, int lds, const struct pa__cpu_pf *pf);
    void (*pv_src)(pa_dtype dtype, const void *const *vrows, int nc, const float *p, int ldp, int nr,
                   int dp, const float *alpha, const unsigned char *colmask, float *o,
                   const struct pa__cpu_pf *pf);
    /* Optional (NULL: qk_src and pv_src for head sizes that are multiples of 16 only). The same
     * for a head size d that is not: each cache row's d values are read and nothing after them
     * (AVX-512: the last d % 16 by masked loads); q and o rows dp apart, q zero past d, o's dims past d
     * scaled by alpha as the others are (the driver keeps them 0). Entries of their own rather
     * than a d for qk_src and pv_src: those instances beside the others made the fp8 decode at
     * head size 128 2-5% slower (AVX-512; bench/NOTES.md, forty-fourth pass). The driver keeps
     * the other direct kernels (the bf16 dot products, qk_src_pairs) to multiples of 16. */
    void (*qk_src_tail)(pa_dtype dtype, const void *const *krows, int nc, const float *q, int nr, int d, int dp,
                        float *s, int lds, const struct pa__cpu_pf *pf);
    void (*pv_src_tail)(pa_dtype dtype, const void *const *vrows, int nc, const float *p, int ldp, int nr, int d,
                        int dp, const float *alpha, const unsigned char *colmask, float *o,
                        const struct pa__cpu_pf *pf);
    /* The head sizes qk_src_tail and pv_src_tail take: multiples of this (AVX-512: 1, any, by
     * masked loads; AVX2: 8, its kernels' steps, which end where such a row ends). Others go
     * through converted copies. */
    int tail_align;
    /* Optional (NULL: qk_src). Decode QK by bf16 dot products, for bf16 queries over bf16 key
     * rows: S[r * lds + c] = scale * dot(Q16[r], K[c]) over dp, Q16 the query rows as given
     * (unscaled bf16, dp apart, zero past d). Products exact, sums fp32. pf as for qk_src. */
    void (*qk_src_bf16)(const void *const *krows, int nc, const uint16_t *q16, int nr, int dp, float scale,
                        float *s, int lds, const struct pa__cpu_pf *pf);
    /* With qk_src_bf16 (and the E4M3 / E5M2 forms below). Copies the nr bf16 query rows at
     * rows[r] (d each) to q16 (dp apart, zero past d) for those kernels and says whether bf16
     * dot products, which take subnormal operands as zero and flush subnormal sums, give them
     * the contract's scores: no element subnormal, inf or NaN (the fp32 kernels take such rows
     * exactly), and, where the keys may hold subnormals (bf16 keys; fp8 keys become normal
     * bf16), what flushing those can take from a score, at most |scale| d max|q| 2^-126, within
     * 2^-36: the weights exp(s - m) then move by 2^-36 of themselves at most, far below an fp32
     * ulp. An independent oracle found the flushed operands (bench/NOTES.md, thirty-sixth pass). */
    bool (*q16_load)(const void *const *rows, int nr, int d, int dp, uint16_t *q16, float scale,
                     bool subnormal_keys);
    /* Optional (NULL: qk_src_pairs or qk_src). Decode QK by bf16 dot products for bf16 queries
     * over E4M3 key rows (AVX512-BF16), as qk_src_bf16 (q16 as given): each key value converted
     * exactly to bf16 in registers, a NaN byte giving a NaN score. dp a multiple of
     * qk_e4m3_bf16_dims; any nr, but the driver calls it only from qk_e4m3_bf16_rows rows. */
    void (*qk_src_e4m3_bf16)(const void *const *krows, int nc, const uint16_t *q16, int nr, int dp, float scale,
                             float *s, int lds, const struct pa__cpu_pf *pf);
    /* Where qk_src_e4m3_bf16 pays: from this many query rows per KV head (up to 8, the direct
     * decode rows over E4M3), and for head sizes that are multiples of e4m3_bf16_dims. The f16
     * conversion (7, 32: GQA 7-8 only) or byte tables (AVX512-VBMI; 1, 16: any GQA, any head
     * size the decode kernels take). */
    int qk_e4m3_bf16_rows;
    int qk_e4m3_bf16_dims;
    /* Query rows per KV head up to which decode tiles over f16 and over fp8 caches take qk_src
     * and pv_src (0: 8; bf16 and f32 caches: 16). Above them a tile goes through converted
     * copies, not transposed where the item holds more KV heads than CPU_KROWS / CPU_KT: a
     * speculative step of 3 tokens at GQA 4 over f16 took 1.7x the time of one over bf16 (an
     * audit, forty-third pass; bench/NOTES.md). */
    int direct_rows_f16, direct_rows_fp8;
    /* Optional (NULL: qk_src). The same for E5M2 key rows (byte tables, AVX512-VBMI): an
     * infinite key value gives an infinite or NaN score as in fp32; any nr, dp a multiple of 16. */
    void (*qk_src_e5m2_bf16)(const void *const *krows, int nc, const uint16_t *q16, int nr, int dp, float scale,
                             float *s, int lds, const struct pa__cpu_pf *pf);
    /* Optional (NULL: qk_src). qk_src for bf16 or E4M3 key rows with the query rows pair-split
     * (pa__cpu_pair_split: each pair_span dims stored as the even ones, then the odd ones; the
     * driver takes this kernel only where dp is a multiple of pair_span), so that one load of
     * pair_span bf16 values (32 or 64 bytes) becomes fp32 by one shift (even dims) and one AND
     * (odd dims) instead of two zero-extends and two shifts. E4M3 keys become such bf16 words first
     * (pa__e4m3_to_bf16x16: 2^-120 times their value, exactly), so for dtype PA__CPU_E4M3B
     * (tables with e4m3_bf16) the caller passes the pair-split query rows times 2^120 (PA__CPU_E4M3_UP; pa__cpu_e4m3_up_ok says
     * when that is exact): every product, and so every score, is the one of the unscaled
     * values. */
    void (*qk_src_pairs)(pa_dtype dtype, const void *const *krows, int nc, const float *q, int nr, int dp,
                         float *s, int lds, const struct pa__cpu_pf *pf);
    /* Dims per group of qk_src_pairs' split query rows: 16 (AVX2: 8-lane vectors), 32 (AVX-512). */
    int pair_span;
    /* Optional (NULL: pa__cpu_pair_split, then a loop for mul). The pair split of q[0 .. n) in
     * groups of span dims (n a multiple of span, span a multiple of 16 up to 64), each value then
     * times mul (1: left as it is). */
    void (*pair_split)(float *q, size_t n, int span, float mul);
    /* Optional (NULL: qk_t). Prefill QK by bf16 dot products, bf16 queries over bf16 keys: kt2
     * is the tile as 32-bit pairs of bf16, transposed (load_rows_t of the key rows read as f32
     * words: kt2[w * CPU_KT + i] = pair w of key i, zero for w >= d / 2 and i in [n, n16));
     * S[r][c] = scale * dot(Q16[r], K[c]) for c < nc rounded up to 16. d even. pf as for qk_t. */
    void (*qk_t_bf16)(const uint16_t *q16, int nr, const uint32_t *kt2, int nc, int dp, float scale, float *s,
                      int lds, const struct pa__cpu_pf *pf);
    /* Optional (NULL: pv_src; AVX512-BF16). Decode PV by bf16 dot products over bf16 V rows:
     * pv_src's result with every probability rounded to bf16 first (the contract allows a
     * 16-bit value dtype's rounding there). vdpbf16ps takes subnormal operands as zero and
     * flushes subnormal results, so these kernels take only values where that cannot show:
     * each returns false, having written nothing, when some value it would multiply is nonzero
     * and below PA__CPU_BF16_TINY in magnitude, or is inf or NaN, or some probability is an
     * fp32 subnormal (a key more than 87.3 below its row's maximum; the caller then runs the
     * fp32 kernels). */
    bool (*pv_src_bf16)(const void *const *vrows, int nc, const float *p, int ldp, int nr, int dp,
                        const float *alpha, const unsigned char *colmask, float *o, const struct pa__cpu_pf *pf);
    /* Optional with pv_bf16 (NULL: load_rows + pv). Prefill PV by bf16 dot products: the tile
     * of n bf16 V rows as 32-bit pairs vt2[i * dp + j] = (V[2i][j], V[2i + 1][j]) (low half,
     * high half), zero for j >= d, for the odd last key's partner and for columns that colmask
     * (NULL: none) hides from every row; false as for pv_src_bf16 (the tile is then garbage). */
    bool (*load_v_pairs)(const void *const *rows, int n, int d, int dp, const unsigned char *colmask, uint32_t *vt2);
    /* O[r] = O[r] * alpha[r] (NULL: 1) + sum_c bf16(P[r][c]) V[c] over the tile's pairs; false,
     * having written nothing, where some probability is an fp32 subnormal (as pv_src_bf16). */
    bool (*pv_bf16)(const float *p, int ldp, int nr, const uint32_t *vt2, int nc, int dp, const float *alpha,
                    float *o, const struct pa__cpu_pf *pf);
    bool pf_spread;
    /* The decode's prefetches of the rows of its next kernel calls (direct tiles, every ISA):
     * decode_pf calls ahead (1 to CPU_DECODE_PF_MAX), into L2 (PREFETCHT1) where decode_pf_l2,
     * else into L1. Chosen by CPU, not by ISA path (cpu_backend.c, decode_prefetch). */
    int decode_pf;
    bool decode_pf_l2;
    /* qk_src_pairs (qk_src in a table without it) and pv_src take E4M3 key and value rows as
     * bf16 or f32 words 2^-120 times their value (dtype PA__CPU_E4M3B; for QK the caller passes
     * the query rows 2^120 times, see qk_src_pairs): exact, but E4M3 subnormals become f32
     * subnormal FMA operands, so the backend keeps this only where those are cheap (AMD; the
     * environment's PAGEDATTN_CPU_FP8 forces either way). */
    bool e4m3_bf16;
    /* qk_src and pv_src take E4M3 and E5M2 rows by AVX512-VBMI byte tables (PA__CPU_E4M3L,
     * PA__CPU_E5M2L; pa__cpu_kernels_init_avx512's lut). */
    bool fp8_lut;
    /* pv_src and pv_src_tail take E4M3 and E5M2 value rows by the byte tables while qk_src keeps
     * the keys as e4m3_bf16 words (PAGEDATTN_CPU_FP8=mixed; pa__cpu_kernels_init_avx512's lut): the
     * driver passes V rows as their fp8 dtype, not PA__CPU_E4M3B. */
    bool pv_fp8_lut;
    /* dst[0..d) = round(src[i] * mul) to dtype (f32, f16, bf16). */
    void (*store_row)(pa_dtype dtype, const float *src, int d, float mul, void *dst);
    /* The weights that exp_row and softmax_rows give are 2^p_exp exp(s - m) (0: exp(s - m)), so
     * that a key up to ~131 below its row's maximum weighs an fp32 normal: a subnormal weight
     * costs a microcode assist on Intel cores in every FMA that takes it (~6x for a decode whose
     * logits spread over more than 87, bench/NOTES.md, forty-first pass). The driver starts a
     * row's sum at 2^p_exp for a sink and scales o and l back by 2^-p_exp at its end (exact
     * wherever the unscaled ones are normal: the same bits); where a scaled sum overflowed (V
     * beyond ~2^64 / l) or came out NaN, it runs the item again with the unscaled weights. A
     * table that reads E4M3 V as words 2^-120 times their value (e4m3_bf16: AMD, whose cores
     * take subnormal operands at full speed) multiplies the weights by 2^120 for them, which
     * the scaled ones would overflow: it takes the unscaled weights throughout. */
    int p_exp;
    /* With p_exp: exp_row and softmax_rows with weights exp(s - m) (NULL: the generic
     * exp_row, no softmax_rows). */
    float (*exp_row_unscaled)(float *s, int n, float m);
    bool (*softmax_rows_unscaled)(float *s, int lds, int nr, int nc, float *m, float *l, float *alpha);
} pa__cpu_kernels;

void pa__cpu_kernels_init_generic(pa__cpu_kernels *k);

/* exp_row of the generic table: expf per score (-0 for -inf), unscaled (p_exp 0). */
float pa__cpu_exp_row_generic(float *s, int n, float m);

/* A dtype tag of the ISA files' decode kernels (never a layer's dtype): E4M3 rows converted
 * without the NaN fix-up (a NaN byte, S.1111.111, would come out finite): the AVX2 kernels take
 * it for rows that a scan before the call found free of NaN bytes, the AVX-512 ones test the
 * bytes as they convert them and redo the work with the fix-up where they find one. */
#define PA__CPU_E4M3F ((pa_dtype)(PA_DTYPE_COUNT_ + 1))

/* Tags of the decode kernels: E4M3 rows as bf16 words (pa__e4m3_to_bf16x16, 2^-120 times the
 * value; AVX-512 PV: f32 words). PA__CPU_E4M3B is what the driver passes (e4m3_bf16 tables only);
 * for rows with NaN bytes the kernels take PA__CPU_E4M3BN (with the NaN fix-up) or the f16 forms'
 * exact path: the AVX2 ones after a scan of each call's rows, the AVX-512 ones by a redo (as for
 * PA__CPU_E4M3F). */
#define PA__CPU_E4M3B ((pa_dtype)(PA_DTYPE_COUNT_ + 2))
#define PA__CPU_E4M3BN ((pa_dtype)(PA_DTYPE_COUNT_ + 3))
#define PA__CPU_E4M3_UP 0x1p120f

/* Tags of the AVX-512 decode kernels over fp8 rows by byte tables (AVX512-VBMI; the tables'
 * qk_src and pv_src take them in for PA_DTYPE_FP8_E4M3 and PA_DTYPE_FP8_E5M2 where
 * pa__cpu_kernels_init_avx512 installed them): each value exactly as f32, NaN as NaN. */
#define PA__CPU_E4M3L ((pa_dtype)(PA_DTYPE_COUNT_ + 4))
#define PA__CPU_E5M2L ((pa_dtype)(PA_DTYPE_COUNT_ + 5))

/* The smallest magnitude (but 0) of a V value that the bf16 dot-product kernels take (cpu.h,
 * pv_src_bf16): every product with a probability of at least 2^-36 is then an fp32 normal, so
 * what vdpbf16ps flushes (products below 2^-126, probabilities below 2^-126) adds up to at most
 * 2^-36 of the largest |V| per key. */
#define PA__CPU_BF16_TINY 0x1p-90f

/* Whether x[0..n) times 2^120 is exact (finite): every |x| below 2^7 (NaN and inf fail), i.e.
 * every magnitude's bits below 2^7's (0x43000000; inf and NaN are above). On the bits, in 16
 * lanes, so that the compiler vectorizes it: the float form (a branch per element, for NaN) ran
 * scalar and took ~10% of an E4M3 decode whose KV sat in L2 (bench/NOTES.md, twenty-eighth
 * pass). */
static inline bool pa__cpu_e4m3_up_ok(const float *x, size_t n)
{
    int32_t big[16] = {0}; /* (a signed compare: SSE2 has it, the baseline this file builds for) */
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) {
            int32_t u;
            memcpy(&u, x + i + j, sizeof u);
            big[j] |= (u & 0x7fffffff) >= 0x43000000;
        }
    int32_t any = 0;
    for (; i < n; i++) {
        int32_t u;
        memcpy(&u, x + i, sizeof u);
        any |= (u & 0x7fffffff) >= 0x43000000;
    }
    for (int j = 0; j < 16; j++) any |= big[j];
    return !any;
}

/* E4M3, with or without the NaN fix-up (f16 forms). */
static inline bool pa__cpu_is_e4m3(pa_dtype dt)
{
    return dt == PA_DTYPE_FP8_E4M3 || dt == PA__CPU_E4M3F;
}

/* Rows r < nr of q (dp apart, dp a multiple of span, span 16 or 32) rearranged in place for
 * qk_src_pairs: in every span dims, the span / 2 even dims first, then the odd ones. */
static inline __attribute__((always_inline)) void pa__cpu_pair_split_k(float *q, size_t n, const int span)
{
    const int half = span / 2;
    for (size_t j = 0; j + (size_t)span <= n; j += (size_t)span) {
        float *b = q + j, t[32];
        for (int i = 0; i < half; i++) t[i] = b[2 * i], t[half + i] = b[2 * i + 1];
        memcpy(b, t, (size_t)span * sizeof(float));
    }
}
/* (the spans as constants: with span a variable, the copy back was a call to memcpy per 16 or
 * 32 dims, 13% of a cache-resident decode of 64 sequences x 16 keys; bench/NOTES.md, forty-sixth
 * pass) */
static inline void pa__cpu_pair_split(float *q, int nr, int dp, int span)
{
    if (span == 16 && dp % 16 == 0) pa__cpu_pair_split_k(q, (size_t)nr * dp, 16);
    else if (span == 32 && dp % 32 == 0) pa__cpu_pair_split_k(q, (size_t)nr * dp, 32);
    else
        for (int r = 0; r < nr; r++) pa__cpu_pair_split_k(q + (size_t)r * dp, (size_t)dp, span);
}

/* The online softmax's rescale of a row's sums when its running maximum m becomes mn (>= m, not
 * -inf): the driver's loop and the tables' softmax_rows share it, so that both give one bit
 * pattern (softmax_rows, in the kernel table above). */
/* A rise of the running maximum beyond which e^(m - mn) is below fp32's normals: the driver's
 * loop then rescales o and l in two exact steps (cpu_attn.c), and the tables' softmax_rows
 * decline such tiles. */
#define PA__CPU_ALPHA_GAP 87.0f

/* The exponent of the scaled softmax weights (p_exp: 2^64 exp(s - m)) and how far below its
 * row's maximum a key still weighs an fp32 normal so (e^-131 2^64 = 2^-125); below, 0. */
#define PA__CPU_P_EXP 64
#define PA__CPU_FAR_LIMIT 131.0f

/* Whether a factor e^dm (dm = m - mn <= 0) lies below fp32's normals while 2^64 e^dm does not
 * (a rise of more than 87, up to 131; false for -inf and NaN): it is then applied in two exact
 * steps, pa__cpu_far_up(dm) and 2^-64. */
static inline bool pa__cpu_far(float dm)
{
    return dm < -PA__CPU_ALPHA_GAP && dm >= -PA__CPU_FAR_LIMIT;
}

static inline float pa__cpu_far_up(float dm)
{
    return (float)ldexp(exp((double)dm), PA__CPU_P_EXP);
}

static inline float pa__cpu_alpha(float m, float mn)
{
    return m == mn ? 1.0f : (m == -INFINITY ? 0.0f : expf(m - mn));
}

/* A visible key's logit of -inf, as the driver passes it to the softmax (score_fix): the lowest
 * finite float. A row whose maximum stays at it saw no key (write_row). */
#define PA__CPU_NEG_INF_LOGIT (-FLT_MAX)

/* A probability that marks a masked key (see exp_row): -0.0f. */
static inline bool pa__cpu_masked(float p)
{
    return p == 0.0f && signbit(p);
}

/* The generic pv (every table's fallback), which skips masked entries row by row: exact for any
 * V, NaN and inf included. */
void pa__cpu_pv_masked(const float *p, int ldp, int nr, const float *v, int nc, int dp,
                       const float *alpha, const unsigned char *colmask, float *o, const pa__cpu_pf *pf);
#if defined(__x86_64__) || defined(_M_X64)
#  define PA__CPU_X86 1
void pa__cpu_kernels_init_avx2(pa__cpu_kernels *k);
#  ifdef PAGEDATTN_HAVE_AVX512
/* rows12: pa__cpu_avx512_rows12; lut: the decode QK and PV over fp8 rows by AVX512-VBMI byte
 * tables (PA__CPU_LUT_ALL, or true), the PV only (PA__CPU_LUT_PV: pv_fp8_lut), or neither (0,
 * false); the CPU must have VBMI for either */
enum { PA__CPU_LUT_ALL = 1, PA__CPU_LUT_PV = 2 };
void pa__cpu_kernels_init_avx512(pa__cpu_kernels *k, bool rows12, int lut);
void pa__cpu_kernels_init_avx512bf16(pa__cpu_kernels *k, bool vbmi); /* vbmi: the CPU has AVX512-VBMI */
#  endif
#endif
#if defined(__aarch64__) || defined(_M_ARM64)
#  define PA__CPU_ARM64 1
void pa__cpu_kernels_init_neon(pa__cpu_kernels *k); /* arm/cpu_neon.c */
#endif

/* CPU features (x86: CPUID + XGETBV; AArch64: Advanced SIMD, part of every such CPU; other
 * machines: all false). */
typedef struct pa__cpu_features {
    bool avx2, fma, f16c, os_ymm;                       /* AVX2 path needs all four */
    bool avx512f, avx512bw, avx512vl, avx512bf16, os_zmm; /* AVX-512 path: f, bw, vl, os_zmm */
    bool avx512vbmi; /* byte permutes: the fp8 decode kernels' byte tables (both AVX-512 paths) */
    bool neon;                                          /* NEON path (AArch64) */
    /* x86 vendor AMD (or Hygon): its FP units take subnormal FMA operands at full speed (Zen 3
     * measured, bench/NOTES.md twenty-first pass), where Intel's call microcode assists */
    bool amd;
    int family; /* x86 display family (base + extended; 0x19 Zen 3 and 4, 0x1a Zen 5, 6 Intel) */
} pa__cpu_features;
void pa__cpu_detect(pa__cpu_features *f);
/* Whether the AVX-512 prefill kernels take 12 rows x 16 keys or dims (each query or probability
 * broadcast embedded in its one FMA) instead of 8 x 32: on Zen 4 only (cpu_backend.c). */
bool pa__cpu_avx512_rows12(const pa__cpu_features *f);

typedef enum {
    PA__ISA_GENERIC = 0,
    PA__ISA_AVX2 = 1,
    PA__ISA_AVX512 = 2,
    PA__ISA_AVX512BF16 = 3, /* the AVX-512 path plus bf16 dot products */
    PA__ISA_NEON = 4,
    PA__ISA_COUNT_ = 5
} pa__cpu_isa;
/* Whether the path is compiled in and this machine can run it. */
bool pa__cpu_isa_usable(pa__cpu_isa isa, const pa__cpu_features *f);
/* The path a context takes without PAGEDATTN_CPU_ISA: the widest usable one, except that
 * avx512bf16 is the default on AMD only (elsewhere avx512; cpu_backend.c says why). */
pa__cpu_isa pa__cpu_default_isa(const pa__cpu_features *f);
const char *pa__cpu_isa_name(pa__cpu_isa isa);

/* ---- thread pool -------------------------------------------------------------------------- */

/* fn(arg, index, thread) for every index < n, spread over the pool's threads (the caller is
 * thread 0). Returns when all are done. */
typedef void (*pa__cpu_task_fn)(void *arg, int64_t index, int thread);
typedef struct pa__cpu_pool pa__cpu_pool;
pa_status pa__cpu_pool_create(int nthreads, pa__cpu_pool **out);
void pa__cpu_pool_destroy(pa__cpu_pool *pool);
/* Whether the pool's workers live in this process (not in a forked child's: there it runs every
 * task on the calling thread) */
bool pa__cpu_pool_here(const pa__cpu_pool *pool);
void pa__cpu_pool_run(pa__cpu_pool *pool, int64_t n, pa__cpu_task_fn fn, void *arg);
/* The default thread count: online cores, within the affinity mask and the cgroup CPU quota. */
int pa__cpu_online_cores(void);
/* The CPUs the process's cgroup quota allows (rounded up; 0: no quota), from the files under
 * root ("" for this machine; tests pass a directory holding proc/self/cgroup and sys/fs/cgroup). */
int pa__cpu_cgroup_cpus(const char *root);

/* ---- context ------------------------------------------------------------------------------ */

/* Per-thread fp32 scratch of one item (sized for head_size padded to dp_cap). */
typedef struct pa__cpu_scratch {
    float *q;   /* [CPU_ROWS][dp] scaled queries */
    uint16_t *q16; /* [CPU_ROWS][dp] bf16 queries as given, zero past d (qk_src_bf16) */
    float *o;   /* [CPU_ROWS][dp] accumulators */
    float *k;   /* [CPU_KROWS][dp]: [KV head of the item][key of the tile][dp] */
    float *v;   /* [CPU_KROWS][dp] */
    float *s;   /* [CPU_ROWS][CPU_KT] scores, then probabilities */
    float m[CPU_ROWS], l[CPU_ROWS], alpha[CPU_ROWS];
    int64_t lo[CPU_ROWS], hi[CPU_ROWS], pos[CPU_ROWS];
    int32_t head[CPU_ROWS];
    unsigned char vis[CPU_ROWS];       /* 0 none, 1 all, 2 partial (per tile) */
    unsigned char bad[CPU_ROWS];       /* a visible score was NaN or +inf: the row is NaN */
    unsigned char colmask[CPU_KT];
    const void *rows[CPU_ROWS > CPU_KT ? CPU_ROWS : CPU_KT]; /* query rows, then key rows */
} pa__cpu_scratch;

typedef struct pa__cpu_ctx {
    pa__cpu_isa isa;
    pa__cpu_kernels kern;
    pa__cpu_kernels kern_exact;  /* kern with unscaled weights (p_exp 0): a rerun's (see p_exp) */
    pa__cpu_pool *pool;
    int32_t nthreads;
    int32_t dp_cap;              /* scratch sized for this padded head size */
    pa__cpu_scratch *scratch;    /* [nthreads] */
} pa__cpu_ctx;

/* Makes sure every thread's scratch holds head size dp (allocates; never called by forward). */
pa_status pa__cpu_ctx_reserve(pa__cpu_ctx *c, int32_t dp);

/* ---- plan --------------------------------------------------------------------------------- */

typedef struct pa__cpu_item {
    /* query rows r = (k * nt + t) * nh + hh for KV head kvh + k (k < nkv), token t0 + t and
     * query head h0 + k * group + hh; nkv > 1 only when nh is the whole group */
    int32_t seq, kvh, nkv, h0, nh, t0, nt;
    int64_t k0, k1;                   /* key chunk [k0, k1) */
    int64_t part;                     /* -1: rows finished here; else first partial row slot */
    int64_t cost;
} pa__cpu_item;

typedef struct pa__cpu_merge {
    int32_t seq, h0, nh, t0, nt, nkv; /* rows as in pa__cpu_item */
    int32_t nchunks;
    int64_t chunk; /* keys per chunk: chunk c is [c * chunk, (c + 1) * chunk) */
    int64_t part;  /* slots part + c * nrows + r for chunk c, row r */
} pa__cpu_merge;

typedef struct pa__cpu_plan {
    int64_t nitems, nmerges;
    pa__cpu_item *items;
    pa__cpu_merge *merges;
    int64_t npart_rows;
    float *part;  /* [npart_rows][dp + 2]: m, l, O */
    int32_t dp;
} pa__cpu_plan;

pa_status pa__cpu_plan_build(pa__cpu_ctx *c, const struct pa_layer *layer,
                             const struct pa_batch *batch, pa__cpu_plan **out);
void pa__cpu_plan_free(pa__cpu_plan *p);
pa_status pa__cpu_attend(pa__cpu_ctx *c, const pa__fwd *f, pa__cpu_plan *p);

static inline int32_t pa__cpu_dpad(int32_t d)
{
    return (d + CPU_DPAD - 1) / CPU_DPAD * CPU_DPAD;
}

#endif
