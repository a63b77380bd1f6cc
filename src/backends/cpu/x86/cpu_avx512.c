/* cpu_avx512.c: AVX-512 (F, BW, VL) kernels, compiled with their own flags and chosen at run
 * time only after CPUID + XGETBV (XCR0 opmask/ZMM state) say the machine runs them. They
 * override the AVX2 table (installed first) for every product: decode QK and PV straight from
 * the cache rows, prefill QK over the transposed K tile and PV over the converted V tile, and the
 * row conversion, the softmax's exp and its whole-tile step (softmax_rows). The transposed K
 * tile (its layout is shared), the row maximum of the tiles softmax_rows leaves to the driver's
 * loop, and the output store stay AVX2. Arithmetic is fp32 FMA, 16 lanes.
 *
 * Blocking: 32 vector registers allow 12 to 16 accumulators plus the operands everywhere:
 *  - decode QK: 4 query rows (one GQA 4 group) x 4 keys over 16-dim steps, each K chunk
 *    converted once for the 4 rows, the 16 sums reduced together (hsum16z); fewer rows take
 *    more keys; bf16 rows (and E4M3 as bf16 words) over pair-split query rows in 32-dim steps
 *    (qkp_block);
 *  - decode PV: 4 rows x 48 dims (3 vectors), V chunk converted once per key; over bf16 rows
 *    4 rows x 64 dims, converted by pair split (16 accumulators);
 *  - prefill QK: 8 rows x 32 keys (two vectors of the transposed tile), q broadcast; on Zen 4
 *    12 rows x 16 keys, the broadcasts embedded in the FMAs (a5_qk_t8, a5_qk_t12);
 *  - prefill PV: 8 rows x 32 dims, probabilities broadcast; on Zen 4 12 rows x 16 dims, the
 *    broadcasts embedded (a5_pv8, a5_pv12).
 * Reductions: decode QK by the transpose-and-add tree hsum16z (blocks of 12 or more sums), else
 * the two 256-bit halves added, then the same hadd tree as the AVX2 path.
 * E4M3 decode rows: words 2^-120 times the value (PA__CPU_E4M3B; bf16 words in QK over
 * pair-split queries, words32, f32 words otherwise, cvt16r) on AMD, whose FP units take the
 * subnormal ones at full speed, with the query rows and probabilities 2^120 times theirs; f16
 * forms elsewhere (cpu.h, e4m3_bf16). Both without the NaN fix-up, the bytes tested on the way
 * and the work redone with it where one was a NaN (e4m3_fast, below).
 * Written on AVX2-only machines and checked there under SIMDe (bench/check_avx512_simde.sh);
 * since run and timed natively on Intel Xeons (bench/NOTES.md, nineteenth and twenty-sixth
 * passes) and on a Zen 5 EPYC (twenty-eighth), not yet on Zen 4. */
#include "../cpu.h"
#include "cpu_avx512_util.h"
#include "cpu_x86_fp8.h"

#include <immintrin.h>

AI size_t esize(pa_dtype dt)
{
    return dt == PA_DTYPE_F32 ? 4 : dt == PA_DTYPE_F16 || dt == PA_DTYPE_BF16 ? 2 : 1;
}

/* 16 elements of dt at p as f32, exactly (E4M3 NaN stays NaN); dt is a constant after inlining. */
AI __m512 cvt16(pa_dtype dtype, const char *p)
{
    switch (dtype) {
    case PA_DTYPE_F32: return _mm512_loadu_ps(p);
    case PA_DTYPE_F16: return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    case PA_DTYPE_BF16:
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
    case PA_DTYPE_FP8_E5M2: {
        __m256i h = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p)), 8);
        return _mm512_cvtph_ps(h);
    }
    case PA_DTYPE_FP8_E4M3: {
        /* through f16 (cpu_x86_fp8.h; an earlier version made f32 bits 2^-120 times the value
         * and multiplied by 2^120: exact, but every E4M3 subnormal was an f32 subnormal operand,
         * which Intel cores serve by microcode assists; the decode kernels do that now on AMD
         * only, with the 2^120 folded into the other operand: cvt16r) */
        __m256i h = pa__e4m3_to_f16x16(p, true);
        return _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f));
    }
    default: return _mm512_setzero_ps();
    }
}

/* PA__CPU_E4M3F (cpu.h): E4M3 rows converted without the NaN fix-up (the kernels that take it
 * test the bytes on the way: e4m3_fast). */

/* cvt16 for the decode kernels: E4M3 comes out 2^-8 times its value (the kernels apply 2^8 once,
 * to the finished scores and outputs: exact, a power of two), with the NaN fix-up only for
 * PA_DTYPE_FP8_E4M3; 3 operations per 16 values before vcvtph2ps instead of 8 (the fix-up and
 * the multiplication by 2^8). */
AI __m512 cvt16r(pa_dtype dt, const char *p)
{
    if (dt == PA__CPU_E4M3B || dt == PA__CPU_E4M3BN) {
        /* E4M3 as f32 words 2^-120 times the value (as the AVX2 path's bf16 words, 32 bits
         * wide): sign-extended and shifted left by 20, the sign lands in bit 31 (copies in bits
         * 30-27, cleared) and eeee.mmm in the exponent's low bits and the mantissa's top;
         * subnormal codes on f32 subnormals, exactly. 3 operations per 16 values, against 4 and
         * a two-uop vcvtph2ps through f16. NaN (S.1111.111) lands on (+-)0x07f00000. */
        __m512i x = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p));
        __m512i h = _mm512_and_si512(_mm512_slli_epi32(x, 20), _mm512_set1_epi32((int)0x87f00000u));
        if (dt == PA__CPU_E4M3BN) {
            __mmask16 nan = _mm512_cmpeq_epi32_mask(_mm512_and_si512(h, _mm512_set1_epi32(0x7ff00000)),
                                                    _mm512_set1_epi32(0x07f00000));
            h = _mm512_mask_or_epi32(h, nan, h, _mm512_set1_epi32(0x7fc00000));
        }
        return _mm512_castsi512_ps(h);
    }
    if (pa__cpu_is_e4m3(dt)) return _mm512_cvtph_ps(pa__e4m3_to_f16x16(p, dt == PA_DTYPE_FP8_E4M3));
    return cvt16(dt, p);
}

/* cvt16r of the first n (0..15) values at p and zeros after them (zero bytes are 0 in every
 * dtype), reading nothing past them: a row's last values where the head size is not a multiple
 * of 16 (qk_src_tail, pv_src_tail: cpu.h). The masked load suppresses faults on the lanes it leaves out. */
AI __m512 cvt16m(pa_dtype dt, const char *p, int n)
{
    const __mmask16 m = (__mmask16)((1u << n) - 1u);
    _Alignas(64) char t[64];
    if (esize(dt) == 4) _mm512_store_ps((float *)t, _mm512_maskz_loadu_ps(m, p));
    else if (esize(dt) == 2) _mm256_store_si256((__m256i *)t, _mm256_maskz_loadu_epi16(m, p));
    else _mm_store_si128((__m128i *)t, _mm_maskz_loadu_epi8(m, p));
    return cvt16r(dt, t);
}

/* ---- fp8 decode rows by byte tables (AVX512-VBMI) ------------------------------------------
 * Where the CPU has AVX512-VBMI and fp8 rows are not read as bf16 words (so on Intel cores:
 * cpu_backend.c, PAGEDATTN_CPU_FP8), the decode QK and PV take E4M3 and E5M2 rows by the byte
 * tables of cpu_avx512_util.h. For 64 values: two vpermt2b give each value's bf16 high byte (the
 * sign ORed back in by one vpternlogd) and low byte, the two byte unpacks make bf16 words of
 * them, and a shift and an AND per word vector make f32 of the even and the odd words (as the
 * bf16 rows' pair split): 9 operations, each value exactly (every E4M3 and E5M2 value has a bf16,
 * their subnormals normal ones, so no FMA meets a subnormal operand, which Intel cores serve by
 * microcode assists), NaN as NaN (no byte test, no redo). The f16 forms take ~22 (a widening, a
 * shift, an AND and a two-uop vcvtph2ps per 16, and the NaN test). The values come in a fixed
 * order of their 64 (f8l_cvt): QK takes the query rows in that order (f8l_queries, once per
 * call), PV puts its sums back in order at the end of each chunk (f8l_order).
 * On the Xeon of bench/NOTES.md's thirty-seventh pass vpermt2b and vpermi2b take three uops (two
 * on port 5) and issue every second cycle: one more two-source byte permute per 16 values, to
 * put the bytes in memory order as f32 directly, cost what the f16 forms cost.
 * The permutes are inline assembly: this file is not compiled for VBMI (it must run where VBMI is
 * not), and the intrinsic would need the target on every function it inlines into, which other
 * dtypes share; the assembler takes it whatever the flags, and only the tags below reach it. */

AI bool f8l(pa_dtype dt)
{
    return dt == PA__CPU_E4M3L || dt == PA__CPU_E5M2L;
}

/* vpermt2b: byte i of the result is byte (idx[i] & 63) of a (idx[i] bit 6 clear) or of the 64
 * bytes at b (set), as _mm512_permutex2var_epi8(a, idx, b) */
AI __m512i perm2b(__m512i a, __m512i idx, const uint8_t *b)
{
#ifdef PA_SIMDE
    return _mm512_permutex2var_epi8(a, idx, _mm512_load_si512(b));
#else
    __asm__("vpermt2b %[b], %[idx], %[a]" : [a] "+v"(a) : [idx] "v"(idx), [b] "m"(*(const __m512i *)b));
    return a;
#endif
}

/* The first n (1..64; not a multiple of 16 only at a row's end: qk_src_tail) fp8 values at p
 * (dt a table tag; zeros after them, the bytes after them not read) as f32 in
 * the tables' order: lane 4 L + m of x[0] holds value 16 L + 2 m, of x[1] 16 L + 2 m + 1, of
 * x[2] 16 L + 8 + 2 m, of x[3] 16 L + 9 + 2 m (L, m < 4). */
AI void f8l_cvtm(pa_dtype dt, const char *p, __mmask64 m, __m512 *x)
{
    const uint8_t *tab = dt == PA__CPU_E4M3L ? pa__e4m3_bf16_tab : pa__e5m2_bf16_tab;
    const __m512i raw = m == ~(__mmask64)0 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(m, p);
    const __m512i hi = _mm512_ternarylogic_epi32(perm2b(_mm512_load_si512(tab), raw, tab + 64), raw,
                                                 _mm512_set1_epi8((char)0x80), 0xf8); /* a | (b & c) */
    const __m512i lo = perm2b(_mm512_load_si512(tab + 128), raw, tab + 192);
    /* per 128-bit block L: the words of values 16 L .. 16 L + 7, then 16 L + 8 .. 16 L + 15 */
    const __m512i w0 = _mm512_unpacklo_epi8(lo, hi), w1 = _mm512_unpackhi_epi8(lo, hi);
    const __m512i odd = _mm512_set1_epi32((int)0xffff0000u);
    x[0] = _mm512_castsi512_ps(_mm512_slli_epi32(w0, 16));
    x[1] = _mm512_castsi512_ps(_mm512_and_si512(w0, odd));
    x[2] = _mm512_castsi512_ps(_mm512_slli_epi32(w1, 16));
    x[3] = _mm512_castsi512_ps(_mm512_and_si512(w1, odd));
}

/* f8l_cvtm of the first n (1..64) values */
AI __mmask64 f8l_mask(int n)
{
    return n >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << n) - 1;
}

AI void f8l_cvt(pa_dtype dt, const char *p, int n, __m512 *x)
{
    f8l_cvtm(dt, p, f8l_mask(n), x);
}

