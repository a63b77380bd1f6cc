/* cpu_avx512bf16.c: AVX512-BF16 dot products (vdpbf16ps), compiled with their own flags and
 * chosen at run time only where CPUID says AVX512_BF16 on top of the AVX-512 path's checks
 * (PAGEDATTN_CPU_ISA=avx512bf16). On top of the AVX-512 table it adds one kernel: decode QK for
 * bf16 queries over bf16 key rows, straight from the cache, with no conversion at all.
 *
 * Numerics: the queries are taken as given (bf16, unscaled) and the keys as stored, so every
 * product of two bf16 values is exact in fp32; vdpbf16ps adds them in fp32, and the layer's
 * scale multiplies the finished sums (the contract's s = scale * dot(q, k)). What differs from
 * the fp32 path is only the order of the additions, and that the instruction treats bf16
 * subnormals (below 2^-126) as zero. PV stays fp32 (the AVX-512 kernels).
 * NOTE: written on a machine without AVX-512: checked on the whole case grid with the intrinsics
 * emulated by SIMDe (bench/check_avx512_simde.sh), never yet run or timed on hardware. */
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

/* 32 bf16 values at p, or (m < 32) the first 16 and zeros (the rest is never read) */
AI __m512bh ld32(const void *p, int m)
{
    return as_bh(m == 32 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16((__mmask32)0xffff, p));
}

/* S[r][c0 .. c0 + KB) = scale * dot for the R rows at q: R x KB accumulators over 32-dim steps
 * (a last step of 16 when dp % 32 == 16). */
AI void qkb_block(int R, int KB, const void *const *krows, int c0, const uint16_t *q, int dp, float scale,
                  float *s, int lds)
{
    __m512 a[12];
    for (int i = 0; i < R * KB; i++) a[i] = _mm512_setzero_ps();
    for (int j = 0; j < dp; j += 32) {
        const int m = dp - j >= 32 ? 32 : 16;
        __m512bh x[12];
        for (int u = 0; u < KB; u++) x[u] = ld32((const uint16_t *)krows[c0 + u] + j, m);
        for (int h = 0; h < R; h++) {
            __m512bh w = ld32(q + (size_t)h * dp + j, m);
            for (int u = 0; u < KB; u++) a[h * KB + u] = _mm512_dpbf16_ps(a[h * KB + u], w, x[u]);
        }
    }
    float t[16];
    hsum_n(a, R * KB, t);
    for (int h = 0; h < R; h++)
        for (int u = 0; u < KB; u++) s[(size_t)h * lds + c0 + u] = t[h * KB + u] * scale;
}

AI void qkb_rows(int R, const void *const *krows, int nc, const uint16_t *q, int dp, float scale, float *s,
                 int lds, const pa__cpu_pf *pf)
{
    const int KB = R == 4 ? 3 : R == 3 ? 4 : R == 2 ? 6 : 8;
    int c = 0, pi = 0;
    for (; c + KB <= nc; c += KB) {
        qkb_block(R, KB, krows, c, q, dp, scale, s, lds);
        if (pf) {
            int pe = (int)((int64_t)(c + KB) * pf->n / nc);
            pf_rows(pf, pi, pe);
            pi = pe;
        }
    }
    for (; c < nc; c++) qkb_block(R, 1, krows, c, q, dp, scale, s, lds);
    if (pf) pf_rows(pf, pi, pf->n);
}

static void a5b_qk_src_bf16(const void *const *krows, int nc, const uint16_t *q16, int nr, int dp, float scale,
                            float *s, int lds, const pa__cpu_pf *pf)
{
    int ng = (nr + 3) / 4;
    for (int r = 0; r < nr; r += 4) {
        pa__cpu_pf part = pf_part(pf, r / 4, ng);
        const pa__cpu_pf *pp = pf ? &part : NULL;
        const uint16_t *qr = q16 + (size_t)r * dp;
        float *sr = s + (size_t)r * lds;
        switch (nr - r < 4 ? nr - r : 4) {
        case 4: qkb_rows(4, krows, nc, qr, dp, scale, sr, lds, pp); break;
        case 3: qkb_rows(3, krows, nc, qr, dp, scale, sr, lds, pp); break;
        case 2: qkb_rows(2, krows, nc, qr, dp, scale, sr, lds, pp); break;
        default: qkb_rows(1, krows, nc, qr, dp, scale, sr, lds, pp); break;
        }
    }
}

/* ---- prefill: QK over the tile of bf16 pairs ------------------------------------------------ */

/* R rows x 16 KB keys from c0: one broadcast of a query pair (2 dims) per row and step; the head
 * in chunks of CPU_QK_CHUNK dims, each added to the (unscaled) total in S, which the last chunk
 * scales (cpu.h). */
AI void qktb_block(int R, int KB, const uint16_t *q, const uint32_t *kt2, int c0, int dp, float scale, float *s,
                   int lds)
{
    const int nw = dp / 2, cw = CPU_QK_CHUNK / 2;
    const __m512 sc = _mm512_set1_ps(scale);
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
        for (int i = 0; i < R; i++)
            for (int u = 0; u < KB; u++) {
                float *si = s + (size_t)i * lds + c0 + 16 * u;
                __m512 t = w0 ? _mm512_add_ps(_mm512_loadu_ps(si), a[i * KB + u]) : a[i * KB + u];
                _mm512_storeu_ps(si, w1 == nw ? _mm512_mul_ps(t, sc) : t);
            }
    }
}

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

void pa__cpu_kernels_init_avx512bf16(pa__cpu_kernels *k)
{
    k->name = "avx512bf16";
    k->qk_src_bf16 = a5b_qk_src_bf16;
    k->qk_t_bf16 = a5b_qk_t_bf16;
}
