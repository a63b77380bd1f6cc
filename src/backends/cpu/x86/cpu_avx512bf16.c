/* cpu_avx512bf16.c: AVX512-BF16 dot products (vdpbf16ps), compiled with their own flags and
 * chosen at run time only where CPUID says AVX512_BF16 on top of the AVX-512 path's checks
 * (PAGEDATTN_CPU_ISA=avx512bf16). On top of the AVX-512 table it adds QK for bf16 queries over
 * bf16 keys (decode straight from the cache, prefill over the transposed tile) and over E4M3 keys
 * (decode; converted exactly to bf16 in registers, by byte tables where the CPU has AVX512-VBMI),
 * and PV over bf16 values (decode straight from the cache, prefill over the tile as key pairs).
 *
 * Numerics. QK: the queries are taken as given (bf16, unscaled) and the keys as stored, so every
 * product of two bf16 values is exact in fp32; vdpbf16ps adds them in fp32, and the layer's
 * scale multiplies the finished sums (the contract's s = scale * dot(q, k)). What differs from
 * the fp32 path is the order of the additions, and that the instruction treats bf16 subnormals
 * (below 2^-126) as zero. PV: each probability is rounded to bf16 (to nearest even), which the
 * contract allows for a 16-bit value dtype (the cuda backend's tensor cores do the same); the
 * products are exact and the sums fp32. Because vdpbf16ps also flushes subnormal products and
 * sums, the PV kernels scan every value they multiply and decline a call (the caller runs the
 * fp32 kernels) where one is nonzero below 2^-90, inf or NaN (cpu.h, PA__CPU_BF16_TINY).
 * Checked on the whole case grid under SIMDe (bench/check_avx512_simde.sh, whose vdpbf16ps takes
 * subnormals as zero and flushes as Intel documents) and natively on Intel Xeons (where
 * vdpbf16ps issues at half the FMA rate: bench/NOTES.md, twenty-fourth and twenty-sixth passes)
 * and on a Zen 5 EPYC (at about twice the FMA's flops; twenty-eighth pass) and a Zen 4 EPYC (at
 * twice the FMA's flops too, 230 GFLOP/s on one core; forty-eighth pass). */
#include "../cpu.h"
#include "cpu_avx512_util.h"

#include <immintrin.h>
#include <string.h>

AI __m512bh as_bh(__m512i x)
{
    __m512bh r;
    memcpy(&r, &x, sizeof r);
    return r;
}

/* n (1..32) 16-bit words at p, zeros after them */
AI __m512i ld_w(const void *p, int n)
{
    return n == 32 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16((__mmask32)(((uint64_t)1 << n) - 1), p);
}

AI __m256bh as_bh256(__m256i x)
{
    __m256bh r;
    memcpy(&r, &x, sizeof r);
    return r;
}

/* x in the low half, zeros above (vmovaps ymm: no shuffle) */
AI __m512 zext256(__m256 x)
{
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_setzero_pd(), _mm256_castps_pd(x), 0));
}

/* S[r][c0 .. c0 + KB) = scale * dot for the R rows at q: R x KB accumulators over 32-dim steps.
 * Where dp % 32 == 16 the last 16 dims go first, by 256-bit dot products whose sums start the
 * accumulators' low halves: a 512-bit step over them (half its lanes zero) costs Zen 4, whose
 * units are 256 bits wide, twice as much (bench/NOTES.md, fiftieth pass). */
AI void qkb_block(int R, int KB, const void *const *krows, int c0, const uint16_t *q, int dp, float scale,
                  float *s, int lds, pa__cpu_pfc *pc, int per)
{
    __m512 a[16];
    for (int i = 0; i < 16; i++) a[i] = _mm512_setzero_ps(); /* (store_scores may sum all 16) */
    const int df = dp / 32 * 32;
    if (df < dp) {
        __m256bh x[16];
        for (int u = 0; u < KB; u++)
            x[u] = as_bh256(_mm256_loadu_si256((const __m256i *)((const uint16_t *)krows[c0 + u] + df)));
        pfc_step(pc, per);
        for (int h = 0; h < R; h++) {
            const __m256bh w = as_bh256(_mm256_loadu_si256((const __m256i *)(q + (size_t)h * dp + df)));
            for (int u = 0; u < KB; u++) a[h * KB + u] = zext256(_mm256_dpbf16_ps(_mm256_setzero_ps(), w, x[u]));
        }
    }
    for (int j = 0; j < df; j += 32) {
        __m512bh x[16];
        for (int u = 0; u < KB; u++) x[u] = as_bh(_mm512_loadu_si512((const uint16_t *)krows[c0 + u] + j));
        pfc_step(pc, per);
        for (int h = 0; h < R; h++) {
            __m512bh w = as_bh(_mm512_loadu_si512(q + (size_t)h * dp + j));
            for (int u = 0; u < KB; u++) a[h * KB + u] = _mm512_dpbf16_ps(a[h * KB + u], w, x[u]);
        }
    }
    store_scores(R, KB, a, scale, s, lds, c0);
}

/* (blocks and prefetches as the AVX-512 twin, qkz_rows) */
AI void qkb_rows(int R, const void *const *krows, int nc, const uint16_t *q, int dp, float scale, float *s,
                 int lds, const pa__cpu_pf *pf)
{
    const int KB = qk_keys_per_block(R);
    pa__cpu_pfc pc = pfc_init(pf);
    const int per = pfc_per(pf, nc / KB * ((dp + 31) / 32));
    int c = 0;
    for (; c + KB <= nc; c += KB) qkb_block(R, KB, krows, c, q, dp, scale, s, lds, &pc, per);
    for (; c < nc; c++) qkb_block(R, 1, krows, c, q, dp, scale, s, lds, &pc, 0);
    pfc_step(&pc, -1);
}

/* ---- decode: QK for 5 to 8 query rows, two to a vector --------------------------------------
 * Above, each dot product leaves a vector of 16 partial sums per (row, key), and 16 such vectors
 * take a transpose-and-add tree of 45 shuffles and additions for their 16 scores (0.7 operations
 * beside each vdpbf16ps), and every 4 rows load the keys again. With 8 rows per KV head (GQA 8)
 * a vector here holds 16 dims (8 bf16 pairs) of each of two rows, one 256-bit half per row, and
 * a key's same 16 dims, broadcast to both halves by one load, serve all four row pairs: each
 * (row, key) ends as 8 partial sums in one half, 4 keys' sums for 8 rows come out of 42
 * operations (0.33 per dot product), and the keys are loaded once. Not for 4 rows (GQA 4): there
 * a broadcast serves two dot products only, and from DRAM the narrower loads ran 2% slower
 * (bench/NOTES.md, twenty-ninth pass). Each score's order is fixed: within each 128-bit block
 * lanes 0 + 2 and 1 + 3, then those two, then the two blocks of its half. */

/* qp[p * nt + t] = dims [16t, 16t + 16) of rows 2p and 2p + 1 (rows >= R: zero), p < 4, t < nt =
 * dp / 16 */
AI void pair_queries(int R, const uint16_t *q, int dp, __m512i *qp)
{
    const int nt = dp / 16;
    for (int p = 0; p < 4; p++)
        for (int t = 0; t < nt; t++) {
            const int h = 2 * p;
            const __m256i lo = h < R ? _mm256_loadu_si256((const __m256i *)(q + (size_t)h * dp + 16 * t))
                                     : _mm256_setzero_si256();
            const __m256i hi = h + 1 < R ? _mm256_loadu_si256((const __m256i *)(q + (size_t)(h + 1) * dp + 16 * t))
                                         : _mm256_setzero_si256();
            qp[p * nt + t] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        }
}

/* per 128-bit block of y[0..4): the block's sums of y0, y1, y2, y3 */
AI __m512 sum4_blocks(const __m512 *y)
{
    const __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(y[0], y[1]), _mm512_unpackhi_ps(y[0], y[1]));
    const __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(y[2], y[3]), _mm512_unpackhi_ps(y[2], y[3]));
    return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t1))),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t1))));
}