/* out[k]'s 128-bit block L = in[L]'s block k */
AI void blocks_transpose(const __m512 *in, __m512 *out)
{
    const __m512 t0 = _mm512_shuffle_f32x4(in[0], in[1], 0x44), t1 = _mm512_shuffle_f32x4(in[0], in[1], 0xee);
    const __m512 t2 = _mm512_shuffle_f32x4(in[2], in[3], 0x44), t3 = _mm512_shuffle_f32x4(in[2], in[3], 0xee);
    out[0] = _mm512_shuffle_f32x4(t0, t2, 0x88);
    out[1] = _mm512_shuffle_f32x4(t0, t2, 0xdd);
    out[2] = _mm512_shuffle_f32x4(t1, t3, 0x88);
    out[3] = _mm512_shuffle_f32x4(t1, t3, 0xdd);
}

/* 64 dims in the tables' order (a[0..4), f8l_cvt's) back in memory order (n[0..4)) */
AI void f8l_order(const __m512 *a, __m512 *n)
{
    const __m512 e[4] = {_mm512_unpacklo_ps(a[0], a[1]), _mm512_unpackhi_ps(a[0], a[1]),
                         _mm512_unpacklo_ps(a[2], a[3]), _mm512_unpackhi_ps(a[2], a[3])};
    blocks_transpose(e, n);
}

/* The R rows at q (dp apart) in the tables' order, zeros past dp: qp[((s * R + h) * 4 + i) * 16]
 * the vector i of row h's 64-dim step s (f8l_order's inverse) */
AI void f8l_queries(int R, const float *q, int dp, float *qp)
{
    for (int s = 0; 64 * s < dp; s++)
        for (int h = 0; h < R; h++) {
            __m512 n[4], e[4];
            for (int i = 0; i < 4; i++)
                n[i] = 64 * s + 16 * i < dp ? _mm512_load_ps(q + (size_t)h * dp + 64 * s + 16 * i) : _mm512_setzero_ps();
            blocks_transpose(n, e);
            float *o = qp + (size_t)(s * R + h) * 64;
            _mm512_store_ps(o, _mm512_shuffle_ps(e[0], e[1], 0x88));
            _mm512_store_ps(o + 16, _mm512_shuffle_ps(e[0], e[1], 0xdd));
            _mm512_store_ps(o + 32, _mm512_shuffle_ps(e[2], e[3], 0x88));
            _mm512_store_ps(o + 48, _mm512_shuffle_ps(e[2], e[3], 0xdd));
        }
}

static void a5_load_rows(pa_dtype dtype, const void *const *rows, int n, int d, int dp, float *dst)
{
    int dv = d & ~15;
    size_t es = pa_dtype_size(dtype);
    for (int i = 0; i < n; i++) {
        float *o = dst + (size_t)i * dp;
        const char *src = rows[i];
        int j = 0;
        for (; j < dv; j += 16) _mm512_store_ps(o + j, cvt16(dtype, src + (size_t)j * es));
        if (j < d) {
            /* the last d % 16 values through a zeroed copy (zero bytes are 0 in every dtype):
             * one element at a time through pa__load_f32 they took 38% of a decode at head
             * size 120 (an audit, forty-third pass) */
            _Alignas(64) unsigned char t[64] = {0};
            memcpy(t, src + (size_t)j * es, (size_t)(d - j) * es);
            _mm512_store_ps(o + j, cvt16(dtype, (const char *)t));
            j += 16;
        }
        for (; j < dp; j += 16) _mm512_store_ps(o + j, _mm512_setzero_ps());
    }
}

/* ---- E4M3 NaN bytes in the decode kernels -------------------------------------------------- */

/* The decode kernels convert E4M3 rows without the NaN fix-up (the fast tags PA__CPU_E4M3B and
 * PA__CPU_E4M3F, whose NaN bytes would become finite values) and test the bytes they convert on
 * the way: the running maximum of their low 7 bits, 0x7f where some byte is S.1111.111. A QK
 * call that saw one is done again with the fix-up (PA__CPU_E4M3BN, PA_DTYPE_FP8_E4M3), its
 * scores written again (qkz_src_e4m3). PV keeps the maxima per dim (a lane per byte) and sets
 * the outputs of the dims where one was a NaN to NaN as it stores them (pvz_chunk): a NaN byte
 * taken as a finite value feeds only its own dim's sums, and with the fix-up each of those
 * would be NaN (p times NaN is NaN, whatever p), so every output is what the fix-up gives,
 * without the outputs kept aside and the work redone that this took until the thirty-second
 * pass (bench/NOTES.md). A separate scan of each
 * call's rows before the kernel (pa__e4m3_rows_nan, as the AVX2 kernels do) took 17% of an E4M3
 * decode with the KV in L2 and 20% from DRAM even in 64-byte vectors (bench/NOTES.md,
 * thirty-first pass): it read every line once more, in a burst of loads with no arithmetic. */
AI bool e4m3_fast(pa_dtype dt)
{
    return dt == PA__CPU_E4M3B || dt == PA__CPU_E4M3F;
}

AI pa_dtype e4m3_fixed(pa_dtype dt)
{
    return dt == PA__CPU_E4M3B ? PA__CPU_E4M3BN : PA_DTYPE_FP8_E4M3;
}

/* a with the low 7 bits of the n bytes at p (n a multiple of 16) folded in by maxima */
AI __m512i nan_acc(__m512i a, const char *p, int n)
{
    const __m512i m = _mm512_set1_epi8(0x7f);
    int j = 0;
    for (; j + 128 <= n; j += 128)
        a = _mm512_max_epu8(_mm512_max_epu8(a, _mm512_and_si512(_mm512_loadu_si512(p + j), m)),
                            _mm512_and_si512(_mm512_loadu_si512(p + j + 64), m));
    if (j + 64 <= n) a = _mm512_max_epu8(a, _mm512_and_si512(_mm512_loadu_si512(p + j), m)), j += 64;
    if (j + 32 <= n)
        a = _mm512_max_epu8(a, _mm512_zextsi256_si512(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)(p + j)),
                                                                       _mm512_castsi512_si256(m)))),
        j += 32;
    if (j + 16 <= n)
        a = _mm512_max_epu8(a, _mm512_zextsi128_si512(_mm_and_si128(_mm_loadu_si128((const __m128i *)(p + j)),
                                                                    _mm512_castsi512_si128(m))));
    return a;
}

AI bool nan_seen(__m512i a)
{
    return _mm512_cmpeq_epi8_mask(a, _mm512_set1_epi8(0x7f)) != 0;
}

/* ---- decode QK: straight from the cache rows ---------------------------------------------- */

/* One 64-dim step of qkz_block over fp8 rows by the tables (f8l): the values of each key from
 * dim j that mask m takes (f8l_mask), converted at once and used by the R rows, whose query
 * vectors qs holds in the tables' order (f8l_queries) */
AI void qkf_step(int R, int KB, __mmask64 m, pa_dtype dt, const void *const *krows, int c0, const float *qs, int j,
                 __m512 *a)
{
    for (int u = 0; u < KB; u++) {
        __m512 x[4];
        f8l_cvtm(dt, (const char *)krows[c0 + u] + j, m, x);
        for (int h = 0; h < R; h++)
            for (int i = 0; i < 4; i++)
                a[h * KB + u] = _mm512_fmadd_ps(_mm512_load_ps(qs + (size_t)(h * 4 + i) * 16), x[i], a[h * KB + u]);
    }
}

/* One 16-dim step of qkz_block at dim j: n (16, or the last d % 16 by masked loads) values of
 * each of the KB keys, converted once and used by the R rows */
AI void qkz_step(int R, int KB, int n, pa_dtype dt, const void *const *krows, int c0, const float *q, int dp, int j,
                 __m512 *a)
{
    const size_t es = esize(dt);
    __m512 x[16];
    for (int u = 0; u < KB; u++) {
        const char *kp = (const char *)krows[c0 + u] + (size_t)j * es;
        x[u] = n == 16 ? cvt16r(dt, kp) : cvt16m(dt, kp, n);
    }
    for (int h = 0; h < R; h++) {
        __m512 w = _mm512_load_ps(q + (size_t)h * dp + j);
        for (int u = 0; u < KB; u++) a[h * KB + u] = _mm512_fmadd_ps(w, x[u], a[h * KB + u]);
    }
}

/* S[r][c0 .. c0 + KB) for the R rows at q (dp apart): R x KB accumulators over 16-dim steps (over
 * fp8 rows by the tables 64-dim steps, q the rows in the tables' order), the keys' d values: with
 * T (d % 16 != 0: qk_src_tail) the last ones by masked loads (over fp8 rows by the tables mask
 * tm, the last d % 64); without, d a multiple of 16. */
AI void qkz_block(int R, int KB, bool T, pa_dtype dt, const void *const *krows, int c0, const float *q, int d, int dp,
                  __mmask64 tm, float *s, int lds, pa__cpu_pfc *pc, int per, __m512i *nan)
{
    const int dd = T ? d : dp; /* (without T the old bounds: see pvz_rows) */
    __m512 a[16];
    for (int i = 0; i < 16; i++) a[i] = _mm512_setzero_ps();
    if (f8l(dt)) {
        /* q: the rows in the tables' order (f8l_queries); whole steps, then the rest by a
         * constant width (a variable one kept the accumulators in memory in the avx512bf16
         * twin, bench/NOTES.md thirty-second pass) */
        int j = 0;
        for (; j + 64 <= dd; j += 64) {
            qkf_step(R, KB, f8l_mask(64), dt, krows, c0, q + (size_t)j * R, j, a);
            pfc_step(pc, per);
        }
        switch (dd - j) {
        case 48: qkf_step(R, KB, f8l_mask(48), dt, krows, c0, q + (size_t)j * R, j, a); pfc_step(pc, per); break;
        case 32: qkf_step(R, KB, f8l_mask(32), dt, krows, c0, q + (size_t)j * R, j, a); pfc_step(pc, per); break;
        case 16: qkf_step(R, KB, f8l_mask(16), dt, krows, c0, q + (size_t)j * R, j, a); pfc_step(pc, per); break;
        case 0: break;
        default: /* (T: the last d % 64 values, mask tm) */
            if (T) qkf_step(R, KB, tm, dt, krows, c0, q + (size_t)j * R, j, a), pfc_step(pc, per);
            break;
        }
        store_scores(R, KB, a, 1.0f, s, lds, c0);
        return;
    }
    if (e4m3_fast(dt))
        for (int u = 0; u < KB; u++) *nan = nan_acc(*nan, krows[c0 + u], dp); /* (fast E4M3 tags: never T) */
    int j = 0;
    for (; T ? j + 16 <= d : j < dp; j += 16) {
        qkz_step(R, KB, 16, dt, krows, c0, q, dp, j, a);
        pfc_step(pc, per);
    }
    if (T && j < d) {
        qkz_step(R, KB, d - j, dt, krows, c0, q, dp, j, a);
        pfc_step(pc, per);
    }
    store_scores(R, KB, a, pa__cpu_is_e4m3(dt) ? 256.0f : 1.0f, s, lds, c0);
}

/* ---- decode QK over pair-split query rows (qk_src_pairs, pair_span 32) ---------------------- */

/* 32 key values at p as bf16 words in memory order (32-bit lane i: dims 2i and 2i + 1): bf16 rows
 * as they are, one 64-byte load; E4M3 rows (PA__CPU_E4M3B, E4M3BN) by pa__e4m3_to_bf16x16's
 * operations on 32 bytes, 2^-120 times the value (the caller's query rows 2^120 times theirs),
 * for PA__CPU_E4M3B with the bytes' NaN test folded into seen (nan_acc's maxima). */
