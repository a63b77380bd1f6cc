/* test_cpu_softcap_rows.c: a kernel table's soft-cap (cpu.h, softcap_rows) against cap * tanh(s /
 * cap) in double: within 3 fp32 ulps of the result (the contract's fp32 tanh), over scores from
 * 0 to 60 caps, densest around the table's switch between its series and its exp form (|s / cap|
 * = 0.5), tiny and subnormal scores, both signs, and the non-finite ones (NaN stays NaN, +-inf
 * becomes +-cap, -FLT_MAX, the driver's visible -inf, -cap); caps from 1e-3 to 1e4; every width
 * 1..CPU_KT (the tail under a mask or through a buffer) and nothing written past nc. Each table that has the kernel
 * and that this CPU runs; skips where none does. */
#include "test.h"

#include "backends/cpu/cpu.h"
#include "test_cpu_tables.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

#define LDS CPU_KT
#define SENT 12345.678f

static uint64_t rng = 0x2545f4914f6cdd1du;
static double rnd01(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) * 0x1p-53;
}

/* a score: mostly |s / cap| in [0, 2] around 0.5, some far, tiny or non-finite */
static float score(float cap)
{
    const double u = rnd01(), sg = rnd01() < 0.5 ? -1.0 : 1.0;
    if (u < 0.02) return rnd01() < 0.5 ? NAN : (float)(sg * INFINITY);
    if (u < 0.03) return -FLT_MAX;
    if (u < 0.06) return (float)(sg * 0x1p-140 * (1 + rnd01())); /* subnormal */
    if (u < 0.10) return (float)(sg * cap * 1e-6 * rnd01());
    if (u < 0.40) return (float)(sg * cap * (0.45 + 0.1 * rnd01()));
    if (u < 0.90) return (float)(sg * cap * 2.0 * rnd01());
    return (float)(sg * cap * 60.0 * rnd01());
}

static int check_table(const char *name, const pa__cpu_kernels *K)
{
    static float s[4 * LDS], in[4 * LDS];
    static const float caps[] = {1e-3f, 0.7f, 1.0f, 5.0f, 30.0f, 50.0f, 1e4f};
    int bad = 0;
    for (int round = 0; round < 400; round++) {
        const float cap = caps[round % 7];
        const int nr = 1 + round % 4, nc = 1 + (round * 7) % CPU_KT;
        for (int i = 0; i < 4 * LDS; i++) s[i] = SENT;
        for (int r = 0; r < nr; r++)
            for (int c = 0; c < nc; c++) s[r * LDS + c] = score(cap);
        for (int i = 0; i < 4 * LDS; i++) in[i] = s[i];
        K->softcap_rows(s, LDS, nr, nc, cap);
        for (int r = 0; r < 4; r++)
            for (int c = 0; c < LDS; c++) {
                const int i = r * LDS + c;
                const float got = s[i], x = in[i];
                if (r >= nr || c >= nc) {
                    if (got != SENT && bad++ < 5) TEST_FAIL("%s: s[%d][%d] written past nr %d x nc %d", name, r, c, nr, nc);
                    continue;
                }
                /* the contract's fp32: cap * tanhf(s * (1 / cap)), the quotient as the driver
                 * takes it; the reference in double from that quotient */
                const float y = x * (1.0f / cap);
                const double want = (double)cap * tanh((double)y);
                bool ok;
                if (isnan(x)) ok = isnan(got);
                else ok = fabs(got - want) <= 3.0 * (double)FLT_EPSILON * fabs(want) + 0x1p-149 * 4 * cap;
                if (!ok && bad++ < 5)
                    TEST_FAIL("%s: cap %g, s %.9g: got %.9g, want %.9g (%.2g ulps)", name, cap, x, got, want,
                              fabs(got - want) / (fabs(want) * FLT_EPSILON));
            }
        test__checks++;
    }
    return bad;
}

int main(void)
{
    if (!pa_backend_find("cpu")) {
        printf("SKIP: the cpu backend is not built\n");
        return 77;
    }
    int tables = 0;
    /* (the AVX2 table whether or not this build has the AVX-512 files: PAGEDATTN_CPU_AVX512=OFF) */
    if (pa__cpu_kernels_init_generic && pa__cpu_kernels_init_avx2 && pa__cpu_detect && pa__cpu_isa_usable) {
        pa__cpu_features f;
        pa__cpu_detect(&f);
        if (pa__cpu_kernels_init_avx512 && pa__cpu_isa_usable(PA__ISA_AVX512, &f)) {
            pa__cpu_kernels k;
            pa__cpu_kernels_init_generic(&k);
            pa__cpu_kernels_init_avx2(&k);
            pa__cpu_kernels_init_avx512(&k, false, false);
            if (k.softcap_rows) check_table("avx512", &k), tables++;
        }
        if (pa__cpu_isa_usable(PA__ISA_AVX2, &f)) {
            pa__cpu_kernels k;
            pa__cpu_kernels_init_generic(&k);
            pa__cpu_kernels_init_avx2(&k);
            if (k.softcap_rows) check_table("avx2", &k), tables++;
        }
    }
    if (pa__cpu_kernels_init_generic && pa__cpu_kernels_init_neon && pa__cpu_detect && pa__cpu_isa_usable) {
        pa__cpu_features f;
        pa__cpu_detect(&f);
        if (pa__cpu_isa_usable(PA__ISA_NEON, &f)) {
            pa__cpu_kernels k;
            pa__cpu_kernels_init_generic(&k);
            pa__cpu_kernels_init_neon(&k);
            if (k.softcap_rows) check_table("neon", &k), tables++;
        }
    }
    if (!tables) {
        printf("SKIP: no kernel table with softcap_rows runs on this CPU\n");
        return 77;
    }
    return test_exit();
}