/* the first n (1..4) floats of 128-bit block h of x to p */
AI void store_block(__m512 x, int h, float *p, int n)
{
    const __m128 b = h == 0 ? _mm512_castps512_ps128(x)
                     : h == 1 ? _mm512_extractf32x4_ps(x, 1)
                     : h == 2 ? _mm512_extractf32x4_ps(x, 2)
                              : _mm512_extractf32x4_ps(x, 3);
    if (n == 4) _mm_storeu_ps(p, b);
    else _mm_mask_storeu_ps(p, (__mmask8)((1u << n) - 1), b);
}

/* 32 E4M3 values at p as bf16, exactly, 2^-8 times the value: the byte sign-extended and shifted
 * into an f16 (cpu_x86_fp8.h's f16 forms), two vcvtph2ps (which normalize the E4M3 subnormals:
 * as bf16 they are normal, so vdpbf16ps keeps them), one vcvtne2ps2bf16 (exact: 4 significant
 * bits). Without fix a NaN byte comes out finite and the bytes' low 7 bits go into seen (a
 * running maximum: 0x7f where one was a NaN); with fix it comes out NaN. */
AI __m512i e4m3_bf16x32(const char *p, bool fix, __m256i *seen)
{
    const __m256i raw = _mm256_loadu_si256((const __m256i *)p);
    if (!fix) *seen = _mm256_max_epu8(*seen, _mm256_and_si256(raw, _mm256_set1_epi8(0x7f)));
    __m512i h = _mm512_and_si512(_mm512_slli_epi16(_mm512_cvtepi8_epi16(raw), 7), _mm512_set1_epi16((short)0xbfff));
    if (fix) {
        const __mmask32 nan = _mm512_cmpeq_epi16_mask(_mm512_and_si512(h, _mm512_set1_epi16(0x7fff)),
                                                      _mm512_set1_epi16(0x3f80));
        h = _mm512_mask_blend_epi16(nan, h, _mm512_or_si512(h, _mm512_set1_epi16(0x7e00)));
    }
    const __m512 lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h)), hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
    __m512i r;
    const __m512bh b = _mm512_cvtne2ps_pbh(hi, lo);
    memcpy(&r, &b, sizeof r);
    return r;
}

/* S[h][c0 .. c0 + KB) for rows h < R (5..8; fewer work too), KB <= 4 keys. E: E4M3 keys (dp a
 * multiple of 32), converted 32 dims at a time by e4m3_bf16x32 (with fix, or testing for NaN
 * bytes into seen), each 16-dim half broadcast to both halves of a vector; the scores then come
 * out 2^-8 times (the caller's scale takes 2^8). */
AI void qkp_block(int R, int KB, bool E, bool fix, const void *const *krows, int c0, const __m512i *qp, int nt,
                  float scale, float *s, int lds, pa__cpu_pfc *pc, int per, __m256i *seen)
{
    __m512 a[16]; /* a[4 p + u]: row pair p, key u */
    for (int i = 0; i < 16; i++) a[i] = _mm512_setzero_ps();
    for (int t = 0; t < nt; t += E ? 2 : 1) {
        for (int u = 0; u < KB; u++) {
            if (E) {
                const __m512i z = e4m3_bf16x32((const char *)krows[c0 + u] + 16 * (size_t)t, fix, seen);
                const __m512bh k0 = as_bh(_mm512_shuffle_i32x4(z, z, 0x44)), k1 = as_bh(_mm512_shuffle_i32x4(z, z, 0xee));
                for (int p = 0; p < 4; p++) {
                    a[4 * p + u] = _mm512_dpbf16_ps(a[4 * p + u], as_bh(qp[p * nt + t]), k0);
                    a[4 * p + u] = _mm512_dpbf16_ps(a[4 * p + u], as_bh(qp[p * nt + t + 1]), k1);
                }
                continue;
            }
            const __m512bh k = as_bh(_mm512_broadcast_i64x4(
                _mm256_loadu_si256((const __m256i *)((const char *)krows[c0 + u] + 32 * (size_t)t))));
            for (int p = 0; p < 4; p++) a[4 * p + u] = _mm512_dpbf16_ps(a[4 * p + u], as_bh(qp[p * nt + t]), k);
        }
        pfc_step(pc, per);
    }
    __m512 w[4];
    for (int p = 0; p < 4; p++) {
        __m512 y[4];
        for (int u = 0; u < 4; u++) y[u] = u < KB ? a[4 * p + u] : _mm512_setzero_ps();
        w[p] = sum4_blocks(y); /* blocks 0, 1: row 2p's halves; 2, 3: row 2p + 1's */
    }
    const __m512 sc = _mm512_set1_ps(scale);
    for (int g = 0; g < 2; g++) {
        /* blocks 0 + 1 and 2 + 3 of w[2g], then of w[2g + 1]: rows 4g .. 4g + 3 */
        const __m512 v = _mm512_mul_ps(_mm512_add_ps(_mm512_shuffle_f32x4(w[2 * g], w[2 * g + 1], 0x88),
                                                     _mm512_shuffle_f32x4(w[2 * g], w[2 * g + 1], 0xdd)), sc);
        for (int h = 0; h < 4 && 4 * g + h < R; h++) store_block(v, h, s + (size_t)(4 * g + h) * lds + c0, KB);
    }
}

/* Returns, for E4M3 keys without fix, whether a NaN byte was among them (qkp_block) */
AI bool qkp_rows(int R, bool E, bool fix, const void *const *krows, int nc, const uint16_t *q, int dp, float scale,
                 float *s, int lds, const pa__cpu_pf *pf)
{
    __m512i qp[4 * 512 / 16];
    pair_queries(R, q, dp, qp);
    const int nt = dp / 16;
    pa__cpu_pfc pc = pfc_init(pf);
    const int per = pfc_per(pf, (nc + 3) / 4 * (E ? nt / 2 : nt));
    __m256i seen = _mm256_setzero_si256();
    int c = 0;
    for (; c + 4 <= nc; c += 4) qkp_block(R, 4, E, fix, krows, c, qp, nt, scale, s, lds, &pc, per, &seen);
    switch (nc - c) {
    case 3: qkp_block(R, 3, E, fix, krows, c, qp, nt, scale, s, lds, &pc, per, &seen); break;
    case 2: qkp_block(R, 2, E, fix, krows, c, qp, nt, scale, s, lds, &pc, per, &seen); break;
    case 1: qkp_block(R, 1, E, fix, krows, c, qp, nt, scale, s, lds, &pc, per, &seen); break;
    default: break;
    }
    pfc_step(&pc, -1);
    return E && !fix && _mm256_movemask_epi8(_mm256_cmpeq_epi8(seen, _mm256_set1_epi8(0x7f))) != 0;
}

/* The decode QK's rows: in groups of 8 by a row-pair kernel, PAIRS(R) for R = 5..8 rows, what
 * is left (1 to 4 rows) by a 4-row kernel, BLOCKS(R); each call's rows at qr, its scores at sr,
 * its share of the prefetch list at pp. (Two loops of the same shape: one loop with one switch
 * over both kernels ran 2-3% slower, cache-resident, at GQA 4 and 8; bench/NOTES.md,
 * twenty-ninth pass.) */
#define QK_ROW_GROUPS(PAIRS, BLOCKS)                                                                      \
    do {                                                                                                  \
        const int ng = (nr + 3) / 4;                                                                      \
        int r = 0;                                                                                        \
        for (; nr - r > 4; r += 8) {                                                                      \
            /* rows r .. r + 7 (or to nr): the prefetch parts of their two groups of 4 */                 \
            pa__cpu_pf part = pf_range(pf, r / 4, r / 4 + 2 < ng ? r / 4 + 2 : ng, ng);                   \
            const pa__cpu_pf *pp = pf ? &part : NULL;                                                     \
            const uint16_t *qr = q16 + (size_t)r * dp;                                                    \
            float *sr = s + (size_t)r * lds;                                                              \
            switch (nr - r < 8 ? nr - r : 8) {                                                            \
            case 8: PAIRS(8); break;                                                                      \
            case 7: PAIRS(7); break;                                                                      \
            case 6: PAIRS(6); break;                                                                      \
            default: PAIRS(5); break;                                                                     \
            }                                                                                             \
        }                                                                                                 \
        for (; r < nr; r += 4) {                                                                          \
            pa__cpu_pf part = pf_part(pf, r / 4, ng);                                                     \
            const pa__cpu_pf *pp = pf ? &part : NULL;                                                     \
            const uint16_t *qr = q16 + (size_t)r * dp;                                                    \
            float *sr = s + (size_t)r * lds;                                                              \
            switch (nr - r < 4 ? nr - r : 4) {                                                            \
            case 4: BLOCKS(4); break;                                                                     \
            case 3: BLOCKS(3); break;                                                                     \
            case 2: BLOCKS(2); break;                                                                     \
            default: BLOCKS(1); break;                                                                    \
            }                                                                                             \
        }                                                                                                 \
    } while (0)