AI __m512i words32(pa_dtype dt, const char *p, __m256i *seen)
{
    if (dt == PA_DTYPE_BF16) return _mm512_loadu_si512(p);
    const __m256i raw = _mm256_loadu_si256((const __m256i *)p);
    if (e4m3_fast(dt)) *seen = _mm256_max_epu8(*seen, _mm256_and_si256(raw, _mm256_set1_epi8(0x7f)));
    __m512i x = _mm512_cvtepi8_epi16(raw);
    __m512i h = _mm512_and_si512(_mm512_slli_epi16(x, 4), _mm512_set1_epi16((short)0x87f0));
    if (dt == PA__CPU_E4M3BN) {
        __mmask32 nan = _mm512_cmpeq_epi16_mask(_mm512_and_si512(h, _mm512_set1_epi16(0x7ff0)),
                                                _mm512_set1_epi16(0x07f0));
        h = _mm512_mask_blend_epi16(nan, h, _mm512_or_si512(h, _mm512_set1_epi16(0x7fc0)));
    }
    return h;
}

/* qkz_block over pair-split query rows: each 32-dim step loads each key's 32 values once (as
 * bf16 words); a shift makes the 16 even dims fp32, an AND the 16 odd ones (2 operations per 32
 * values, against 4 for two zero-extends and shifts), each multiplied by the query's even or odd
 * half. Key outermost, rows inside: each converted vector is used at once (16 accumulators, the
 * KB words and the R query vectors fit the 32 registers for 4 x 4, 2 x 8 and 1 x 8). */
AI void qkp_block(int R, int KB, pa_dtype dt, const void *const *krows, int c0, const float *q, int dp,
                  float *s, int lds, pa__cpu_pfc *pc, int per, __m512i *nan)
{
    const size_t es = dt == PA_DTYPE_BF16 ? 2 : 1;
    const __m512i odd = _mm512_set1_epi32((int)0xffff0000u);
    __m512 a[16];
    for (int i = 0; i < 16; i++) a[i] = _mm512_setzero_ps();
    __m256i n8 = _mm256_setzero_si256();
    for (int j = 0; j < dp; j += 32) {
        __m512i w[8];
        for (int u = 0; u < KB; u++) w[u] = words32(dt, (const char *)krows[c0 + u] + (size_t)j * es, &n8);
        pfc_step(pc, per);
        for (int half = 0; half < 2; half++) {
            __m512 qv[4];
            for (int h = 0; h < R; h++) qv[h] = _mm512_load_ps(q + (size_t)h * dp + j + 16 * half);
            for (int u = 0; u < KB; u++) {
                __m512 x = _mm512_castsi512_ps(half ? _mm512_and_si512(w[u], odd) : _mm512_slli_epi32(w[u], 16));
                for (int h = 0; h < R; h++) a[h * KB + u] = _mm512_fmadd_ps(qv[h], x, a[h * KB + u]);
            }
        }
    }
    store_scores(R, KB, a, 1.0f, s, lds, c0);
    if (e4m3_fast(dt)) *nan = _mm512_max_epu8(*nan, _mm512_zextsi256_si512(n8));
}

/* R rows (1..4; 8 over fp8 rows by the tables) over all nc keys: KB keys at a time (4 rows x 4
 * keys, 3 x 4, 2 x 8 and 8 x 2 reduced by hsum16z; a single row 8 keys), then single keys; pf's
 * lines prefetched a few per dim step of the blocks (pa__cpu_pfc). P: the query rows pair-split,
 * qkp_block's 32-dim steps; over fp8 rows by the tables the rows permuted into qp (f8l_queries).
 * Returns whether a fast E4M3 tag's rows held a NaN byte (the scores are then to be made
 * again). */
AI bool qkz_rows(bool P, bool T, int R, pa_dtype dt, const void *const *krows, int nc, const float *q, int d,
                 int dp, float *s, int lds, const pa__cpu_pf *pf)
{
    const int KB = R == 8 ? 2 : qk_keys_per_block(R); /* (8 rows: fp8 rows by the tables only) */
    float qp[8 * 512] __attribute__((aligned(64))); /* (R <= 8 rows, dp <= 512: the head size limit) */
    if (f8l(dt)) {
        f8l_queries(R, q, dp, qp);
        q = qp;
    }
    pa__cpu_pfc pc = pfc_init(pf);
    const int per = pfc_per(pf, nc / KB * (f8l(dt) ? (dp + 63) / 64 : dp / (P ? 32 : 16)));
    __m512i nan = _mm512_setzero_si512();
    int c = 0;
    const __mmask64 tm = f8l_mask(d % 64);
    for (; c + KB <= nc; c += KB)
        if (P) qkp_block(R, KB, dt, krows, c, q, dp, s, lds, &pc, per, &nan);
        else qkz_block(R, KB, T, dt, krows, c, q, d, dp, tm, s, lds, &pc, per, &nan);
    for (; c < nc; c++)
        if (P) qkp_block(R, 1, dt, krows, c, q, dp, s, lds, &pc, 0, &nan);
        else qkz_block(R, 1, T, dt, krows, c, q, d, dp, tm, s, lds, &pc, 0, &nan);
    pfc_step(&pc, -1);
    return e4m3_fast(dt) && nan_seen(nan);
}

/* All nr rows, in groups of 4. Returns whether a fast E4M3 tag's rows held a NaN byte: the
 * caller then makes the scores again with the fix-up (qkz_src_e4m3). */
AI bool qkz_src(bool P, bool T, pa_dtype dt, const void *const *krows, int nc, const float *q, int nr, int d, int dp,
                float *s, int lds, const pa__cpu_pf *pf)
{
    bool nan = false;
    for (int r = 0, take; r < nr; r += take) {
        /* groups of 4 rows; over fp8 rows by the tables 8 where there are (each key converted once
         * for 8 rows: 8 x 2 accumulators; GQA 8, 16 x 4096 E4M3 on one Xeon core: 30.3 -> 29.2 ms
         * from DRAM, 29.1 -> 27.9 in L2; bench/NOTES.md, thirty-seventh pass) */
        take = T ? (nr - r >= 4 ? 4 : 1) : f8l(dt) && nr - r >= 8 ? 8 : nr - r < 4 ? nr - r : 4;
        pa__cpu_pf part = pf_range(pf, r, r + take, nr); /* (in proportion to the group's rows) */
        const pa__cpu_pf *pp = pf ? &part : NULL;
        const float *qr = q + (size_t)r * dp;
        float *sr = s + (size_t)r * lds;
        switch (take) {
        case 8: /* (f8l only) */
            if (!T) nan = qkz_rows(P, T, f8l(dt) ? 8 : 4, dt, krows, nc, qr, d, dp, sr, lds, pp);
            break;
        case 4: nan = qkz_rows(P, T, 4, dt, krows, nc, qr, d, dp, sr, lds, pp); break;
        case 3: if (!T) nan = qkz_rows(P, T, 3, dt, krows, nc, qr, d, dp, sr, lds, pp); break;
        case 2: if (!T) nan = qkz_rows(P, T, 2, dt, krows, nc, qr, d, dp, sr, lds, pp); break;
        default: nan = qkz_rows(P, T, 1, dt, krows, nc, qr, d, dp, sr, lds, pp); break;
        }
        if (nan) break; /* (every group converts the same rows) */
    }
    return nan;
}

/* qkz_src for a fast E4M3 tag, and again with the fix-up where the rows held a NaN byte */
AI void qkz_src_e4m3(bool P, pa_dtype dt, const void *const *krows, int nc, const float *q, int nr, int dp,
                     float *s, int lds, const pa__cpu_pf *pf)
{
    if (qkz_src(P, false, dt, krows, nc, q, nr, dp, dp, s, lds, pf))
        qkz_src(P, false, e4m3_fixed(dt), krows, nc, q, nr, dp, dp, s, lds, NULL);
}

/* qk_src_tail (cpu.h): a5_qk_src's kernels with a masked last step (T), instances of their own */
static void a5_qk_src_tail(pa_dtype dtype, const void *const *krows, int nc, const float *q, int nr, int d, int dp,
                           float *s, int lds, const pa__cpu_pf *pf)
{
    /* (E4M3 by the forms with the NaN fix-up: no byte test, no second pass) */
    switch ((int)dtype) {
    case PA__CPU_E4M3B: qkz_src(false, true, PA__CPU_E4M3BN, krows, nc, q, nr, d, dp, s, lds, pf); break;
    case PA_DTYPE_F32: qkz_src(false, true, PA_DTYPE_F32, krows, nc, q, nr, d, dp, s, lds, pf); break;
    case PA_DTYPE_F16: qkz_src(false, true, PA_DTYPE_F16, krows, nc, q, nr, d, dp, s, lds, pf); break;
    case PA_DTYPE_BF16: qkz_src(false, true, PA_DTYPE_BF16, krows, nc, q, nr, d, dp, s, lds, pf); break;
    case PA_DTYPE_FP8_E4M3: qkz_src(false, true, PA_DTYPE_FP8_E4M3, krows, nc, q, nr, d, dp, s, lds, pf); break;
    case PA_DTYPE_FP8_E5M2: qkz_src(false, true, PA_DTYPE_FP8_E5M2, krows, nc, q, nr, d, dp, s, lds, pf); break;
    default: break;
    }
}

static void a5_qk_src(pa_dtype dtype, const void *const *krows, int nc, const float *q, int nr, int dp,
                      float *s, int lds, const pa__cpu_pf *pf)
{
    switch ((int)dtype) { /* (int: PA__CPU_E4M3B is a tag beside the enumerators) */
    case PA__CPU_E4M3B: /* (q 2^120 times, cpu.h) */
        qkz_src_e4m3(false, PA__CPU_E4M3B, krows, nc, q, nr, dp, s, lds, pf);
        break;
    case PA_DTYPE_F32: qkz_src(false, false, PA_DTYPE_F32, krows, nc, q, nr, dp, dp, s, lds, pf); break;
    case PA_DTYPE_F16: qkz_src(false, false, PA_DTYPE_F16, krows, nc, q, nr, dp, dp, s, lds, pf); break;
    case PA_DTYPE_BF16: qkz_src(false, false, PA_DTYPE_BF16, krows, nc, q, nr, dp, dp, s, lds, pf); break;
    case PA_DTYPE_FP8_E4M3: qkz_src_e4m3(false, PA__CPU_E4M3F, krows, nc, q, nr, dp, s, lds, pf); break;
    case PA_DTYPE_FP8_E5M2: qkz_src(false, false, PA_DTYPE_FP8_E5M2, krows, nc, q, nr, dp, dp, s, lds, pf); break;
    default: break;
    }
}

/* bf16 keys, or E4M3 keys as bf16 words (PA__CPU_E4M3B; NaN bytes as in a5_qk_src); dp a
 * multiple of 32 (the driver's condition) */
static void a5_qk_src_pairs(pa_dtype dtype, const void *const *krows, int nc, const float *q, int nr, int dp,
                            float *s, int lds, const pa__cpu_pf *pf)
{
    if (dtype == PA_DTYPE_BF16) qkz_src(true, false, PA_DTYPE_BF16, krows, nc, q, nr, dp, dp, s, lds, pf);
    else qkz_src_e4m3(true, PA__CPU_E4M3B, krows, nc, q, nr, dp, s, lds, pf);
}

/* ---- PV: O = O * alpha + P V -------------------------------------------------------------- */

