/* cpu_avx512.c: AVX-512 (F, BW, VL) kernels, compiled with their own flags and chosen at run
 * time only after CPUID + XGETBV (XCR0 opmask/ZMM state) say the machine runs them. They
 * override the conversion, QK and PV entries of the AVX2 table (installed first); the softmax
 * pieces and the output store stay AVX2. Arithmetic is fp32 FMA: the AVX512-BF16 dot product
 * (vdpbf16ps) would need the queries rounded to bf16, which the numerics contract forbids.
 * NOTE: written on an AVX2-only machine: checked on the whole case grid with the intrinsics
 * emulated by SIMDe (bench/check_avx512_simde.sh), never yet run on AVX-512 hardware. */
#include "../cpu.h"

#include <immintrin.h>

static inline __m512 cvt16(pa_dtype dtype, const char *p)
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
        __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
        __m512i mag = _mm512_and_si512(x, _mm512_set1_epi32(0x7f));
        __m512 f = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(mag, 20)),
                                 _mm512_set1_ps(0x1p120f));
        __m512i sign = _mm512_slli_epi32(_mm512_and_si512(x, _mm512_set1_epi32(0x80)), 24);
        f = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(f), sign));
        __mmask16 nan = _mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7f));
        return _mm512_mask_mov_ps(f, nan, _mm512_set1_ps(NAN));
    }
    default: return _mm512_setzero_ps();
    }
}

static void a5_load_rows(pa_dtype dtype, const void *const *rows, int n, int d, int dp, float *dst)
{
    int dv = d & ~15;
    size_t esz = pa_dtype_size(dtype);
    for (int i = 0; i < n; i++) {
        float *o = dst + (size_t)i * dp;
        const char *src = rows[i];
        int j = 0;
        for (; j < dv; j += 16) _mm512_store_ps(o + j, cvt16(dtype, src + (size_t)j * esz));
        for (; j < d; j++) o[j] = pa__load_f32(dtype, src, j);
        for (; j < dp; j++) o[j] = 0.0f;
    }
}

static void a5_qk(const float *q, int nr, const float *k, int nc, int dp, float *s, int lds)
{
    int r = 0;
    for (; r + 4 <= nr; r += 4) {
        const float *q0 = q + (size_t)r * dp;
        int c = 0;
        for (; c + 2 <= nc; c += 2) {
            const float *k0 = k + (size_t)c * dp, *k1 = k0 + dp;
            __m512 a[4][2];
            for (int i = 0; i < 4; i++) a[i][0] = a[i][1] = _mm512_setzero_ps();
            for (int j = 0; j < dp; j += 16) {
                __m512 x0 = _mm512_load_ps(k0 + j), x1 = _mm512_load_ps(k1 + j);
                for (int i = 0; i < 4; i++) {
                    __m512 y = _mm512_load_ps(q0 + (size_t)i * dp + j);
                    a[i][0] = _mm512_fmadd_ps(y, x0, a[i][0]);
                    a[i][1] = _mm512_fmadd_ps(y, x1, a[i][1]);
                }
            }
            for (int i = 0; i < 4; i++) {
                s[(size_t)(r + i) * lds + c] = _mm512_reduce_add_ps(a[i][0]);
                s[(size_t)(r + i) * lds + c + 1] = _mm512_reduce_add_ps(a[i][1]);
            }
        }
        for (; c < nc; c++) {
            const float *k0 = k + (size_t)c * dp;
            for (int i = 0; i < 4; i++) {
                __m512 acc = _mm512_setzero_ps();
                for (int j = 0; j < dp; j += 16)
                    acc = _mm512_fmadd_ps(_mm512_load_ps(q0 + (size_t)i * dp + j), _mm512_load_ps(k0 + j), acc);
                s[(size_t)(r + i) * lds + c] = _mm512_reduce_add_ps(acc);
            }
        }
    }
    for (; r < nr; r++) {
        const float *q0 = q + (size_t)r * dp;
        for (int c = 0; c < nc; c++) {
            const float *kc = k + (size_t)c * dp;
            __m512 acc = _mm512_setzero_ps();
            for (int j = 0; j < dp; j += 16)
                acc = _mm512_fmadd_ps(_mm512_load_ps(q0 + j), _mm512_load_ps(kc + j), acc);
            s[(size_t)r * lds + c] = _mm512_reduce_add_ps(acc);
        }
    }
}

static void a5_pv(const float *p, int ldp, int nr, const float *v, int nc, int dp,
                  const float *alpha, const unsigned char *colmask, float *o)
{
    int r = 0;
    for (; r + 4 <= nr; r += 4) {
        for (int j = 0; j < dp; j += 16) {
            __m512 acc[4];
            for (int i = 0; i < 4; i++)
                acc[i] = _mm512_mul_ps(_mm512_load_ps(o + (size_t)(r + i) * dp + j),
                                       _mm512_set1_ps(alpha[r + i]));
            for (int c = 0; c < nc; c++) {
                if (colmask && !colmask[c]) continue;
                __m512 x = _mm512_load_ps(v + (size_t)c * dp + j);
                for (int i = 0; i < 4; i++)
                    acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(p[(size_t)(r + i) * ldp + c]), x, acc[i]);
            }
            for (int i = 0; i < 4; i++) _mm512_store_ps(o + (size_t)(r + i) * dp + j, acc[i]);
        }
    }
    for (; r < nr; r++) {
        float *orow = o + (size_t)r * dp;
        for (int j = 0; j < dp; j += 16) {
            __m512 acc = _mm512_mul_ps(_mm512_load_ps(orow + j), _mm512_set1_ps(alpha[r]));
            for (int c = 0; c < nc; c++) {
                if (colmask && !colmask[c]) continue;
                acc = _mm512_fmadd_ps(_mm512_set1_ps(p[(size_t)r * ldp + c]),
                                      _mm512_load_ps(v + (size_t)c * dp + j), acc);
            }
            _mm512_store_ps(orow + j, acc);
        }
    }
}

void pa__cpu_kernels_init_avx512(pa__cpu_kernels *k)
{
    k->name = "avx512";
    k->load_rows = a5_load_rows;
    k->qk = a5_qk;
    k->pv = a5_pv;
}