/* bf16 keys: row pairs by qkp_rows, blocks by qkb_rows */
static void a5b_qk_src_bf16(const void *const *krows, int nc, const uint16_t *q16, int nr, int dp, float scale,
                            float *s, int lds, const pa__cpu_pf *pf)
{
#define PAIRS(R) qkp_rows(R, false, false, krows, nc, qr, dp, scale, sr, lds, pp)
#define BLOCKS(R) qkb_rows(R, krows, nc, qr, dp, scale, sr, lds, pp)
    QK_ROW_GROUPS(PAIRS, BLOCKS);
#undef PAIRS
#undef BLOCKS
}

/* ---- decode: QK for bf16 queries over E4M3 keys, 7 or 8 rows --------------------------------
 * With 7 or 8 query rows per KV head (GQA 7-8) the exact conversion of each E4M3 key to bf16
 * (e4m3_bf16x32: ~9 operations per 32 values) serves 8 rows' dot products, and vdpbf16ps halves
 * the multiplies of the fp32 path, which converts more cheaply (bf16 words 2^-120 times the
 * value) but for 4 rows at a time, twice at GQA 8. (At GQA 4 the same conversion with 4 rows per
 * key was 1-2% slower than the fp32 path, and at GQA 6, a row pair of zeros in every block, equal:
 * bench/NOTES.md, thirty-first pass.) NaN bytes as in the AVX-512 decode kernels (cpu_avx512.c,
 * e4m3_fast): the call made again with the fix-up where its keys held one. Rows in groups of 8
 * (any count works; the driver gives 7 or 8). The table's entry on CPUs without AVX512-VBMI;
 * with it, a5b_qk_src_e4m3_lut below. */
AI bool qke_src(bool fix, const void *const *krows, int nc, const uint16_t *q16, int nr, int dp, float scale,
                float *s, int lds, const pa__cpu_pf *pf)
{
    const int ng = (nr + 7) / 8;
    bool nan = false;
    for (int r = 0; r < nr && !nan; r += 8) {
        pa__cpu_pf part = pf_part(pf, r / 8, ng);
        const pa__cpu_pf *pp = pf ? &part : NULL;
        const uint16_t *qr = q16 + (size_t)r * dp;
        float *sr = s + (size_t)r * lds;
        switch (nr - r < 8 ? nr - r : 8) {
        case 8: nan = qkp_rows(8, true, fix, krows, nc, qr, dp, scale, sr, lds, pp); break;
        case 7: nan = qkp_rows(7, true, fix, krows, nc, qr, dp, scale, sr, lds, pp); break;
        case 6: nan = qkp_rows(6, true, fix, krows, nc, qr, dp, scale, sr, lds, pp); break;
        case 5: nan = qkp_rows(5, true, fix, krows, nc, qr, dp, scale, sr, lds, pp); break;
        case 4: nan = qkp_rows(4, true, fix, krows, nc, qr, dp, scale, sr, lds, pp); break;
        case 3: nan = qkp_rows(3, true, fix, krows, nc, qr, dp, scale, sr, lds, pp); break;
        case 2: nan = qkp_rows(2, true, fix, krows, nc, qr, dp, scale, sr, lds, pp); break;
        default: nan = qkp_rows(1, true, fix, krows, nc, qr, dp, scale, sr, lds, pp); break;
        }
    }
    return nan;
}

static void a5b_qk_src_e4m3(const void *const *krows, int nc, const uint16_t *q16, int nr, int dp, float scale,
                            float *s, int lds, const pa__cpu_pf *pf)
{
    if (qke_src(false, krows, nc, q16, nr, dp, scale * 256.0f, s, lds, pf))
        qke_src(true, krows, nc, q16, nr, dp, scale * 256.0f, s, lds, NULL);
}

/* ---- decode: QK for bf16 queries over E4M3 keys by byte tables (AVX512-VBMI) ----------------
 * Where the CPU has AVX512-VBMI (Zen 4 and 5, Intel from Ice Lake; not Cooper Lake, whose
 * avx512bf16 path keeps qke_src above) the E4M3 keys become bf16 by table lookups: two vpermi2b
 * over 128-entry tables give each byte's bf16 high byte (the sign ORed in after) and low byte,
 * exact for every code (4 significant bits; the subnormals normal in bf16, so vdpbf16ps keeps
 * them; S.1111.111 a quiet NaN), then the two are interleaved into the words a vdpbf16ps operand
 * needs: for 1 to 4 rows (qkb_block's blocking) by the two byte unpacks, which leave each
 * 128-bit block's first 8 values in one vector and its last 8 in the other, the query rows
 * permuted alike once per call (a vpermt2b for each vector in order was 4-11% slower over the
 * whole step); for 5 to 8 rows (qkp_block's row pairs) by one vpermt2b per 16-dim piece, which
 * puts it in both halves at no extra cost. 64 values take 5 operations (7 with the broadcasts),
 * against ~20 for e4m3_bf16x32 with its NaN test; nothing to test or redo: a NaN byte gives a
 * NaN product. The scores are those of the values themselves (no 2^-8). So it pays at every
 * GQA: one thread, 16 x 4096 from DRAM, GQA 4 7.72 -> 6.74 ms against the fp32 path (with the
 * unpacks: 6.4), GQA 8 14.19 -> 13.01 against qke_src (bench/NOTES.md, thirty-second pass).
 * Only these functions are compiled for VBMI (the target attribute), the table entry set only
 * where CPUID says it is there. */
#ifdef PA_SIMDE
#  define VBMI /* (bench/check_avx512_simde.sh: its intrinsics are plain C) */
#else
#  define VBMI __attribute__((target("avx512vbmi")))
#endif

/* The tables in registers, and the interleaves of the row pairs: b[i] words 16 i .. 16 i + 15 of
 * the 64 values in both halves (i < 4; index bit 6 picks the second operand, the high bytes). */
typedef struct {
    __m512i hi0, hi1, lo0, lo1, b[4];
} f8lut;

AI VBMI f8lut f8lut_init(const uint8_t *tab, bool bcast)
{
    f8lut t;
    t.hi0 = _mm512_load_si512(tab);
    t.hi1 = _mm512_load_si512(tab + 64);
    t.lo0 = _mm512_load_si512(tab + 128);
    t.lo1 = _mm512_load_si512(tab + 192);
    /* byte b of b[i]: the low byte of value v = (b / 2) % 16 + 16 i (index v) for even b, its
     * high byte (index 64 + v) for odd b */
    const __m512i b = _mm512_set_epi8(63, 62, 61, 60, 59, 58, 57, 56, 55, 54, 53, 52, 51, 50, 49, 48, 47, 46, 45, 44,
                                      43, 42, 41, 40, 39, 38, 37, 36, 35, 34, 33, 32, 31, 30, 29, 28, 27, 26, 25, 24,
                                      23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2,
                                      1, 0);
    const __m512i piece = _mm512_and_si512(_mm512_srli_epi16(b, 1), _mm512_set1_epi8(15));
    const __m512i odd = _mm512_and_si512(_mm512_slli_epi16(b, 6), _mm512_set1_epi8(0x40));
    for (int i = 0; i < 4; i++)
        t.b[i] = bcast ? _mm512_or_si512(_mm512_add_epi8(piece, _mm512_set1_epi8((char)(16 * i))), odd)
                       : _mm512_setzero_si512();
    return t;
}