/* pvz_chunk over fp8 rows by the tables (f8l): the NV vectors in 64-dim groups, each group's
 * accumulators in the tables' order (f8l_cvt's: 4 per row whatever part of the group is dims),
 * starting at 0 and put in order and added to alpha * O at the end (as the bf16 pairs below).
 * A last group of 16, 32 or 48 dims leaves f8l_cvt's 4 vectors with 1, 2 or 3 of their 4 blocks
 * used: with two rows or more they are folded into 1, 2 or 3 full vectors
 * (fold_tail) before the FMAs and unfolded (unfold_tail) before the reorder, so the same products
 * go into the same sums in the same order (the same bits) in fewer FMAs. Head size 96 had cost
 * as much as 128 (bench/NOTES.md, fiftieth pass). */
/* the permutation taking blocks s0 .. s3 (0-3: the first operand's, 4-7: the second's) */
AI __m512i blocks_idx(int s0, int s1, int s2, int s3)
{
    return _mm512_set_epi32(4 * s3 + 3, 4 * s3 + 2, 4 * s3 + 1, 4 * s3, 4 * s2 + 3, 4 * s2 + 2, 4 * s2 + 1, 4 * s2,
                            4 * s1 + 3, 4 * s1 + 2, 4 * s1 + 1, 4 * s1, 4 * s0 + 3, 4 * s0 + 2, 4 * s0 + 1, 4 * s0);
}

/* x[0..4) with blocks 0 .. nt - 1 used -> x[0..nt): those blocks end to end, x0's first */
AI void fold_tail(int nt, __m512 *x)
{
    if (nt == 3) {
        const __m512 y0 = _mm512_permutex2var_ps(x[0], blocks_idx(0, 1, 2, 4), x[1]);
        const __m512 y1 = _mm512_permutex2var_ps(x[1], blocks_idx(1, 2, 4, 5), x[2]);
        const __m512 y2 = _mm512_permutex2var_ps(x[2], blocks_idx(2, 4, 5, 6), x[3]);
        x[0] = y0, x[1] = y1, x[2] = y2;
    } else if (nt == 2) {
        const __m512 y0 = _mm512_shuffle_f32x4(x[0], x[1], 0x44), y1 = _mm512_shuffle_f32x4(x[2], x[3], 0x44);
        x[0] = y0, x[1] = y1;
    } else {
        const __m512 t0 = _mm512_shuffle_f32x4(x[0], x[1], 0x00), t1 = _mm512_shuffle_f32x4(x[2], x[3], 0x00);
        x[0] = _mm512_shuffle_f32x4(t0, t1, 0x88);
    }
}

/* fold_tail's inverse on sums: a[0..4) in the tables' order (blocks 0 .. nt - 1 of each: what
 * f8l_order reads for the first nt vectors; the other blocks are left anything) */
AI void unfold_tail(int nt, const __m512 *y, __m512 *a)
{
    if (nt == 3) {
        a[0] = y[0];
        a[1] = _mm512_permutex2var_ps(y[0], blocks_idx(3, 4, 5, 5), y[1]);
        a[2] = _mm512_permutex2var_ps(y[1], blocks_idx(2, 3, 4, 4), y[2]);
        a[3] = _mm512_shuffle_f32x4(y[2], y[2], 0xf9);
    } else if (nt == 2) {
        a[0] = y[0], a[1] = _mm512_shuffle_f32x4(y[0], y[0], 0xee);
        a[2] = y[1], a[3] = _mm512_shuffle_f32x4(y[1], y[1], 0xee);
    } else {
        a[0] = y[0], a[1] = _mm512_shuffle_f32x4(y[0], y[0], 0x01);
        a[2] = _mm512_shuffle_f32x4(y[0], y[0], 0x02), a[3] = _mm512_shuffle_f32x4(y[0], y[0], 0x03);
    }
}

AI void pvf_chunk(int R, int NV, pa_dtype dt, const void *const *vr, const int *idx, int nv, const float *p, int ldp,
                  int j, int dp, const float *alpha, float *o, pa__cpu_pfc *pc, int per)
{
    const int NG = NV / 4, NT = NV % 4;                   /* whole groups; vectors of the last one */
    /* (1 to 3 shuffles a key against 3, 2 or 1 FMAs saved per row; one row saves too little,
     * and unfolded at 2 rows the 48-dim group's accumulators stayed in memory: GQA 2 at head
     * size 112 27% slower; fiftieth pass) */
    const bool fold = NT > 0 && R >= 2;
    const int NA = 4 * NG + (NT == 0 ? 0 : fold ? NT : 4); /* accumulators per row */
    if (R * NA > 16) __builtin_trap(); /* (never: pv_src_lut's groups of at most 4 rows, pvz_rows' widths) */
    __m512 acc[16];
    for (int i = 0; i < R * NA; i++) acc[i] = _mm512_setzero_ps();
    for (int i = 0; i < nv; i++) {
        const int c = idx ? idx[i] : i;
        const char *vp = (const char *)vr[c] + j;
        __m512 x[8];
        for (int g = 0; 4 * g < NV; g++) f8l_cvt(dt, vp + 64 * g, NV - 4 * g < 4 ? 16 * (NV - 4 * g) : 64, x + 4 * g);
        if (fold) fold_tail(NT, x + 4 * NG);
        pfc_step(pc, per);
        for (int h = 0; h < R; h++) {
            const __m512 w = _mm512_set1_ps(p[(size_t)h * ldp + c]);
            for (int u = 0; u < NA; u++) acc[h * NA + u] = _mm512_fmadd_ps(w, x[u], acc[h * NA + u]);
        }
    }
    for (int h = 0; h < R; h++) {
        const __m512 al = _mm512_set1_ps(alpha ? alpha[h] : 1.0f);
        const __m512 *ah = acc + h * NA;
        float *oh = o + (size_t)h * dp + j;
        for (int g = 0; g < NG; g++) {
            __m512 n[4];
            f8l_order(ah + 4 * g, n);
            for (int u = 0; u < 4; u++) {
                float *ou = oh + 64 * g + 16 * u;
                _mm512_store_ps(ou, _mm512_fmadd_ps(_mm512_load_ps(ou), al, n[u]));
            }
        }
        if (NT > 0) {
            __m512 a[4], n[4];
            if (fold) unfold_tail(NT, ah + 4 * NG, a);
            else
                for (int u = 0; u < 4; u++) a[u] = ah[4 * NG + u];
            f8l_order(a, n);
            for (int u = 0; u < NT; u++) {
                float *ou = oh + 64 * NG + 16 * u;
                _mm512_store_ps(ou, _mm512_fmadd_ps(_mm512_load_ps(ou), al, n[u]));
            }
        }
    }
}

/* dims [j, j + 16 NV) of the R rows at o (scaled by alpha first; NULL: by 1) over nv keys, key i
 * being column c = idx[i] (idx NULL: i) of p and V row c: vd + c * dp (dense fp32 tile) or the
 * cache row vr[c].
 * bf16 cache rows, each pair of vectors: "pair split" (as the AVX2 twin). One 64-byte load holds
 * dims 2i (low half of 32-bit word i) and 2i + 1 (high half): a shift gives the 16 even dims, an
 * AND the 16 odd ones, 2 operations per 32 values against 4 (zero-extend and shift, twice). Their
 * accumulators start at 0; the end interleaves them (one two-source permute per 16 dims and row,
 * once per call) and adds them to alpha * O. llvm-mca 19 on the compiled 4-row loops (gcc 12
 * -O3), cycles per FMA: Skylake-X 0.84 -> 0.73-0.77, Ice Lake server 1.42 -> 1.25-1.27, Zen 4
 * 1.30 -> 1.25 (not timed on hardware: no AVX-512 machine here). */
