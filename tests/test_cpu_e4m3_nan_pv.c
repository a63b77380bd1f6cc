/* test_cpu_e4m3_nan_pv.c: the AVX-512 decode PV over E4M3 value rows holding NaN bytes
 * (S.1111.111), called directly. Those kernels convert the rows without the NaN fix-up, keep per
 * dim the bytes' low 7 bits' maxima as they go, and set to NaN, as they store them, the outputs
 * of the dims where a key they multiplied in held a NaN (cpu_avx512.c, pvz_chunk; until the
 * thirty-second pass they put the outputs back and did the call again with the fix-up, in
 * batches of at most 4096 outputs). The decode driver gives them at most 8 rows; the kernels'
 * contract takes any row count, and this test gives them up to 40 rows of up to 512 dims (every
 * chunk width of the kernels: 16 to 128 dims) as well as the driver's shapes,
 * with both E4M3 forms (bf16 words, PA__CPU_E4M3B, and f16, PA_DTYPE_FP8_E4M3), alpha given or
 * not, and a column mask whose hidden columns hold NaN bytes (never multiplied in). Each output
 * is held to a double-precision sum: NaN exactly where a listed key's value in that dim is NaN,
 * else within fp32 rounding. Skips where this build or this CPU has no AVX-512 path. */
#include "test.h"

#include "backends/cpu/cpu.h"
#include "test_cpu_tables.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t next_u32(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

/* The E4M3 value of b (NaN for S.1111.111), written out from the format. */
static double e4m3(unsigned char b)
{
    if ((b & 0x7f) == 0x7f) return NAN;
    const int e = b >> 3 & 15, m = b & 7;
    const double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    return b & 0x80 ? -v : v;
}

/* a random non-NaN byte of modest size (|x| <= 2^2), subnormals included */
static unsigned char byte(void)
{
    return (unsigned char)((next_u32() & 0x87) | (next_u32() % 10) << 3);
}

enum { NRMAX = 40, DMAX = 512 };

int main(void)
{
    const int skip = test_cpu_avx512_skip();
    if (skip) return skip;
    pa__cpu_kernels k;
    pa__cpu_kernels_init_generic(&k);
    if (pa__cpu_kernels_init_avx2) pa__cpu_kernels_init_avx2(&k); /* (as the backend builds the table) */
    pa__cpu_kernels_init_avx512(&k, false, false);
    CHECK(k.pv_src != NULL);
    if (!k.pv_src) return test_exit();

    unsigned char *v = malloc((size_t)CPU_KT * DMAX);
    float *p = malloc(sizeof(float) * NRMAX * CPU_KT), *o = aligned_alloc(64, sizeof(float) * NRMAX * DMAX);
    float *o0 = malloc(sizeof(float) * NRMAX * DMAX), alpha[NRMAX];
    const void *rows[CPU_KT];
    unsigned char colmask[CPU_KT];
    const int nrs[] = {1, 3, 4, 8, 12, 16, 33, 40}, dps[] = {16, 48, 80, 128, 256, 512};
    const pa_dtype forms[] = {PA__CPU_E4M3B, PA_DTYPE_FP8_E4M3};
    int cases = 0, nan_cases = 0, batched = 0, bad = 0;
    for (int it = 0; it < 1200; it++) {
        const int nr = nrs[it % 8], dp = dps[it / 8 % 6], nc = 1 + (int)(next_u32() % CPU_KT);
        const pa_dtype dt = forms[it / 48 % 2];
        const bool masked = it / 96 % 2, scaled = it / 192 % 2;
        /* V rows at scattered offsets of one buffer (row i at (i * 37) % CPU_KT), as cache rows */
        for (size_t i = 0; i < (size_t)CPU_KT * DMAX; i++) v[i] = byte();
        for (int c = 0; c < nc; c++) rows[c] = v + (size_t)(c * 37 % CPU_KT) * DMAX;
        for (int c = 0; c < nc; c++) colmask[c] = (unsigned char)(!masked || next_u32() % 4 != 0);
        /* NaN bytes: none in a third of the cases, else 1..3 at random keys and dims (hidden
         * columns included), positive or negative */
        const int nn = it % 3 == 0 ? 0 : 1 + (int)(next_u32() % 3);
        for (int i = 0; i < nn; i++) {
            unsigned char *row = (unsigned char *)rows[next_u32() % (uint32_t)nc];
            row[next_u32() % (uint32_t)dp] = next_u32() % 2 ? 0x7f : 0xff;
        }
        for (int r = 0; r < nr; r++) {
            alpha[r] = (float)(next_u32() % 1000) / 1000.0f;
            for (int c = 0; c < nc; c++) p[r * CPU_KT + c] = (float)(next_u32() % 1001) / 1000.0f;
            for (int j = 0; j < dp; j++) o[r * dp + j] = o0[r * dp + j] = (float)(next_u32() % 2001) / 100.0f - 10.0f;
        }
        k.pv_src(dt, rows, nc, p, CPU_KT, nr, dp, scaled ? alpha : NULL, masked ? colmask : NULL, o, NULL);
        bool any_nan = false;
        for (int r = 0; r < nr; r++)
            for (int j = 0; j < dp; j++) {
                double want = (double)o0[r * dp + j] * (scaled ? alpha[r] : 1.0), mag = fabs(want);
                for (int c = 0; c < nc; c++) {
                    if (masked && !colmask[c]) continue;
                    const double t = (double)p[r * CPU_KT + c] * e4m3(((const unsigned char *)rows[c])[j]);
                    want += t, mag += fabs(t);
                }
                const float got = o[r * dp + j];
                any_nan |= isnan(want);
                const bool ok = isnan(want) ? isnan(got) : !isnan(got) && fabs(got - want) <= 1e-5 * mag + 1e-30;
                if (!ok && bad++ < 5)
                    TEST_FAIL("form %s, %d rows x %d keys x %d dims%s%s: o[%d][%d] = %.9g, want %.9g",
                              dt == PA__CPU_E4M3B ? "words" : "f16", nr, nc, dp, masked ? ", masked" : "",
                              scaled ? ", alpha" : "", r, j, got, want);
            }
        cases++;
        nan_cases += any_nan;
        batched += any_nan && nr * dp > 4096;
    }
    test__checks++;
    CHECK_INT(bad, 0);
    CHECK(nan_cases > 400);   /* (most cases with NaN bytes have one among the listed keys) */
    CHECK(batched > 20);      /* the redo in batches ran */
    printf("%d cases, %d with NaN outputs, %d of those over several batches\n", cases, nan_cases, batched);
    free(v), free(p), free(o), free(o0);
    return test_exit();
}