/* the high and low bytes of the bf16 words of the 64 fp8 values in x */
AI VBMI void f8lut_bytes(const f8lut *t, __m512i x, __m512i *hi, __m512i *lo)
{
    *hi = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(t->hi0, x, t->hi1), x, _mm512_set1_epi8((char)0x80),
                                    0xf8); /* a | (b & c) */
    *lo = _mm512_permutex2var_epi8(t->lo0, x, t->lo1);
}

/* n (1..64) fp8 bytes at p, zeros after them (code 0: value 0 in both formats) */
AI __m512i ld_e4(const void *p, int n)
{
    return n == 64 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(((__mmask64)1 << n) - 1, p);
}

/* One step of qkl_block: m (16, 32, 48 or 64) dims into a. The key's words come as the byte
 * unpacks leave them (per 128-bit block: its first 8 values' words in x0, its last 8 in x1), so
 * the query rows come permuted alike (qu: qkl_rows) */
AI VBMI void qkl_step(int R, int KB, int m, const f8lut *t, const void *const *krows, int c0, const __m512i *qu, int j,
                      __m512 *a)
{
    for (int u = 0; u < KB; u++) {
        __m512i hi, lo;
        f8lut_bytes(t, ld_e4((const char *)krows[c0 + u] + j, m), &hi, &lo);
        const __m512bh x0 = as_bh(_mm512_unpacklo_epi8(lo, hi)), x1 = as_bh(_mm512_unpackhi_epi8(lo, hi));
        for (int h = 0; h < R; h++) {
            a[h * KB + u] = _mm512_dpbf16_ps(a[h * KB + u], as_bh(qu[2 * h]), x0);
            a[h * KB + u] = _mm512_dpbf16_ps(a[h * KB + u], as_bh(qu[2 * h + 1]), x1);
        }
    }
}

/* The last 32 or 16 dims (m) of a row, folded: the byte unpacks leave their words in blocks 0
 * and 1 (m 32) or 0 (m 16) of two vectors, which one 512-bit vector (m 32: blocks 0, 1 of x0,
 * then of x1) or one 256-bit half (m 16: block 0 of x0, then of x1) holds: the query rows come
 * folded alike (qkl_rows) */
AI __m512i fold_words(int m, __m512i x0, __m512i x1)
{
    if (m == 32) return _mm512_shuffle_i32x4(x0, x1, 0x44);
    const __m256i lo = _mm256_inserti128_si256(_mm512_castsi512_si256(x0), _mm512_castsi512_si128(x1), 1);
    return _mm512_castsi256_si512(lo);
}

/* qkl_step over the last m (16 or 32) dims, folded (fold_words), into accumulators still zero:
 * one 512-bit dot product per row and key instead of two (m 32), one 256-bit one (m 16); taken
 * first, so that the 256-bit sums start the accumulators (zext256) */
AI VBMI void qkl_first(int R, int KB, int m, const f8lut *t, const void *const *krows, int c0, const __m512i *qf,
                       int j, __m512 *a)
{
    for (int u = 0; u < KB; u++) {
        __m512i hi, lo;
        f8lut_bytes(t, ld_e4((const char *)krows[c0 + u] + j, m), &hi, &lo);
        const __m512i x = fold_words(m, _mm512_unpacklo_epi8(lo, hi), _mm512_unpackhi_epi8(lo, hi));
        for (int h = 0; h < R; h++) {
            if (m == 32) {
                a[h * KB + u] = _mm512_dpbf16_ps(a[h * KB + u], as_bh(qf[2 * h]), as_bh(x));
                continue;
            }
            const __m256bh q = as_bh256(_mm512_castsi512_si256(qf[2 * h]));
            a[h * KB + u] = zext256(_mm256_dpbf16_ps(_mm256_setzero_ps(), q, as_bh256(_mm512_castsi512_si256(x))));
        }
    }
}

/* S[h][c0 .. c0 + KB) for R (1..4) rows as qkb_block, the keys from E4M3 by the tables, 64
 * dims a step, a last m = 16 or 32 first (qkl_first), a last 48 last; qu[(s * 4 + h) * 2 + i]: row
 * h's permuted query words of step s (of a folded last step: qu[(s * 4 + h) * 2]) */
AI VBMI void qkl_block(int R, int KB, int m, const f8lut *t, const void *const *krows, int c0, const __m512i *qu,
                       int dp, float scale, float *s, int lds, pa__cpu_pfc *pc, int per)
{
    __m512 a[16];
    for (int i = 0; i < 16; i++) a[i] = _mm512_setzero_ps();
    const int df = dp - m; /* (m = dp % 64, a constant in each instance: qkl_rows) */
    if (m == 16 || m == 32) {
        qkl_first(R, KB, m, t, krows, c0, qu + df / 64 * 8, df, a);
        pfc_step(pc, per);
    }
    for (int j = 0; j < df; j += 64) {
        qkl_step(R, KB, 64, t, krows, c0, qu + j / 64 * 8, j, a);
        pfc_step(pc, per);
    }
    if (m == 48) {
        qkl_step(R, KB, 48, t, krows, c0, qu + df / 64 * 8, df, a);
        pfc_step(pc, per);
    }
    store_scores(R, KB, a, scale, s, lds, c0);
}