AI void pvz_chunk(int R, int NV, pa_dtype dt, const void *const *vr, const float *vd, const int *idx, int nv,
                  const float *p, int ldp, int j, int dp, const float *alpha, float *o, pa__cpu_pfc *pc, int per)
{
    if (f8l(dt)) {
        pvf_chunk(R, NV, dt, vr, idx, nv, p, ldp, j, dp, alpha, o, pc, per);
        return;
    }
    const bool scan = e4m3_fast(dt) && !vd; /* (E4M3 comes as cache rows only) */
    /* per dim of the chunk (16 NV <= 128 bytes, a lane each): the maxima of the bytes' low 7 bits */
    __m512i nan[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
    const size_t es = esize(dt);
    const int NS = dt == PA_DTYPE_BF16 && !vd ? NV / 2 * 2 : 0; /* vectors that come pair-split */
    const float in = pa__cpu_is_e4m3(dt) ? 1.0f / 256.0f : 1.0f; /* E4M3 V comes 2^-8 times (cvt16r) */
    __m512 acc[16];
    for (int h = 0; h < R; h++)
        for (int u = 0; u < NV; u++) {
            if (u < NS) {
                acc[h * NV + u] = _mm512_setzero_ps();
                continue;
            }
            __m512 x = _mm512_load_ps(o + (size_t)h * dp + j + 16 * u);
            acc[h * NV + u] = alpha || in != 1.0f ? _mm512_mul_ps(x, _mm512_set1_ps((alpha ? alpha[h] : 1.0f) * in)) : x;
        }
    const __m512i odd = _mm512_set1_epi32((int)0xffff0000u);
    for (int i = 0; i < nv; i++) {
        int c = idx ? idx[i] : i;
        const char *vp = vd ? (const char *)(vd + (size_t)c * dp + j) : (const char *)vr[c] + (size_t)j * es;
        __m512 x[16];
        for (int u = 0; u < NS; u += 2) {
            __m512i w = _mm512_loadu_si512(vp + (size_t)16 * u * es);
            x[u] = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
            x[u + 1] = _mm512_castsi512_ps(_mm512_and_si512(w, odd));
        }
        for (int u = NS; u < NV; u++) x[u] = cvt16r(dt, vp + (size_t)16 * u * es);
        if (scan)
            for (int h = 0; 64 * h < 16 * NV; h++) {
                const int n = 16 * NV - 64 * h < 64 ? 16 * NV - 64 * h : 64;
                const __m512i b = n == 64 ? _mm512_loadu_si512(vp + 64 * h)
                                          : _mm512_maskz_loadu_epi8(((__mmask64)1 << n) - 1, vp + 64 * h);
                nan[h] = _mm512_max_epu8(nan[h], _mm512_and_si512(b, _mm512_set1_epi8(0x7f)));
            }
        pfc_step(pc, per);
        for (int h = 0; h < R; h++) {
            __m512 w = _mm512_set1_ps(p[(size_t)h * ldp + c]);
            for (int u = 0; u < NV; u++) acc[h * NV + u] = _mm512_fmadd_ps(w, x[u], acc[h * NV + u]);
        }
    }
    __mmask64 bad[2] = {0, 0}; /* dims where a NaN byte was multiplied in */
    if (scan)
        for (int h = 0; 64 * h < 16 * NV; h++) bad[h] = _mm512_cmpeq_epi8_mask(nan[h], _mm512_set1_epi8(0x7f));
    for (int h = 0; h < R; h++)
        for (int u = NS; u < NV; u++) {
            __m512 r = acc[h * NV + u];
            if (in != 1.0f) r = _mm512_mul_ps(r, _mm512_set1_ps(256.0f));
            if (scan) r = _mm512_mask_mov_ps(r, (__mmask16)(bad[u / 4] >> (16 * (u % 4))), _mm512_set1_ps(NAN));
            _mm512_store_ps(o + (size_t)h * dp + j + 16 * u, r);
        }
    /* even dims e, odd dims o of 32 -> dims 0-15 and 16-31 */
    const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i hi = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    for (int h = 0; h < R; h++)
        for (int u = 0; u < NS; u += 2) {
            float *oh = o + (size_t)h * dp + j + 16 * u;
            const __m512 e = acc[h * NV + u], d = acc[h * NV + u + 1];
            const __m512 al = _mm512_set1_ps(alpha ? alpha[h] : 1.0f);
            const __m512 d0 = _mm512_permutex2var_ps(e, lo, d), d1 = _mm512_permutex2var_ps(e, hi, d);
            _mm512_store_ps(oh, _mm512_fmadd_ps(_mm512_load_ps(oh), al, d0));
            _mm512_store_ps(oh + 16, _mm512_fmadd_ps(_mm512_load_ps(oh + 16), al, d1));
        }
}

/* dims [j, j + 16) of the R rows at o, as pvz_chunk with NV 1, over cache rows whose last n
 * (< 16) values start at dim j: masked loads (cvt16m), nothing read after them (pv_src_tail).
 * Its own loop, not pvz_chunk's with a variable width: that made the E5M2 decode at head size
 * 128 3-5% slower, L2-resident. The fp8 tags convert as their f16 forms with the NaN fix-up
 * (E4M3 2^-8 times its value, as cvt16r), so no byte test is needed. */
AI void pvz_tail(int R, pa_dtype dt, const void *const *vr, const int *idx, int nv, const float *p, int ldp, int j,
                 int n, int dp, const float *alpha, float *o, pa__cpu_pfc *pc, int per)
{
    const pa_dtype t = dt == PA__CPU_E4M3L || dt == PA__CPU_E4M3F ? PA_DTYPE_FP8_E4M3
                       : dt == PA__CPU_E5M2L                      ? PA_DTYPE_FP8_E5M2
                       : dt == PA__CPU_E4M3B                      ? PA__CPU_E4M3BN
                                                                  : dt;
    const float in = pa__cpu_is_e4m3(t) ? 1.0f / 256.0f : 1.0f;
    __m512 acc[12];
    for (int h = 0; h < R; h++)
        acc[h] = _mm512_mul_ps(_mm512_load_ps(o + (size_t)h * dp + j), _mm512_set1_ps((alpha ? alpha[h] : 1.0f) * in));
    for (int i = 0; i < nv; i++) {
        const int c = idx ? idx[i] : i;
        const __m512 x = cvt16m(t, (const char *)vr[c] + (size_t)j * esize(t), n);
        pfc_step(pc, per);
        for (int h = 0; h < R; h++) acc[h] = _mm512_fmadd_ps(_mm512_set1_ps(p[(size_t)h * ldp + c]), x, acc[h]);
    }
    for (int h = 0; h < R; h++)
        _mm512_store_ps(o + (size_t)h * dp + j, in != 1.0f ? _mm512_mul_ps(acc[h], _mm512_set1_ps(256.0f)) : acc[h]);
}

/* R rows (1..6 or 12) over all dims: chunks of NVmax = 12 / R vectors (at most 8), except over
 * cache rows (decode) 4 rows take 4 and 2 rows 8: 16 accumulators (4 rows over bf16 rows: two
 * pairs). Against 3 and 6, cache-resident decode 16 x 4096: GQA 4 E4M3 9.51 -> 9.10 ms, its f16
 * forms 10.57 -> 10.00, f32 9.50 -> 8.54; GQA 2 E4M3 6.89 -> 6.30, f16 5.20 -> 4.81; from DRAM
 * E4M3 10.56 -> 10.35 (GQA 4), 8.42 -> 8.04 (GQA 2); bench/NOTES.md, twenty-ninth pass. The last
 * chunk narrower; pf's rows prefetched before each chunk in proportion to its width. */
/* pvz_rows' chunks: dims [j, end) in chunks of at most NVM vectors (n <= NVM always holds where
 * a case is reached; the guard keeps the accumulator count of unreachable instances within the
 * array). A macro, so that pvz_rows_t repeats it without a change to pvz_rows' code (below). */
#define PVZ_CASE(n)                                                                                  \
    case n:                                                                                          \
        if (n <= NVM) pvz_chunk(R, n <= NVM ? n : 1, dt, vr, vd, idx, nv, p, ldp, j, dp, alpha, o, &pc, per); \
        break;
#define PVZ_CHUNKS(end)                                                                              \
    while (j < (end)) {                                                                              \
        int w = ((end) - j) / 16 < NVM ? ((end) - j) / 16 : NVM;                                     \
        switch (w) {                                                                                 \
            PVZ_CASE(8)                                                                              \
            PVZ_CASE(7)                                                                              \
            PVZ_CASE(6)                                                                              \
            PVZ_CASE(5)                                                                              \
            PVZ_CASE(4)                                                                              \
            PVZ_CASE(3)                                                                              \
            PVZ_CASE(2)                                                                              \
        default: pvz_chunk(R, 1, dt, vr, vd, idx, nv, p, ldp, j, dp, alpha, o, &pc, per); break;     \
        }                                                                                            \
        j += 16 * w;                                                                                 \
    }

AI void pvz_rows_in(int R, pa_dtype dt, const void *const *vr, const float *vd, const int *idx, int nv,
                    const float *p, int ldp, int dp, const float *alpha, float *o, const pa__cpu_pf *pf)
{
    /* (vr: cache rows, bf16 ones pair-split in pvz_chunk; vd: a dense tile) */
    const int NVM = vr && (R == 2 || R == 4) ? 16 / R : R == 8 ? 2 : R >= 4 ? 12 / R : R == 3 ? 4 : R == 2 ? 6 : 8;
    pa__cpu_pfc pc = pfc_init(pf);
    const int per = pfc_per(pf, (dp / 16 + NVM - 1) / NVM * nv);
    int j = 0;
    PVZ_CHUNKS(dp)
    pfc_step(&pc, -1);
}

/* pvz_rows over fp8 cache rows by the tables (f8l), one function per format and row count (1..4:
 * pv_src_lut's groups). Inlined into pv_src_lut beside every other instance, gcc kept the
 * accumulators of the chunks narrower than 64 dims in memory as well, storing all of them on
 * every key: with that, head size 96 took longer than 128 (bench/NOTES.md, fiftieth pass). */
#define PVF_ROWS(T, t, R)                                                                                \
    static __attribute__((noinline)) void pv_rows##R##_##t##_lut(const void *const *vr, const int *idx, int nv, \
                                                             const float *p, int ldp, int dp,            \
                                                             const float *alpha, float *o,               \
                                                             const pa__cpu_pf *pf)                       \
    {                                                                                                    \
        pvz_rows_in(R, PA__CPU_##T, vr, NULL, idx, nv, p, ldp, dp, alpha, o, pf);                         \
    }
PVF_ROWS(E4M3L, e4m3, 1)
PVF_ROWS(E4M3L, e4m3, 2)
PVF_ROWS(E4M3L, e4m3, 3)
PVF_ROWS(E4M3L, e4m3, 4)
PVF_ROWS(E5M2L, e5m2, 1)
PVF_ROWS(E5M2L, e5m2, 2)
PVF_ROWS(E5M2L, e5m2, 3)
PVF_ROWS(E5M2L, e5m2, 4)
#undef PVF_ROWS

AI void pvz_rows(int R, pa_dtype dt, const void *const *vr, const float *vd, const int *idx, int nv,
                 const float *p, int ldp, int dp, const float *alpha, float *o, const pa__cpu_pf *pf)
{
    if (!f8l(dt)) {
        pvz_rows_in(R, dt, vr, vd, idx, nv, p, ldp, dp, alpha, o, pf);
        return;
    }
#define PVF_CASE(t)                                                                                      \
    switch (R) {                                                                                         \
    case 1: pv_rows1_##t##_lut(vr, idx, nv, p, ldp, dp, alpha, o, pf); break;                            \
    case 2: pv_rows2_##t##_lut(vr, idx, nv, p, ldp, dp, alpha, o, pf); break;                            \
    case 3: pv_rows3_##t##_lut(vr, idx, nv, p, ldp, dp, alpha, o, pf); break;                            \
    case 4: pv_rows4_##t##_lut(vr, idx, nv, p, ldp, dp, alpha, o, pf); break;                            \
    default: __builtin_trap(); /* (never: groups of at most 4 rows) */                                  \
    }
    if (dt == PA__CPU_E4M3L) PVF_CASE(e4m3)
    else PVF_CASE(e5m2)
#undef PVF_CASE
}

/* pvz_rows for the tail entries (qk_src_tail, pv_src_tail): R 4 or 1, the whole vectors in
 * pvz_rows' chunks, the last d % 16 dims by pvz_tail. Its own function rather than a flag in
 * pvz_rows and pvz_all: with one (constant in every instance) gcc still allocated the registers
 * of those differently, and the f32 prefill's PV over cache rows (a5_pv_rows8) ran 5% slower
 * (bench/NOTES.md, forty-fourth pass). */
AI void pvz_rows_t(int R, pa_dtype dt, const void *const *vr, const int *idx, int nv, const float *p, int ldp, int d,
                   int dp, const float *alpha, float *o, const pa__cpu_pf *pf)
{
    const float *const vd = NULL;
    const int NVM = R == 4 ? 4 : 8; /* (pvz_rows' widths over cache rows) */
    const int df = d / 16 * 16;
    pa__cpu_pfc pc = pfc_init(pf);
    const int per = pfc_per(pf, ((df / 16 + NVM - 1) / NVM + 1) * nv);
    int j = 0;
    PVZ_CHUNKS(df)
    if (j < d) pvz_tail(R, dt, vr, idx, nv, p, ldp, j, d - j, dp, alpha, o, &pc, per);
    pfc_step(&pc, -1);
}
#undef PVZ_CHUNKS
#undef PVZ_CASE

/* Rows in groups of G (4 for decode; for prefill tiles 12, one 16-dim vector per row, so each
 * broadcast probability feeds one FMA and becomes an embedded broadcast, see a5_qk_t12, or 8,
 * two vectors per row), the rest
 * in groups of at most 6, over
 * keys in runs of up to 64 (the driver's tiles are one run; alpha applies with the first);
 * masked keys are left out of the run's list (never multiplied in: their V may be NaN). */
AI void pvz_all(int G, pa_dtype dt, const void *const *vr, const float *vd, int nc, const float *p, int ldp,
                int nr, int dp, const float *alpha, const unsigned char *colmask, float *o,
                const pa__cpu_pf *pf)
{
    int idx[64];
    for (int c0 = 0; c0 == 0 || c0 < nc; c0 += 64) {
        int n = nc - c0 < 64 ? nc - c0 : 64, nv = n;
        const int *ip = NULL;
        if (colmask) {
            nv = 0;
            for (int c = 0; c < n; c++)
                if (colmask[c0 + c]) idx[nv++] = c;
            ip = idx;
        }
        const void *const *vrc = vr ? vr + c0 : NULL;
        const float *vdc = vd ? vd + (size_t)c0 * dp : NULL, *al = c0 == 0 ? alpha : NULL;
        const pa__cpu_pf *pfc = c0 == 0 ? pf : NULL;
        for (int r = 0, take; r < nr; r += take) {
            /* a whole group, else the rest in groups of at most 6 */
            take = nr - r >= G ? G : (nr - r > 6 ? 6 : nr - r);
            pa__cpu_pf part = pf_range(pfc, r, r + take, nr); /* in proportion to the group's rows */
            const pa__cpu_pf *pp = pfc ? &part : NULL;
            const float *pr = p + (size_t)r * ldp + c0, *ar = al ? al + r : NULL;
            float *orow = o + (size_t)r * dp;
            switch (take) {
            case 12: pvz_rows(12, dt, vrc, vdc, ip, nv, pr, ldp, dp, ar, orow, pp); break;
            case 8: pvz_rows(8, dt, vrc, vdc, ip, nv, pr, ldp, dp, ar, orow, pp); break;
            case 6: pvz_rows(6, dt, vrc, vdc, ip, nv, pr, ldp, dp, ar, orow, pp); break;
            case 5: pvz_rows(5, dt, vrc, vdc, ip, nv, pr, ldp, dp, ar, orow, pp); break;
            case 4: pvz_rows(4, dt, vrc, vdc, ip, nv, pr, ldp, dp, ar, orow, pp); break;
            case 3: pvz_rows(3, dt, vrc, vdc, ip, nv, pr, ldp, dp, ar, orow, pp); break;
            case 2: pvz_rows(2, dt, vrc, vdc, ip, nv, pr, ldp, dp, ar, orow, pp); break;
            default: pvz_rows(1, dt, vrc, vdc, ip, nv, pr, ldp, dp, ar, orow, pp); break;
            }
        }
    }
}

/* pvz_all for the tail entries: rows by 4, then one by one (pvz_rows_t) */
AI void pvz_all_t(pa_dtype dt, const void *const *vr, int nc, const float *p, int ldp, int nr, int d, int dp,
                  const float *alpha, const unsigned char *colmask, float *o, const pa__cpu_pf *pf)
{
    int idx[64];
    for (int c0 = 0; c0 == 0 || c0 < nc; c0 += 64) {
        int n = nc - c0 < 64 ? nc - c0 : 64, nv = n;
        const int *ip = NULL;
        if (colmask) {
            nv = 0;
            for (int c = 0; c < n; c++)
                if (colmask[c0 + c]) idx[nv++] = c;
            ip = idx;
        }
        const float *al = c0 == 0 ? alpha : NULL;
        const pa__cpu_pf *pfc = c0 == 0 ? pf : NULL;
        for (int r = 0, take; r < nr; r += take) {
            take = nr - r >= 4 ? 4 : 1;
            pa__cpu_pf part = pf_range(pfc, r, r + take, nr);
            const pa__cpu_pf *pp = pfc ? &part : NULL;
            const float *pr = p + (size_t)r * ldp + c0, *ar = al ? al + r : NULL;
            if (take == 4) pvz_rows_t(4, dt, vr + c0, ip, nv, pr, ldp, d, dp, ar, o + (size_t)r * dp, pp);
            else pvz_rows_t(1, dt, vr + c0, ip, nv, pr, ldp, d, dp, ar, o + (size_t)r * dp, pp);
        }
    }
}

/* E4M3 V rows (PA__CPU_E4M3B or PA_DTYPE_FP8_E4M3, as a5_pv_src takes them). Rows of 8 or more
 * queries (GQA 8) in groups of 8 (32 dims at a time): each V vector converted once for 8 rows
 * instead of twice (16 x 4096, GQA 8, one thread, from DRAM: 17.63 -> 16.72 ms, the f16 forms
 * 20.71 -> 17.41; f16 rows, whose conversion is one instruction, were 1-3% slower so and keep
 * groups of 4). Its own function: inlined into a5_pv_src, the groups of 8 cost the f16 case 4%
 * (bench/NOTES.md, twenty-ninth pass). The rows go without the NaN fix-up, their NaN bytes
 * marked per dim (pvz_chunk). */
static __attribute__((noinline)) void pv_src_e4m3(bool words, const void *const *vrows, int nc, const float *p,
                                                  int ldp, int nr, int dp, const float *alpha,
                                                  const unsigned char *colmask, float *o, const pa__cpu_pf *pf)
{
    float ps[16 * CPU_KT] __attribute__((aligned(64)));
    words = words && nr <= 16 && nc <= CPU_KT;
    if (words) { /* (V as words 2^-120 times the value, so the probabilities 2^120 times theirs) */
        pa__cpu_probs_up(p, ldp, nr, nc, ps);
        p = ps, ldp = CPU_KT;
    }
    pvz_all(nr >= 8 ? 8 : 4, words ? PA__CPU_E4M3B : PA__CPU_E4M3F, vrows, NULL, nc, p, ldp, nr, dp, alpha,
            colmask, o, pf);
}

/* fp8 V rows by the tables (f8l; a5_pv_src_lt); its own function, as pv_src_e4m3 */
static __attribute__((noinline)) void pv_src_lut(pa_dtype dt, const void *const *vrows, int nc, const float *p,
                                                 int ldp, int nr, int dp, const float *alpha,
                                                 const unsigned char *colmask, float *o, const pa__cpu_pf *pf)
{
    /* (groups of 4 rows: pvz_rows' chunks are then whole 64-dim groups but at the end) */
    if (dt == PA__CPU_E4M3L) pvz_all(4, PA__CPU_E4M3L, vrows, NULL, nc, p, ldp, nr, dp, alpha, colmask, o, pf);
    else pvz_all(4, PA__CPU_E5M2L, vrows, NULL, nc, p, ldp, nr, dp, alpha, colmask, o, pf);
}

/* pv_src_tail (cpu.h): a5_pv_src's kernels with a masked last chunk (T: pvz_tail) */
static void a5_pv_src_tail(pa_dtype dtype, const void *const *vrows, int nc, const float *p, int ldp, int nr, int d,
                           int dp, const float *alpha, const unsigned char *colmask, float *o, const pa__cpu_pf *pf)
{
    /* (both E4M3 forms by the f16 one with the NaN fix-up: the words form's probabilities
     * would be scaled by 2^120 first, and the values are the same) */
    switch ((int)dtype) {
    case PA_DTYPE_F32: pvz_all_t(PA_DTYPE_F32, vrows, nc, p, ldp, nr, d, dp, alpha, colmask, o, pf); break;
    case PA_DTYPE_F16: pvz_all_t(PA_DTYPE_F16, vrows, nc, p, ldp, nr, d, dp, alpha, colmask, o, pf); break;
    case PA_DTYPE_BF16: pvz_all_t(PA_DTYPE_BF16, vrows, nc, p, ldp, nr, d, dp, alpha, colmask, o, pf); break;
    case PA__CPU_E4M3B:
    case PA_DTYPE_FP8_E4M3:
        pvz_all_t(PA_DTYPE_FP8_E4M3, vrows, nc, p, ldp, nr, d, dp, alpha, colmask, o, pf);
        break;
    case PA_DTYPE_FP8_E5M2:
        pvz_all_t(PA_DTYPE_FP8_E5M2, vrows, nc, p, ldp, nr, d, dp, alpha, colmask, o, pf);
        break;
    default: break;
    }
}


static void a5_pv_src(pa_dtype dtype, const void *const *vrows, int nc, const float *p, int ldp, int nr,
                      int dp, const float *alpha, const unsigned char *colmask, float *o,
                      const pa__cpu_pf *pf)
{
    switch ((int)dtype) {
    case PA__CPU_E4M3B: pv_src_e4m3(true, vrows, nc, p, ldp, nr, dp, alpha, colmask, o, pf); break;
    case PA_DTYPE_F32: pvz_all(4, PA_DTYPE_F32, vrows, NULL, nc, p, ldp, nr, dp, alpha, colmask, o, pf); break;
    case PA_DTYPE_F16: pvz_all(4, PA_DTYPE_F16, vrows, NULL, nc, p, ldp, nr, dp, alpha, colmask, o, pf); break;
    case PA_DTYPE_BF16:
        pvz_all(4, PA_DTYPE_BF16, vrows, NULL, nc, p, ldp, nr, dp, alpha, colmask, o, pf);
        break;
    case PA_DTYPE_FP8_E4M3: pv_src_e4m3(false, vrows, nc, p, ldp, nr, dp, alpha, colmask, o, pf); break;
    case PA_DTYPE_FP8_E5M2:
        pvz_all(4, PA_DTYPE_FP8_E5M2, vrows, NULL, nc, p, ldp, nr, dp, alpha, colmask, o, pf);
        break;
    default: break;
    }
}

/* (the driver's stride CPU_KT and unmasked tiles get their own instance: with ldp and the mask
 * as variables the key loop of the AVX2 twin reloaded row offsets from the stack, and this one
 * multiplied by dp from the stack for every key) */
AI void pv_tile(int G, const float *p, int ldp, int nr, const float *v, int nc, int dp, const float *alpha,
                const unsigned char *colmask, float *o, const pa__cpu_pf *pf)
{
    /* pf: pvz_all spreads it over its row groups (as the decode rows, at CPU_KPFL) */
    if (ldp == CPU_KT && !colmask) pvz_all(G, PA_DTYPE_F32, NULL, v, nc, p, CPU_KT, nr, dp, alpha, NULL, o, pf);
    else pvz_all(G, PA_DTYPE_F32, NULL, v, nc, p, ldp, nr, dp, alpha, colmask, o, pf);
}

/* Prefill PV over the converted V tile, two blockings as prefill QK (a5_qk_t12, a5_qk_t8), for
 * the same reason: 12 rows x 16 dims, each broadcast probability one FMA's embedded broadcast
 * (Zen 4); 8 rows x 32 dims elsewhere, 10 loads per 16 FMAs against 13 per 12 (an Intel core
 * issues two 512-bit loads per cycle). 2048-token causal f32 prefill on one core of the Xeon,
 * with the exp16 change, one process alternating: median 339.8 -> 326.7 ms; the PV change alone
 * 332.4 (bench/NOTES.md, twenty-seventh pass). */
static void a5_pv12(const float *p, int ldp, int nr, const float *v, int nc, int dp, const float *alpha,
                    const unsigned char *colmask, float *o, const pa__cpu_pf *pf)
{
    pv_tile(12, p, ldp, nr, v, nc, dp, alpha, colmask, o, pf);
}

static void a5_pv8(const float *p, int ldp, int nr, const float *v, int nc, int dp, const float *alpha,
                   const unsigned char *colmask, float *o, const pa__cpu_pf *pf)
{
    pv_tile(8, p, ldp, nr, v, nc, dp, alpha, colmask, o, pf);
}

/* pv_rows (cpu.h): the same blockings over fp32 rows where they lie */
static void a5_pv_rows12(const float *p, int ldp, int nr, const void *const *vrows, int nc, int dp,
                         const float *alpha, const unsigned char *colmask, float *o, const pa__cpu_pf *pf)
{
    pvz_all(12, PA_DTYPE_F32, vrows, NULL, nc, p, ldp, nr, dp, alpha, colmask, o, pf);
}

static void a5_pv_rows8(const float *p, int ldp, int nr, const void *const *vrows, int nc, int dp,
                        const float *alpha, const unsigned char *colmask, float *o, const pa__cpu_pf *pf)
{
    pvz_all(8, PA_DTYPE_F32, vrows, NULL, nc, p, ldp, nr, dp, alpha, colmask, o, pf);
}

/* ---- prefill QK over the transposed K tile ------------------------------------------------ */

/* R rows x 16 KB keys from c0: R x KB accumulators, one broadcast of q per row and dimension;
 * the head in chunks of CPU_QK_CHUNK dims, their sums in groups (g), the group sums added to the
 * total in S (cpu.h). */
PA__QK_GROUP_SCRATCH_BEGIN
AI void qktz_block(int R, int KB, const float *q, const float *kt, int c0, int dp, float *s, int lds)
{
    float g[16 * 16] __attribute__((aligned(64))); /* the group's sums so far (cpu.h) */
    for (int j0 = 0; j0 < dp; j0 += CPU_QK_CHUNK) {
        const int j1 = dp - j0 > CPU_QK_CHUNK ? j0 + CPU_QK_CHUNK : dp;
        __m512 a[16];
        for (int i = 0; i < R * KB; i++) a[i] = _mm512_setzero_ps();
        for (int j = j0; j < j1; j++) {
            __m512 k[2];
            for (int u = 0; u < KB; u++) k[u] = _mm512_load_ps(kt + (size_t)j * CPU_KT + c0 + 16 * u);
            for (int i = 0; i < R; i++) {
                __m512 b = _mm512_set1_ps(q[(size_t)i * dp + j]);
                for (int u = 0; u < KB; u++) a[i * KB + u] = _mm512_fmadd_ps(b, k[u], a[i * KB + u]);
            }
        }
        const int c = j0 / CPU_QK_CHUNK;
        if (!qk_group_step(a, R * KB, g, c, j1 == dp)) continue;
        for (int i = 0; i < R; i++)
            for (int u = 0; u < KB; u++) {
                float *si = s + (size_t)i * lds + c0 + 16 * u;
                _mm512_storeu_ps(si, c >= CPU_QK_GROUP ? _mm512_add_ps(_mm512_loadu_ps(si), a[i * KB + u]) : a[i * KB + u]);
            }
    }
}
PA__QK_GROUP_SCRATCH_END

AI void qktz_rows(int R, const float *q, const float *kt, int n16, int dp, float *s, int lds)
{
    int c0 = 0;
    for (; c0 + 32 <= n16; c0 += 32) qktz_block(R, 2, q, kt, c0, dp, s, lds);
    if (c0 < n16) qktz_block(R, 1, q, kt, c0, dp, s, lds);
}

/* Prefill QK, two blockings (each row's sums are the same FMAs in the same order in either):
 * - G = 12 rows x 16 keys (the default on Zen 4 only, pa__cpu_avx512_rows12): each broadcast
 *   query element feeds one FMA, so the compiler folds it into the FMA as an embedded broadcast
 *   ({1to16}). With 6 rows x 32 keys
 *   each broadcast fed two FMAs and stayed a separate vbroadcastss, which llvm-mca 19's Zen 4
 *   model (-mcpu=znver4) runs on the FP1 pipe beside the FMAs: 18 cycles per 12 FMAs, against 12
 *   with embedded broadcasts (not timed on a Zen 4: none has been available).
 * - G = 8 rows x 32 keys (the default elsewhere): on Intel cores a broadcast from memory is a
 *   load alone, and 12 x 16 needs 13 loads per 12 FMAs, more than the two 512-bit loads per
 *   cycle that keep the FMAs fed; 8 x 32 needs 10 per 16. A 2048-token causal prefill on one
 *   core of an Intel Xeon (Emerald Rapids), three alternating rounds: f32 343-365 ms against
 *   373-452, bf16 342-355 against 359-392 (bench/NOTES.md, twenty-sixth pass). On a Zen 5
 *   EPYC (full-width 512-bit pipes) 8 x 32 for both QK and PV: f32 212 -> 190 ms, one thread
 *   (twenty-eighth pass).
 * The rows left over go in blocks of up to 6 x 32; pf is prefetched one share per block of G. */
AI void qk_t_rows(int G, const float *q, int nr, const float *kt, int nc, int dp, float *s, int lds,
                  const pa__cpu_pf *pf)
{
    int n16 = (nc + 15) & ~15, r = 0, ng = (nr + G - 1) / G;
    for (; r + G <= nr; r += G) {
        pf_share(pf, r / G, ng);
        if (G == 12)
            for (int c0 = 0; c0 < n16; c0 += 16)
                qktz_block(12, 1, q + (size_t)r * dp, kt, c0, dp, s + (size_t)r * lds, lds);
        else
            qktz_rows(8, q + (size_t)r * dp, kt, n16, dp, s + (size_t)r * lds, lds);
    }
    if (r < nr) pf_share(pf, ng - 1, ng);
    for (; r < nr; r += 6) {
        const float *qr = q + (size_t)r * dp;
        float *sr = s + (size_t)r * lds;
        switch (nr - r < 6 ? nr - r : 6) {
        case 6: qktz_rows(6, qr, kt, n16, dp, sr, lds); break;
        case 5: qktz_rows(5, qr, kt, n16, dp, sr, lds); break;
        case 4: qktz_rows(4, qr, kt, n16, dp, sr, lds); break;
        case 3: qktz_rows(3, qr, kt, n16, dp, sr, lds); break;
        case 2: qktz_rows(2, qr, kt, n16, dp, sr, lds); break;
        default: qktz_rows(1, qr, kt, n16, dp, sr, lds); break;
        }
    }
}

static void a5_qk_t12(const float *q, int nr, const float *kt, int nc, int dp, float *s, int lds,
                      const pa__cpu_pf *pf)
{
    qk_t_rows(12, q, nr, kt, nc, dp, s, lds, pf);
}

static void a5_qk_t8(const float *q, int nr, const float *kt, int nc, int dp, float *s, int lds,
                     const pa__cpu_pf *pf)
{
    qk_t_rows(8, q, nr, kt, nc, dp, s, lds, pf);
}

/* ---- softmax: exp ------------------------------------------------------------------------- */

/* The AVX2 path's exp8 at 16 lanes (the same constants and, but for the last step's vscalefps,
 * operations; the same bits per element): Cody-Waite reduction by ln 2, Cephes expf's degree-6
 * polynomial, ~1 ulp; inputs clamped to [-104, 0] (the softmax's s - m). Below -87.3 the result
 * is an fp32 subnormal or 0, as the contract's fp32 exp has it (vscalefps rounds p 2^n once,
 * subnormals kept in the default environment); until 2026-11-30 the clamp was at -87.3, and a
 * key more than 87.3 below its row's maximum weighed 2^-126 (bench/NOTES.md, thirty-sixth
 * pass).
 * With sh > 0 (a constant): 2^sh exp(x) for x down to -131, +0 below (and for NaN), the same
 * steps but for n + sh in the vscalefps: wherever exp(x) is an fp32 normal, exactly 2^sh times
 * the unshifted value, and at sh = 64 never a subnormal (a softmax weight: p_exp, cpu.h). Two
 * operations more (a compare, an add; the vscalefps zero-masked). */
AI __m512 exp16k(__m512 x, const int sh)
{
    const __mmask16 keep = sh ? _mm512_cmp_ps_mask(x, _mm512_set1_ps(-PA__CPU_FAR_LIMIT), _CMP_GE_OQ) : (__mmask16)0xffff;
    x = _mm512_max_ps(x, _mm512_set1_ps(sh ? -PA__CPU_FAR_LIMIT : -104.0f));
    x = _mm512_min_ps(x, _mm512_setzero_ps());
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500E-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507E-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073E-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894E-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459E-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201E-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    /* p 2^n by vscalefps (one operation, against a conversion, two adds and shifts and two
     * multiplies building 2^n in two factors): the same product, rounded once */
    if (!sh) return _mm512_scalef_ps(p, n);
    return _mm512_maskz_scalef_ps(keep, p, _mm512_add_ps(n, _mm512_set1_ps((float)sh)));
}

AI __m512 exp16(__m512 x) { return exp16k(x, 0); }


/* s[i .. i + 16) where `live` is set = the weights exp16k(s - m, sh), -0 where s is -inf (a
 * masked key); returns them, zeros in the other lanes (which are neither read nor written) */
AI __m512 exp16_store(float *s, __mmask16 live, __m512 vm, const int sh)
{
    __m512 x = _mm512_maskz_loadu_ps(live, s);
    __m512 e = exp16k(_mm512_sub_ps(x, vm), sh);
    e = _mm512_mask_mov_ps(e, _mm512_cmp_ps_mask(x, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ), _mm512_set1_ps(-0.0f));
    _mm512_mask_storeu_ps(s, live, e);
    return _mm512_maskz_mov_ps(live, e);
}

/* exp_row's values (stored) and its sum vector, unreduced: 16 lanes at a time, two vectors per
 * step (independent chains), the last partial vectors under a mask instead of expf one by one (a
 * decode tile of 32 keys is one step; a sequence's last tile had up to 7 keys through expf on the
 * AVX2 path) */
AI __m512 exp_row_acc(float *s, int n, __m512 vm, const int sh)
{
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 e0 = exp16_store(s + i, 0xffff, vm, sh), e1 = exp16_store(s + i + 16, 0xffff, vm, sh);
        acc = _mm512_add_ps(_mm512_add_ps(acc, e0), e1);
    }
    for (; i < n; i += 16) {
        const int left = n - i;
        acc = _mm512_add_ps(acc, exp16_store(s + i, left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u), vm, sh));
    }
    return acc;
}