AI VBMI void qkl_rows(const uint8_t *tab, int R, const void *const *krows, int nc, const uint16_t *q, int dp,
                      float scale, float *s, int lds, const pa__cpu_pf *pf)
{
    const f8lut t = f8lut_init(tab, false);
    /* the query rows in the unpacks' order: words i of blocks of 8 in 16 (x0: first 8) */
    __m512i qu[512 / 64 * 8];
    const __m512i ia = _mm512_set_epi16(55, 54, 53, 52, 51, 50, 49, 48, 39, 38, 37, 36, 35, 34, 33, 32, 23, 22, 21, 20,
                                        19, 18, 17, 16, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i ib = _mm512_add_epi16(ia, _mm512_set1_epi16(8));
    for (int j = 0; j < dp; j += 64)
        for (int h = 0; h < 4; h++) {
            __m512i qa = _mm512_setzero_si512(), qb = _mm512_setzero_si512();
            if (h < R) {
                const uint16_t *qh = q + (size_t)h * dp + j;
                const int m = dp - j < 64 ? dp - j : 64;
                const __m512i q0 = ld_w(qh, m < 32 ? m : 32), q1 = m > 32 ? ld_w(qh + 32, m - 32) : _mm512_setzero_si512();
                qa = _mm512_permutex2var_epi16(q0, ia, q1);
                qb = _mm512_permutex2var_epi16(q0, ib, q1);
            }
            const int rest = dp - j;
            qu[(j / 64 * 4 + h) * 2] = rest == 16 || rest == 32 ? fold_words(rest, qa, qb) : qa; /* (qkl_first) */
            qu[(j / 64 * 4 + h) * 2 + 1] = qb;
        }
    const int KB = qk_keys_per_block(R);
    pa__cpu_pfc pc = pfc_init(pf);
    const int per = pfc_per(pf, nc / KB * ((dp + 63) / 64));
    /* one loop per last step (with the step a variable, the accumulators of a head size 96 went
     * through memory: the decode's QK took 1.5 times head size 128's; fiftieth pass) */
    int c = 0;
#define QKL_LOOP(M)                                                                                      \
    do {                                                                                                 \
        for (; c + KB <= nc; c += KB) qkl_block(R, KB, M, &t, krows, c, qu, dp, scale, s, lds, &pc, per); \
        for (; c < nc; c++) qkl_block(R, 1, M, &t, krows, c, qu, dp, scale, s, lds, &pc, 0);             \
    } while (0)
    switch (dp % 64) {
    case 16: QKL_LOOP(16); break;
    case 32: QKL_LOOP(32); break;
    case 48: QKL_LOOP(48); break;
    default: QKL_LOOP(0); break;
    }
#undef QKL_LOOP
    pfc_step(&pc, -1);
}

/* One step of qklp_block: np (1..4) 16-dim pieces from piece t0 into a */
AI VBMI void qklp_step(int R, int KB, int np, const f8lut *t, const void *const *krows, int c0, const __m512i *qp, int nt,
                       int t0, __m512 *a)
{
    for (int u = 0; u < KB; u++) {
        __m512i hi, lo;
        f8lut_bytes(t, ld_e4((const char *)krows[c0 + u] + 16 * (size_t)t0, 16 * np), &hi, &lo);
        for (int i = 0; i < np; i++) {
            const __m512bh k = as_bh(_mm512_permutex2var_epi8(lo, t->b[i], hi));
            for (int p = 0; 2 * p < R; p++) a[4 * p + u] = _mm512_dpbf16_ps(a[4 * p + u], as_bh(qp[p * nt + t0 + i]), k);
        }
    }
}

/* S[h][c0 .. c0 + KB) for rows h < R (5..8) as qkp_block, the keys from E4M3 by the tables, 64
 * dims a step, each 16-dim piece broadcast to both halves by its interleave */
AI VBMI void qklp_block(int R, int KB, const f8lut *t, const void *const *krows, int c0, const __m512i *qp, int nt,
                        float scale, float *s, int lds, pa__cpu_pfc *pc, int per)
{
    __m512 a[16]; /* a[4 p + u]: row pair p, key u */
    for (int i = 0; i < 16; i++) a[i] = _mm512_setzero_ps();
    int t0 = 0;
    for (; t0 + 4 <= nt; t0 += 4) {
        qklp_step(R, KB, 4, t, krows, c0, qp, nt, t0, a);
        pfc_step(pc, per);
    }
    switch (nt - t0) {
    case 3: qklp_step(R, KB, 3, t, krows, c0, qp, nt, t0, a); pfc_step(pc, per); break;
    case 2: qklp_step(R, KB, 2, t, krows, c0, qp, nt, t0, a); pfc_step(pc, per); break;
    case 1: qklp_step(R, KB, 1, t, krows, c0, qp, nt, t0, a); pfc_step(pc, per); break;
    default: break;
    }
    __m512 w[4];
    for (int p = 0; p < 4; p++) {
        __m512 y[4];
        for (int u = 0; u < 4; u++) y[u] = u < KB ? a[4 * p + u] : _mm512_setzero_ps();
        w[p] = sum4_blocks(y);
    }
    const __m512 sc = _mm512_set1_ps(scale);
    for (int g = 0; g < 2; g++) {
        const __m512 v = _mm512_mul_ps(_mm512_add_ps(_mm512_shuffle_f32x4(w[2 * g], w[2 * g + 1], 0x88),
                                                     _mm512_shuffle_f32x4(w[2 * g], w[2 * g + 1], 0xdd)), sc);
        for (int h = 0; h < 4 && 4 * g + h < R; h++) store_block(v, h, s + (size_t)(4 * g + h) * lds + c0, KB);
    }
}

AI VBMI void qklp_rows(const uint8_t *tab, int R, const void *const *krows, int nc, const uint16_t *q, int dp,
                       float scale, float *s, int lds, const pa__cpu_pf *pf)
{
    const f8lut t = f8lut_init(tab, true);
    __m512i qp[4 * 512 / 16];
    pair_queries(R, q, dp, qp);
    const int nt = dp / 16;
    pa__cpu_pfc pc = pfc_init(pf);
    const int per = pfc_per(pf, (nc + 3) / 4 * ((nt + 3) / 4));
    int c = 0;
    for (; c + 4 <= nc; c += 4) qklp_block(R, 4, &t, krows, c, qp, nt, scale, s, lds, &pc, per);
    switch (nc - c) {
    case 3: qklp_block(R, 3, &t, krows, c, qp, nt, scale, s, lds, &pc, per); break;
    case 2: qklp_block(R, 2, &t, krows, c, qp, nt, scale, s, lds, &pc, per); break;
    case 1: qklp_block(R, 1, &t, krows, c, qp, nt, scale, s, lds, &pc, per); break;
    default: break;
    }
    pfc_step(&pc, -1);
}

/* qkl_rows and qklp_rows, one function per row count. Inlined all into one (98 KB of code), gcc
 * kept some instances' accumulators in memory as well, storing them on every key: with the
 * folded last steps above, E4M3 decode at head size 128 ran 6-10% slower than before them,
 * L2-resident (bench/NOTES.md, fiftieth pass). */
#define QKL_ROWS(F, R)                                                                                   \
    static VBMI __attribute__((noinline)) void F##R##_lut(const uint8_t *tab, const void *const *krows, int nc, \
                                                       const uint16_t *q, int dp, float scale, float *s,  \
                                                       int lds, const pa__cpu_pf *pf)                     \
    {                                                                                                    \
        F(tab, R, krows, nc, q, dp, scale, s, lds, pf);                                                  \
    }
QKL_ROWS(qkl_rows, 1)
QKL_ROWS(qkl_rows, 2)
QKL_ROWS(qkl_rows, 3)
QKL_ROWS(qkl_rows, 4)
QKL_ROWS(qklp_rows, 5)
QKL_ROWS(qklp_rows, 6)
QKL_ROWS(qklp_rows, 7)
QKL_ROWS(qklp_rows, 8)
#undef QKL_ROWS

/* Any number of rows (QK_ROW_GROUPS): row pairs by qklp_rows, blocks by qkl_rows; the keys'
 * format by its table */
AI VBMI void qk_src_lut(const uint8_t *tab, const void *const *krows, int nc, const uint16_t *q16, int nr, int dp,
                        float scale, float *s, int lds, const pa__cpu_pf *pf)
{
#define PAIRS(R) qklp_rows##R##_lut(tab, krows, nc, qr, dp, scale, sr, lds, pp)
#define BLOCKS(R) qkl_rows##R##_lut(tab, krows, nc, qr, dp, scale, sr, lds, pp)
    QK_ROW_GROUPS(PAIRS, BLOCKS);
#undef PAIRS
#undef BLOCKS
}

static VBMI void a5b_qk_src_e4m3_lut(const void *const *krows, int nc, const uint16_t *q16, int nr, int dp, float scale,
                                     float *s, int lds, const pa__cpu_pf *pf)
{
    qk_src_lut(pa__e4m3_bf16_tab, krows, nc, q16, nr, dp, scale, s, lds, pf);
}

static VBMI void a5b_qk_src_e5m2_lut(const void *const *krows, int nc, const uint16_t *q16, int nr, int dp, float scale,
                                     float *s, int lds, const pa__cpu_pf *pf)
{
    qk_src_lut(pa__e5m2_bf16_tab, krows, nc, q16, nr, dp, scale, s, lds, pf);
}

/* ---- prefill: QK over the tile of bf16 pairs ------------------------------------------------ */

/* R rows x 16 KB keys from c0: one broadcast of a query pair (2 dims) per row and step; the head
 * in chunks of CPU_QK_CHUNK dims, their sums in groups (g), the group sums added to the
 * (unscaled) total in S, which the last chunk scales (cpu.h). */
PA__QK_GROUP_SCRATCH_BEGIN
AI void qktb_block(int R, int KB, const uint16_t *q, const uint32_t *kt2, int c0, int dp, float scale, float *s,
                   int lds)
{
    const int nw = dp / 2, cw = CPU_QK_CHUNK / 2;
    const __m512 sc = _mm512_set1_ps(scale);
    float g[12 * 16] __attribute__((aligned(64)));
    for (int w0 = 0; w0 < nw; w0 += cw) {
        const int w1 = nw - w0 > cw ? w0 + cw : nw;
        __m512 a[12];
        for (int i = 0; i < R * KB; i++) a[i] = _mm512_setzero_ps();
        for (int w = w0; w < w1; w++) {
            __m512bh k[2];
            for (int u = 0; u < KB; u++) k[u] = as_bh(_mm512_loadu_si512(kt2 + (size_t)w * CPU_KT + c0 + 16 * u));
            for (int i = 0; i < R; i++) {
                uint32_t qw;
                memcpy(&qw, q + (size_t)i * dp + 2 * w, sizeof qw);
                __m512bh b = as_bh(_mm512_set1_epi32((int)qw));
                for (int u = 0; u < KB; u++) a[i * KB + u] = _mm512_dpbf16_ps(a[i * KB + u], b, k[u]);
            }
        }
        const int c = w0 / cw;
        if (!qk_group_step(a, R * KB, g, c, w1 == nw)) continue;
        for (int i = 0; i < R; i++)
            for (int u = 0; u < KB; u++) {
                float *si = s + (size_t)i * lds + c0 + 16 * u;
                __m512 t = c >= CPU_QK_GROUP ? _mm512_add_ps(_mm512_loadu_ps(si), a[i * KB + u]) : a[i * KB + u];
                _mm512_storeu_ps(si, w1 == nw ? _mm512_mul_ps(t, sc) : t);
            }
    }
}
PA__QK_GROUP_SCRATCH_END