static float a5_exp_row(float *s, int n, float m)
{
    return hsum1z(exp_row_acc(s, n, _mm512_set1_ps(m), PA__CPU_P_EXP));
}

static float a5_exp_row_unscaled(float *s, int n, float m)
{
    return hsum1z(exp_row_acc(s, n, _mm512_set1_ps(m), 0));
}

/* any_neg_inf (cpu.h): x is -inf exactly when its bits XOR those of -inf are 0, so the unsigned
 * minimum of those, in two independent chains (a tail's lanes past nc left as they were). As
 * vector minima it costs nothing measurable; the first version, a compare to a mask per vector
 * ORed into one mask, cost 2% of a cache-resident decode (bench/NOTES.md, thirty-fourth pass). */
static bool a5_any_neg_inf(const float *s, int lds, int nr, int nc)
{
    const __m512i ninf = _mm512_set1_epi32((int)0xff800000u);
    __m512i a = _mm512_set1_epi32(-1), b = a;
    for (int r = 0; r < nr; r++) {
        const float *sr = s + (size_t)r * lds;
        int c = 0;
        for (; c + 32 <= nc; c += 32) {
            a = _mm512_min_epu32(a, _mm512_xor_si512(_mm512_loadu_si512(sr + c), ninf));
            b = _mm512_min_epu32(b, _mm512_xor_si512(_mm512_loadu_si512(sr + c + 16), ninf));
        }
        for (; c < nc; c += 16) {
            const __mmask16 live = nc - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (nc - c)) - 1u);
            a = _mm512_mask_min_epu32(a, live, a, _mm512_xor_si512(_mm512_castps_si512(_mm512_maskz_loadu_ps(live, sr + c)), ninf));
        }
    }
    return _mm512_cmpeq_epi32_mask(_mm512_min_epu32(a, b), _mm512_setzero_si512()) != 0;
}

/* softcap_rows (cpu.h): tanh of y = s / cap 16 lanes at a time, where the driver's loop called
 * tanhf per score (a 2048-token causal f32 prefill with a soft-cap took 3.2x the time without,
 * bench/NOTES.md, thirty-eighth pass). |y| < 0.5: y (1 + y^2 P(y^2)), the series to y^15
 * (truncation below 1e-8 relative); beyond: (1 - e) / (1 + e), e = exp(-2 |y|) by exp16 (1 - e
 * >= 0.63 there: no cancellation), the sign put back; e = 0 from |y| > 52 on, so +-inf gives
 * +-1. NaN lanes are passed through (exp16 clamps a NaN). */
static void a5_softcap_rows(float *s, int lds, int nr, int nc, float cap)
{
    const __m512 inv = _mm512_set1_ps(1.0f / cap), vcap = _mm512_set1_ps(cap), one = _mm512_set1_ps(1.0f);
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nc; c += 16) {
            const __mmask16 live = nc - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (nc - c)) - 1u);
            float *p = s + (size_t)r * lds + c;
            const __m512 y = _mm512_mul_ps(_mm512_maskz_loadu_ps(live, p), inv);
            const __m512 a = _mm512_castsi512_ps(_mm512_andnot_si512(sign, _mm512_castps_si512(y)));
            /* large: (1 - e) / (1 + e) */
            const __m512 e = exp16(_mm512_mul_ps(a, _mm512_set1_ps(-2.0f)));
            const __m512 big = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
            /* small: the odd series of tanh in y^2 (Horner from y^15's coefficient) */
            const __m512 y2 = _mm512_mul_ps(a, a);
            __m512 q = _mm512_set1_ps(pa__cpu_tanh_series[0]);
            for (int i = 1; i < PA__CPU_TANH_SERIES_N; i++) q = _mm512_fmadd_ps(q, y2, _mm512_set1_ps(pa__cpu_tanh_series[i]));
            const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(q, y2), a, a);
            const __mmask16 lo = _mm512_cmp_ps_mask(a, _mm512_set1_ps(0.5f), _CMP_LT_OQ);
            __m512 t = _mm512_mask_blend_ps(lo, big, small);
            t = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_castps_si512(t), _mm512_castps_si512(y), sign,
                                                              0xf8)); /* t | (y & sign): the sign of y */
            t = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q), t, y);
            _mm512_mask_storeu_ps(p, live, _mm512_mul_ps(vcap, t));
        }
}