AI void qktb_rows(int R, const uint16_t *q, const uint32_t *kt2, int n16, int dp, float scale, float *s, int lds)
{
    int c0 = 0;
    for (; c0 + 32 <= n16; c0 += 32) qktb_block(R, 2, q, kt2, c0, dp, scale, s, lds);
    if (c0 < n16) qktb_block(R, 1, q, kt2, c0, dp, scale, s, lds);
}

static void a5b_qk_t_bf16(const uint16_t *q16, int nr, const uint32_t *kt2, int nc, int dp, float scale, float *s,
                          int lds, const pa__cpu_pf *pf)
{
    int n16 = (nc + 15) & ~15;
    for (int r = 0; r < nr; r += 6) {
        pf_share(pf, r / 6, (nr + 5) / 6); /* one share per 6 rows */
        const uint16_t *qr = q16 + (size_t)r * dp;
        float *sr = s + (size_t)r * lds;
        switch (nr - r < 6 ? nr - r : 6) {
        case 6: qktb_rows(6, qr, kt2, n16, dp, scale, sr, lds); break;
        case 5: qktb_rows(5, qr, kt2, n16, dp, scale, sr, lds); break;
        case 4: qktb_rows(4, qr, kt2, n16, dp, scale, sr, lds); break;
        case 3: qktb_rows(3, qr, kt2, n16, dp, scale, sr, lds); break;
        case 2: qktb_rows(2, qr, kt2, n16, dp, scale, sr, lds); break;
        default: qktb_rows(1, qr, kt2, n16, dp, scale, sr, lds); break;
        }
    }
}

/* ---- PV by bf16 dot products --------------------------------------------------------------- */

/* Every V value that the kernels multiply passes through here, 32 words at a time: mn keeps the
 * smallest |x| - 1 (so 0 wraps to 0xffff and drops out), mx the largest |x|. The values are
 * fit (cpu.h, pv_src_bf16) when no nonzero |x| is below PA__CPU_BF16_TINY (bf16 0x1280) and none
 * is inf or NaN (0x7f80 and up). */
#define BF16_TINY_BITS 0x1280
_Static_assert(BF16_TINY_BITS == (127 - 90) << 7, "PA__CPU_BF16_TINY (2^-90) as bf16 bits");

AI void scan_words(__m512i x, __m512i *mn, __m512i *mx)
{
    const __m512i y = _mm512_and_si512(x, _mm512_set1_epi16(0x7fff));
    *mn = _mm512_min_epu16(*mn, _mm512_sub_epi16(y, _mm512_set1_epi16(1)));
    *mx = _mm512_max_epu16(*mx, y);
}

/* cpu.h, q16_load: the rows copied 32 words at a time, each through scan_words on the way (a
 * separate pass over the rows, in scalar code, had cost a bf16 prefill 2.5%) */
static bool a5b_q16_load(const void *const *rows, int nr, int d, int dp, uint16_t *q16, float scale,
                         bool subnormal_keys)
{
    __m512i mn = _mm512_set1_epi32(-1), mx = _mm512_setzero_si512();
    for (int r = 0; r < nr; r++) {
        const uint16_t *q = rows[r];
        uint16_t *o = q16 + (size_t)r * dp;
        int i = 0;
        for (; i + 32 <= d; i += 32) { /* (whole vectors unmasked: Zen 5 ran the masked ones slowly) */
            const __m512i x = _mm512_loadu_si512(q + i);
            scan_words(x, &mn, &mx);
            _mm512_storeu_si512(o + i, x);
        }
        for (; i < dp; i += 32) {
            const int m = d - i > 0 ? d - i : 0, w = dp - i >= 32 ? 32 : dp - i;
            const __m512i x = _mm512_maskz_loadu_epi16(((__mmask32)1 << m) - 1, q + i);
            scan_words(x, &mn, &mx);
            uint16_t t[32]; /* (zero past d; through memory: SIMDe has no masked 16-bit store) */
            _mm512_storeu_si512(t, x);
            memcpy(o + i, t, (size_t)w * sizeof *t);
        }
    }
    /* (a zero's word wraps to 0xffff in mn and drops out; subnormals are 1 to 0x7f) */
    if (_mm512_cmplt_epu16_mask(mn, _mm512_set1_epi16(0x7f)) | _mm512_cmpge_epu16_mask(mx, _mm512_set1_epi16(0x7f80)))
        return false;
    uint16_t w[32];
    _mm512_storeu_si512(w, mx);
    uint16_t big = 0;
    for (int i = 0; i < 32; i++) big = w[i] > big ? w[i] : big;
    const uint32_t u = (uint32_t)big << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return !subnormal_keys || fabsf(scale) * (float)d * x <= 0x1p90f;
}

AI bool scan_fit(__m512i mn, __m512i mx)
{
    return !(_mm512_cmplt_epu16_mask(mn, _mm512_set1_epi16(BF16_TINY_BITS - 1)) |
             _mm512_cmpge_epu16_mask(mx, _mm512_set1_epi16(0x7f80)));
}

/* acc + dot products of the pairs of x with the pair at w, taken as the instruction's broadcast
 * memory operand ({1to16}): gcc 12 folds no broadcast into vdpbf16ps and keeps a vpbroadcastd
 * beside each, an extra operation per dot product in the 12-row prefill block, on a pipe that
 * llvm-mca's Zen 4 model shares with the arithmetic (eighth pass). PA_SIMDE: the intrinsics are
 * emulated (bench/check_avx512_simde.sh), so no assembly. */
AI __m512 dpbf16_bcst(__m512 acc, __m512bh x, const uint32_t *w)
{
#ifdef PA_SIMDE
    return _mm512_dpbf16_ps(acc, x, as_bh(_mm512_set1_epi32((int)*w)));
#else
    __asm__("vdpbf16ps %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(x), "m"(*w));
    return acc;
#endif
}

/* Probabilities tested for fp32 subnormals on their bits, two operations per vector: mn keeps
 * the smallest bits - 1 (unsigned, so +0 wraps to the top and drops out, as do -0 and the
 * normals), and a positive subnormal, bits 1 to 0x7fffff, leaves it at 0x7ffffe or below. */
AI __m512i subnormal_min(__m512i mn, __m512 x)
{
    return _mm512_min_epu32(mn, _mm512_sub_epi32(_mm512_castps_si512(x), _mm512_set1_epi32(1)));
}

/* Rows r < nr of the n listed probabilities (column idx[i] of row r of p; idx NULL: column i),
 * rounded to bf16 (vcvtne2ps2bf16: to nearest even) as pairs: pw[r * 32 + i] = (x[2i], x[2i+1]),
 * zero past n. n <= CPU_KT. False where some probability is an fp32 subnormal: vdpbf16ps would
 * take its bf16 as 0 (exp gives them for keys more than 87.3 below the row's maximum). */
AI bool probs_pairs(const float *p, int ldp, int nr, const int *idx, int n, uint32_t *pw)
{
    _Static_assert(CPU_KT == 64, "32 pair words per row");
    __m512i sub = _mm512_set1_epi32(-1);
    for (int r = 0; r < nr; r++) {
        const float *pr = p + (size_t)r * ldp;
        if (!idx) { /* the columns in order: straight from the row, zeros past n by the masks */
            for (int i = 0; i < n; i += 32) {
                const int left = n - i; /* 1..: the first vector takes up to 16, the second the rest */
                const int m0 = left >= 16 ? 16 : left, m1 = left >= 32 ? 16 : left > 16 ? left - 16 : 0;
                const __m512 a = _mm512_maskz_loadu_ps((__mmask16)((1u << m0) - 1), pr + i);
                const __m512 b = _mm512_maskz_loadu_ps((__mmask16)((1u << m1) - 1), pr + i + 16);
                sub = subnormal_min(subnormal_min(sub, a), b);
                __m512bh w = _mm512_cvtne2ps_pbh(b, a);
                memcpy(pw + (size_t)r * 32 + i / 2, &w, sizeof w);
            }
            continue;
        }
        float t[CPU_KT] __attribute__((aligned(64)));
        int i = 0;
        for (; i < n; i++) t[i] = pr[idx[i]];
        for (; i < (n + 31) / 32 * 32; i++) t[i] = 0.0f;
        for (i = 0; i < n; i += 32) {
            const __m512 a = _mm512_load_ps(t + i), c = _mm512_load_ps(t + i + 16);
            sub = subnormal_min(subnormal_min(sub, a), c);
            __m512bh b = _mm512_cvtne2ps_pbh(c, a);
            memcpy(pw + (size_t)r * 32 + i / 2, &b, sizeof b);
        }
    }
    return !_mm512_cmple_epu32_mask(sub, _mm512_set1_epi32(0x7ffffe));
}

/* o[h][0..16) = o[h] * a + x (a: alpha[h], or 1), or (stage) o[h] = x */
AI void pv_out(float *o, __m512 x, const float *alpha, int h, bool stage)
{
    if (stage) _mm512_store_ps(o, x);
    else _mm512_store_ps(o, _mm512_fmadd_ps(_mm512_load_ps(o), _mm512_set1_ps(alpha ? alpha[h] : 1.0f), x));
}

/* One key pair (rb NULL: key a alone, its partner zero) into the R x NV accumulators. Each row's
 * probability pair is broadcast once into a register for its NV dot products: as embedded
 * broadcasts (dpbf16_bcst) every dot product was a load too, 20 loads per 16 dot products at
 * NV 4, more than a Zen 5 core's two 512-bit loads per cycle feed (cache-resident decode 16 x
 * 4096 6.44 -> 6.19 ms; bench/NOTES.md, twenty-eighth pass). */
AI void pvb_pair(int R, int NV, bool SCAN, const char *ra, const char *rb, const uint32_t *pw, int i, __m512 *acc,
                 __m512i *mn, __m512i *mx)
{
    __m512bh x[16];
    for (int u = 0; u + 1 < NV; u += 2) {
        const __m512i a = _mm512_loadu_si512(ra + 32 * u);
        const __m512i b = rb ? _mm512_loadu_si512(rb + 32 * u) : _mm512_setzero_si512();
        if (SCAN) {
            scan_words(a, mn, mx);
            if (rb) scan_words(b, mn, mx);
        }
        x[u] = as_bh(_mm512_unpacklo_epi16(a, b));
        x[u + 1] = as_bh(_mm512_unpackhi_epi16(a, b));
    }
    if (NV & 1) {
        const int u = NV - 1;
        const __m512i a = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(ra + 32 * u)));
        const __m512i b = rb ? _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(rb + 32 * u)))
                             : _mm512_setzero_si512();
        const __m512i w = _mm512_or_si512(a, _mm512_slli_epi32(b, 16));
        if (SCAN) scan_words(w, mn, mx);
        x[u] = as_bh(w);
    }
    for (int h = 0; h < R; h++) {
        const __m512bh w = as_bh(_mm512_set1_epi32((int)pw[h * 32 + i]));
        for (int u = 0; u < NV; u++) acc[h * NV + u] = _mm512_dpbf16_ps(acc[h * NV + u], x[u], w);
    }
}

/* Decode, dims [j, j + 16 NV) of R rows (at o, dp apart) over the nv listed keys (idx) of the
 * cache rows vr, in key pairs: two 64-byte loads (32 dims of two keys) interleaved by vpunpck*wd
 * make two vectors of (key 2i, key 2i + 1) words for dims j + 8L + {0-3} and j + 8L + {4-7} of
 * 128-bit lane L; a 16-dim tail (odd NV) zero-extends and merges instead. The accumulators are
 * put back in dim order once at the end. SCAN: every loaded word through scan_words. */
AI void pvb_chunk(int R, int NV, bool SCAN, const void *const *vr, const int *idx, int nv, const uint32_t *pw,
                  int j, float *o, int dp, const float *alpha, bool stage, __m512i *mn, __m512i *mx,
                  pa__cpu_pfc *pc, int per)
{
    __m512 acc[16];
    for (int i = 0; i < R * NV; i++) acc[i] = _mm512_setzero_ps();
    int i = 0;
    for (; 2 * i + 1 < nv; i++) {
        pvb_pair(R, NV, SCAN, (const char *)vr[idx[2 * i]] + (size_t)2 * j,
                 (const char *)vr[idx[2 * i + 1]] + (size_t)2 * j, pw, i, acc, mn, mx);
        pfc_step(pc, per);
    }
    if (2 * i < nv) pvb_pair(R, NV, SCAN, (const char *)vr[idx[2 * i]] + (size_t)2 * j, NULL, pw, i, acc, mn, mx);
    const __m512i lo = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
    const __m512i hi = _mm512_set_epi32(31, 30, 29, 28, 15, 14, 13, 12, 27, 26, 25, 24, 11, 10, 9, 8);
    for (int h = 0; h < R; h++) {
        float *oh = o + (size_t)h * dp + j;
        for (int u = 0; u + 1 < NV; u += 2) {
            const __m512 e = acc[h * NV + u], d = acc[h * NV + u + 1];
            pv_out(oh + 16 * u, _mm512_permutex2var_ps(e, lo, d), alpha, h, stage);
            pv_out(oh + 16 * u + 16, _mm512_permutex2var_ps(e, hi, d), alpha, h, stage);
        }
        if (NV & 1) pv_out(oh + 16 * (NV - 1), acc[h * NV + NV - 1], alpha, h, stage);
    }
}

/* R rows (1..4) over all dims in chunks of up to 64 (4 R accumulators at most 16); pf's lines
 * prefetched one or two per key pair (pa__cpu_pfc). */
AI void pvb_rows(int R, bool SCAN, const void *const *vr, const int *idx, int nv, const uint32_t *pw, float *o,
                 int dp, const float *alpha, bool stage, __m512i *mn, __m512i *mx, const pa__cpu_pf *pf)
{
    pa__cpu_pfc pc = pfc_init(pf);
    const int per = pfc_per(pf, (dp / 16 + 3) / 4 * (nv / 2));
    for (int j = 0; j < dp;) {
        const int w = (dp - j) / 16 < 4 ? (dp - j) / 16 : 4;
        switch (w) {
        case 4: pvb_chunk(R, 4, SCAN, vr, idx, nv, pw, j, o, dp, alpha, stage, mn, mx, &pc, per); break;
        case 3: pvb_chunk(R, 3, SCAN, vr, idx, nv, pw, j, o, dp, alpha, stage, mn, mx, &pc, per); break;
        case 2: pvb_chunk(R, 2, SCAN, vr, idx, nv, pw, j, o, dp, alpha, stage, mn, mx, &pc, per); break;
        default: pvb_chunk(R, 1, SCAN, vr, idx, nv, pw, j, o, dp, alpha, stage, mn, mx, &pc, per); break;
        }
        j += 16 * w;
    }
    pfc_step(&pc, -1);
}

AI void pvb_group(int R, bool SCAN, const void *const *vr, const int *idx, int nv, const uint32_t *pw, float *o,
                  int dp, const float *alpha, bool stage, __m512i *mn, __m512i *mx, const pa__cpu_pf *pf)
{
    switch (R) {
    case 4: pvb_rows(4, SCAN, vr, idx, nv, pw, o, dp, alpha, stage, mn, mx, pf); break;
    case 3: pvb_rows(3, SCAN, vr, idx, nv, pw, o, dp, alpha, stage, mn, mx, pf); break;
    case 2: pvb_rows(2, SCAN, vr, idx, nv, pw, o, dp, alpha, stage, mn, mx, pf); break;
    default: pvb_rows(1, SCAN, vr, idx, nv, pw, o, dp, alpha, stage, mn, mx, pf); break;
    }
}

/* Rows in groups of 4. The first group scans every V word it loads (it reads them all) and
 * leaves its sums in a staging copy, added to O only when the scan passed: a call that returns
 * false has written nothing. */