/* softmax_rows (cpu.h): the rows 16 at a time, their maxima and sums by hred16z's trees (one
 * tree per 16 rows where row_max and exp_row reduce each row on its own), the running maxima,
 * sums and rescale factors as vectors. The sums are exp_row's: the same vectors, reduced in
 * hsum1z's order. (Replaces, per row and tile, two calls and the driver's scalar bookkeeping;
 * bench/NOTES.md, thirtieth pass.) */
AI bool softmax_rows_k(float *s, int lds, int nr, int nc, float *m, float *l, float *alpha, const int sh)
{
    if (nr < 1 || nr > CPU_ROWS || nc < 1 || nc > CPU_KT) return false;
    float mn[CPU_ROWS] __attribute__((aligned(64)));
    const __m512 ninf = _mm512_set1_ps(-INFINITY), pinf = _mm512_set1_ps(INFINITY);
    const int nv = (nc + 15) / 16;
    const __mmask16 tail = nc % 16 ? (__mmask16)((1u << nc % 16) - 1u) : (__mmask16)0xffff;
    __mmask16 odd = 0; /* a NaN score, or an infinite maximum: declined */
    for (int r0 = 0; r0 < nr; r0 += 16) {
        const int g = nr - r0 < 16 ? nr - r0 : 16;
        const __mmask16 live = (__mmask16)(g == 16 ? 0xffffu : (1u << g) - 1u);
        __m512 mx[16];
        for (int i = 0; i < 16; i++) {
            const float *sr = s + (size_t)(r0 + (i < g ? i : g - 1)) * lds;
            __m512 x = ninf;
            for (int v = 0; v < nv; v++) {
                const __m512 y = _mm512_mask_loadu_ps(ninf, v == nv - 1 ? tail : (__mmask16)0xffff, sr + 16 * v);
                odd |= _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q);
                x = _mm512_max_ps(x, y);
            }
            mx[i] = x;
        }
        const __m512 t = hred16z(true, mx);
        odd |= _mm512_cmp_ps_mask(t, ninf, _CMP_EQ_OQ) | _mm512_cmp_ps_mask(t, pinf, _CMP_EQ_OQ);
        /* max(mx, m): m where equal, as the driver's "mx > m ? mx : m" */
        _mm512_store_ps(mn + r0, _mm512_max_ps(t, _mm512_maskz_loadu_ps(live, m + r0)));
    }
    if (odd) return false;
    for (int r = 0; r < nr; r++) /* a maximum that rose by more than 87: the driver's loop */
        if (pa__cpu_far(m[r] - mn[r])) return false;
    for (int r0 = 0; r0 < nr; r0 += 16) {
        const int g = nr - r0 < 16 ? nr - r0 : 16;
        const __mmask16 live = (__mmask16)(g == 16 ? 0xffffu : (1u << g) - 1u);
        __m512 acc[16];
        for (int i = 0; i < 16; i++)
            acc[i] = i < g ? exp_row_acc(s + (size_t)(r0 + i) * lds, nc, _mm512_set1_ps(mn[r0 + i]), sh) : _mm512_setzero_ps();
        const __m512 sum = hred16z(false, acc), vmn = _mm512_load_ps(mn + r0);
        const __m512 mo = _mm512_maskz_loadu_ps(live, m + r0);
        const __mmask16 same = _mm512_cmp_ps_mask(mo, vmn, _CMP_EQ_OQ);
        const __mmask16 fresh = _mm512_cmp_ps_mask(mo, ninf, _CMP_EQ_OQ);
        float al[16] __attribute__((aligned(64)));
        _mm512_store_ps(al, _mm512_mask_blend_ps(same, _mm512_setzero_ps(), _mm512_set1_ps(1.0f)));
        /* a larger maximum than the running one (rare after the first tiles): the loop's rule */
        for (unsigned w = live & ~(unsigned)same & ~(unsigned)fresh; w; w &= w - 1) {
            const int i = __builtin_ctz(w);
            al[i] = pa__cpu_alpha(m[r0 + i], mn[r0 + i]);
        }
        const __m512 va = _mm512_load_ps(al);
        const __m512 vl = _mm512_add_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(live, l + r0), va), sum);
        _mm512_mask_storeu_ps(l + r0, live, vl);
        _mm512_mask_storeu_ps(m + r0, live, vmn);
        _mm512_mask_storeu_ps(alpha + r0, live, va);
    }
    return true;
}

static bool a5_softmax_rows(float *s, int lds, int nr, int nc, float *m, float *l, float *alpha)
{
    return softmax_rows_k(s, lds, nr, nc, m, l, alpha, PA__CPU_P_EXP);
}

static bool a5_softmax_rows_unscaled(float *s, int lds, int nr, int nc, float *m, float *l, float *alpha)
{
    return softmax_rows_k(s, lds, nr, nc, m, l, alpha, 0);
}

/* a5_qk_src and a5_pv_src with fp8 rows by the tables (the init's lut; only the *_lut functions
 * hold the permutes: tests/scripts/check_isa_objects.sh) */
/* a5_qk_src_tail and a5_pv_src_tail with fp8 rows by the tables */
static void a5_qk_src_tail_lut(pa_dtype dtype, const void *const *krows, int nc, const float *q, int nr, int d, int dp,
                               float *s, int lds, const pa__cpu_pf *pf)
{
    if (dtype == PA_DTYPE_FP8_E4M3) qkz_src(false, true, PA__CPU_E4M3L, krows, nc, q, nr, d, dp, s, lds, pf);
    else if (dtype == PA_DTYPE_FP8_E5M2) qkz_src(false, true, PA__CPU_E5M2L, krows, nc, q, nr, d, dp, s, lds, pf);
    else a5_qk_src_tail(dtype, krows, nc, q, nr, d, dp, s, lds, pf);
}

static void a5_pv_src_tail_lut(pa_dtype dtype, const void *const *vrows, int nc, const float *p, int ldp, int nr,
                               int d, int dp, const float *alpha, const unsigned char *colmask, float *o,
                               const pa__cpu_pf *pf)
{
    if (dtype == PA_DTYPE_FP8_E4M3) pvz_all_t(PA__CPU_E4M3L, vrows, nc, p, ldp, nr, d, dp, alpha, colmask, o, pf);
    else if (dtype == PA_DTYPE_FP8_E5M2) pvz_all_t(PA__CPU_E5M2L, vrows, nc, p, ldp, nr, d, dp, alpha, colmask, o, pf);
    else a5_pv_src_tail(dtype, vrows, nc, p, ldp, nr, d, dp, alpha, colmask, o, pf);
}

static void a5_qk_src_lut(pa_dtype dtype, const void *const *krows, int nc, const float *q, int nr, int dp,
                          float *s, int lds, const pa__cpu_pf *pf)
{
    if (dtype == PA_DTYPE_FP8_E4M3) qkz_src(false, false, PA__CPU_E4M3L, krows, nc, q, nr, dp, dp, s, lds, pf);
    else if (dtype == PA_DTYPE_FP8_E5M2) qkz_src(false, false, PA__CPU_E5M2L, krows, nc, q, nr, dp, dp, s, lds, pf);
    else a5_qk_src(dtype, krows, nc, q, nr, dp, s, lds, pf);
}

static void a5_pv_src_lt(pa_dtype dtype, const void *const *vrows, int nc, const float *p, int ldp, int nr, int dp,
                        const float *alpha, const unsigned char *colmask, float *o, const pa__cpu_pf *pf)
{
    if (dtype == PA_DTYPE_FP8_E4M3) pv_src_lut(PA__CPU_E4M3L, vrows, nc, p, ldp, nr, dp, alpha, colmask, o, pf);
    else if (dtype == PA_DTYPE_FP8_E5M2) pv_src_lut(PA__CPU_E5M2L, vrows, nc, p, ldp, nr, dp, alpha, colmask, o, pf);
    else a5_pv_src(dtype, vrows, nc, p, ldp, nr, dp, alpha, colmask, o, pf);
}

void pa__cpu_kernels_init_avx512(pa__cpu_kernels *k, bool rows12, int lut)
{
    k->name = "avx512";
    /* 9-16 query rows per KV head straight from f16 and fp8 caches: 16 x 4096, one thread, a
     * 3-token step at GQA 4 over f16 75.9 -> 45.5 ms, over E4M3 66 -> 47, GQA 9 f16 28.4 ->
     * 20.4, E5M2 2 tokens at GQA 8 81 -> 62 (E5M2 at GQA 16 +3%; bench/NOTES.md) */
    k->direct_rows_f16 = k->direct_rows_fp8 = 16;
    k->load_rows = a5_load_rows;
    k->pv = rows12 ? a5_pv12 : a5_pv8;
    k->pv_rows = rows12 ? a5_pv_rows12 : a5_pv_rows8;
    k->qk_src = a5_qk_src;
    k->qk_src_pairs = a5_qk_src_pairs;
    k->pair_span = 32;
    k->pv_src = a5_pv_src;
    k->qk_t = rows12 ? a5_qk_t12 : a5_qk_t8;
    k->exp_row = a5_exp_row;
    k->softmax_rows = a5_softmax_rows;
    k->p_exp = PA__CPU_P_EXP;
    k->exp_row_unscaled = a5_exp_row_unscaled;
    k->softmax_rows_unscaled = a5_softmax_rows_unscaled;
    k->any_neg_inf = a5_any_neg_inf;
    k->softcap_rows = a5_softcap_rows;
    k->pf_spread = true;
    k->qk_src_tail = a5_qk_src_tail;
    k->pv_src_tail = a5_pv_src_tail;
    k->tail_align = 1;
    k->e4m3_bf16 = lut != PA__CPU_LUT_ALL; /* (lut: the driver passes the fp8 dtypes as they are) */
    if (lut == PA__CPU_LUT_ALL) {
        k->qk_src = a5_qk_src_lut, k->pv_src = a5_pv_src_lt, k->fp8_lut = true;
        k->qk_src_tail = a5_qk_src_tail_lut, k->pv_src_tail = a5_pv_src_tail_lut;
    } else if (lut == PA__CPU_LUT_PV) {
        k->pv_src = a5_pv_src_lt, k->pv_src_tail = a5_pv_src_tail_lut, k->pv_fp8_lut = true;
    }
    /* kept from the AVX2 table: qk (dense rows, unused while qk_t and qk_src cover every tile
     * shape the driver makes), load_rows_t (same tile layout), row_max, store_row */
}