static bool a5b_pv_src_bf16(const void *const *vrows, int nc, const float *p, int ldp, int nr, int dp,
                            const float *alpha, const unsigned char *colmask, float *o, const pa__cpu_pf *pf)
{
    if (nr > 16 || nc > CPU_KT || dp > 512 || dp % 16) return false; /* (direct tiles never are) */
    /* the keys taken: all (no column mask: the identity, and the probabilities straight from
     * their rows) or the listed ones */
    static const int all[CPU_KT] = {0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15,
                                    16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31,
                                    32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47,
                                    48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63};
    _Static_assert(CPU_KT == 64, "the identity list");
    int sel[CPU_KT], nv = 0;
    const int *idx = all;
    if (colmask) {
        for (int c = 0; c < nc; c++)
            if (colmask[c]) sel[nv++] = c;
        idx = sel;
    } else {
        nv = nc;
    }
    uint32_t pw[16 * 32] __attribute__((aligned(64)));
    if (!probs_pairs(p, ldp, nr, colmask ? idx : NULL, nv, pw)) return false;
    float st[4 * 512] __attribute__((aligned(64)));
    __m512i mn = _mm512_set1_epi32(-1), mx = _mm512_setzero_si512();
    const int g0 = nr < 4 ? nr : 4, ng = (nr + 3) / 4;
    pa__cpu_pf part = pf_part(pf, 0, ng);
    pvb_group(g0, true, vrows, idx, nv, pw, st, dp, NULL, true, &mn, &mx, pf ? &part : NULL);
    if (!scan_fit(mn, mx)) return false;
    for (int h = 0; h < g0; h++)
        for (int j = 0; j < dp; j += 16)
            pv_out(o + (size_t)h * dp + j, _mm512_load_ps(st + (size_t)h * dp + j), alpha, h, false);
    for (int r = 4; r < nr; r += 4) {
        part = pf_part(pf, r / 4, ng);
        pvb_group(nr - r < 4 ? nr - r : 4, false, vrows, idx, nv, pw + (size_t)r * 32, o + (size_t)r * dp, dp,
                  alpha ? alpha + r : NULL, false, &mn, &mx, pf ? &part : NULL);
    }
    return true;
}

/* Prefill: the V tile as pairs (cpu.h, load_v_pairs), 16 dims per step: each word the low and
 * high halves of two zero-extended rows. */
static bool a5b_load_v_pairs(const void *const *rows, int n, int d, int dp, const unsigned char *colmask,
                             uint32_t *vt2)
{
    __m512i mn = _mm512_set1_epi32(-1), mx = _mm512_setzero_si512();
    for (int i = 0; 2 * i < n; i++) {
        const uint16_t *ra = !colmask || colmask[2 * i] ? rows[2 * i] : NULL;
        const uint16_t *rb = 2 * i + 1 < n && (!colmask || colmask[2 * i + 1]) ? rows[2 * i + 1] : NULL;
        uint32_t *dst = vt2 + (size_t)i * dp;
        for (int j = 0; j < dp; j += 16) {
            const int m = d - j >= 16 ? 16 : d - j > 0 ? d - j : 0;
            const __mmask16 k = (__mmask16)((1u << m) - 1);
            const __m512i a = ra ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, ra + j)) : _mm512_setzero_si512();
            const __m512i b = rb ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, rb + j)) : _mm512_setzero_si512();
            const __m512i w = _mm512_or_si512(a, _mm512_slli_epi32(b, 16));
            scan_words(w, &mn, &mx);
            _mm512_store_si512(dst + j, w);
        }
    }
    return scan_fit(mn, mx);
}

/* R rows x 16 NV dims from j over the np key pairs of vt2: one broadcast probability pair per
 * row and pair (with NV 1 an embedded broadcast, as a5_pv's). */
AI void pvtb_block(int R, int NV, const uint32_t *pw, const uint32_t *vt2, int np, int dp, int j,
                   const float *alpha, float *o)
{
    __m512 acc[12];
    for (int i = 0; i < R * NV; i++) acc[i] = _mm512_setzero_ps();
    for (int i = 0; i < np; i++) {
        __m512bh x[12];
        for (int u = 0; u < NV; u++) x[u] = as_bh(_mm512_load_si512(vt2 + (size_t)i * dp + j + 16 * u));
        for (int h = 0; h < R; h++)
            for (int u = 0; u < NV; u++) acc[h * NV + u] = dpbf16_bcst(acc[h * NV + u], x[u], pw + h * 32 + i);
    }
    for (int h = 0; h < R; h++)
        for (int u = 0; u < NV; u++) pv_out(o + (size_t)h * dp + j + 16 * u, acc[h * NV + u], alpha, h, false);
}

AI void pvtb_rows(int R, const uint32_t *pw, const uint32_t *vt2, int nc, int dp, const float *alpha, float *o)
{
    const int NVM = 12 / R > 8 ? 8 : 12 / R, np = (nc + 1) / 2;
    for (int j = 0; j < dp;) {
        const int w = (dp - j) / 16 < NVM ? (dp - j) / 16 : NVM;
        switch (w) {
#define PVTB_CASE(n)                                                                                 \
    case n:                                                                                          \
        if (n <= NVM) pvtb_block(R, n <= NVM ? n : 1, pw, vt2, np, dp, j, alpha, o);                 \
        break;
            PVTB_CASE(8)
            PVTB_CASE(7)
            PVTB_CASE(6)
            PVTB_CASE(5)
            PVTB_CASE(4)
            PVTB_CASE(3)
            PVTB_CASE(2)
#undef PVTB_CASE
        default: pvtb_block(R, 1, pw, vt2, np, dp, j, alpha, o); break;
        }
        j += 16 * w;
    }
}

/* Every row's probabilities as pairs first (so that a subnormal one declines the call before
 * anything is written), then rows in groups of 12 (one vector each), the rest in groups of at
 * most 6. */
static bool a5b_pv_bf16(const float *p, int ldp, int nr, const uint32_t *vt2, int nc, int dp, const float *alpha,
                        float *o, const pa__cpu_pf *pf)
{
    uint32_t pw[CPU_ROWS * 32] __attribute__((aligned(64)));
    if (nr > CPU_ROWS || nc > CPU_KT || !probs_pairs(p, ldp, nr, NULL, nc, pw)) return false;
    const int ng = (nr + 11) / 12;
    for (int r = 0, take; r < nr; r += take) {
        take = nr - r >= 12 ? 12 : (nr - r > 6 ? 6 : nr - r);
        pf_share(pf, r / 12, ng);
        const uint32_t *pr = pw + (size_t)r * 32;
        const float *ar = alpha ? alpha + r : NULL;
        float *orow = o + (size_t)r * dp;
        switch (take) {
        case 12: pvtb_rows(12, pr, vt2, nc, dp, ar, orow); break;
        case 6: pvtb_rows(6, pr, vt2, nc, dp, ar, orow); break;
        case 5: pvtb_rows(5, pr, vt2, nc, dp, ar, orow); break;
        case 4: pvtb_rows(4, pr, vt2, nc, dp, ar, orow); break;
        case 3: pvtb_rows(3, pr, vt2, nc, dp, ar, orow); break;
        case 2: pvtb_rows(2, pr, vt2, nc, dp, ar, orow); break;
        default: pvtb_rows(1, pr, vt2, nc, dp, ar, orow); break;
        }
    }
    return true;
}

void pa__cpu_kernels_init_avx512bf16(pa__cpu_kernels *k, bool vbmi)
{
    k->name = "avx512bf16";
    k->qk_src_bf16 = a5b_qk_src_bf16;
    k->q16_load = a5b_q16_load;
    k->qk_src_e4m3_bf16 = vbmi ? a5b_qk_src_e4m3_lut : a5b_qk_src_e4m3;
    k->qk_e4m3_bf16_rows = vbmi ? 1 : 7;
    k->qk_e4m3_bf16_dims = vbmi ? 16 : 32;
    k->qk_src_e5m2_bf16 = vbmi ? a5b_qk_src_e5m2_lut : NULL;
    k->qk_t_bf16 = a5b_qk_t_bf16;
    k->pv_src_bf16 = a5b_pv_src_bf16;
    k->load_v_pairs = a5b_load_v_pairs;
    k->pv_bf16 = a5b_pv_bf16;
}
