/* test_cpu_direct_tail.c: the AVX-512 and AVX2 decode kernels for head sizes that are not
 * multiples of 16 (qk_src_tail and pv_src_tail, cpu.h), called directly. They read each cache
 * row's d values and nothing after them: AVX-512 the last d % 16 by masked loads, AVX2 (head sizes
 * that are multiples of 8, its tail_align) 8-dim steps that end where the row does. Here every key row ends where a page
 * ends and the next page is unmapped (PROT_NONE), so a kernel that reads a byte past a row dies
 * of SIGSEGV, with or without a sanitizer. Every cache dtype (and the E4M3 forms the driver
 * passes: bf16 words, PA__CPU_E4M3B, on the table without byte tables), both tables (without and,
 * where the CPU has AVX512-VBMI, with the fp8 byte tables), head sizes 1 to 509 (every d % 16 and
 * d % 64 the kernels branch on), 1 to 16 query rows, 1 to 64 keys, alpha given or not, and a
 * column mask whose hidden keys hold NaN. Each score and output is held to a double-precision
 * sum: NaN exactly where that sum is NaN (a NaN value in a listed key), else within fp32
 * rounding; score columns past nc keep what they held, o's dims past d become alpha times it.
 * Skips where this build or this CPU has neither path. */
#define _DEFAULT_SOURCE /* (MAP_ANONYMOUS) */
#include "test.h"

#include "backends/cpu/cpu.h"
#include "test_cpu_tables.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static uint64_t rng = 0x853c49e6748fea9bull;
static uint32_t next_u32(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

/* the value of element i of a row of dtype dt (E4M3 also for PA__CPU_E4M3B), from the format */
static double value(pa_dtype dt, const unsigned char *row, int i)
{
    if (dt == PA_DTYPE_F32) {
        float f;
        memcpy(&f, row + 4 * i, 4);
        return f;
    }
    if (dt == PA_DTYPE_F16 || dt == PA_DTYPE_BF16) {
        const unsigned h = row[2 * i] | (unsigned)row[2 * i + 1] << 8;
        if (dt == PA_DTYPE_BF16) {
            const uint32_t u = (uint32_t)h << 16;
            float f;
            memcpy(&f, &u, 4);
            return f;
        }
        const int e = h >> 10 & 31, m = h & 1023;
        const double v = e == 31 ? (m ? NAN : INFINITY) : e ? ldexp(1.0 + m / 1024.0, e - 15) : ldexp(m, -24);
        return h & 0x8000 ? -v : v;
    }
    const unsigned b = row[i];
    double v;
    if (dt == PA_DTYPE_FP8_E5M2) {
        const int e = b >> 2 & 31, m = b & 3;
        if (e == 31) return m ? NAN : (b & 0x80 ? -INFINITY : INFINITY);
        v = e ? ldexp(1.0 + m / 4.0, e - 15) : ldexp(m / 4.0, -14);
    } else {
        if ((b & 0x7f) == 0x7f) return NAN;
        const int e = b >> 3 & 15, m = b & 7;
        v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    }
    return b & 0x80 ? -v : v;
}

/* element i of a row: a value of modest size (|x| < 2^3; fp8 subnormals included), or NaN */
static void put(pa_dtype dt, unsigned char *row, int i, bool nan)
{
    const uint32_t s = next_u32() & 1;
    if (dt == PA_DTYPE_F32 || dt == PA_DTYPE_BF16) {
        const uint32_t u = nan ? 0x7fc00000u : s << 31 | (120u + next_u32() % 10) << 23 | (next_u32() & 0x7f) << 16;
        if (dt == PA_DTYPE_F32) memcpy(row + 4 * i, &u, 4);
        else row[2 * i] = (unsigned char)(u >> 16), row[2 * i + 1] = (unsigned char)(u >> 24);
    } else if (dt == PA_DTYPE_F16) {
        const unsigned h = nan ? 0x7e00u : s << 15 | (8u + next_u32() % 10) << 10 | (next_u32() & 1023);
        row[2 * i] = (unsigned char)h, row[2 * i + 1] = (unsigned char)(h >> 8);
    } else if (dt == PA_DTYPE_FP8_E5M2) {
        row[i] = (unsigned char)(nan ? 0x7f : s << 7 | (next_u32() % 18) << 2 | (next_u32() & 3));
    } else {
        row[i] = (unsigned char)(nan ? (s ? 0xff : 0x7f) : s << 7 | (next_u32() % 10) << 3 | (next_u32() & 7));
    }
}

enum { NR = 16, DMAX = 512, SENT = 12345 };

static int bad;

static bool close_to(double want, double mag, float got)
{
    if (isnan(want)) return isnan(got);
    return !isnan(got) && fabs((double)got - want) <= 1e-5 * mag + 1e-30;
}

int main(void)
{
    if (!pa_backend_find("cpu") || !pa__cpu_kernels_init_generic || !pa__cpu_detect || !pa__cpu_isa_usable) {
        printf("SKIP: this build has no cpu backend\n");
        return 77;
    }
    pa__cpu_features f;
    pa__cpu_detect(&f);
    const bool run2 = pa__cpu_kernels_init_avx2 && pa__cpu_isa_usable(PA__ISA_AVX2, &f);
    const bool run5 = run2 && pa__cpu_kernels_init_avx512 && pa__cpu_isa_usable(PA__ISA_AVX512, &f);
    if (!run2) {
        printf("SKIP: this build or this CPU has no AVX2 path (nor AVX-512)\n");
        return 77;
    }
    if (!run5) printf("this build or this CPU has no AVX-512 path: the AVX2 kernels only\n");
    const long page = sysconf(_SC_PAGESIZE);
    /* key c's row ends at the end of page 2c; page 2c + 1 is unmapped */
    unsigned char *pool = mmap(NULL, (size_t)page * 2 * CPU_KT, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(pool != MAP_FAILED);
    if (pool == MAP_FAILED) return test_exit();
    for (int c = 0; c < CPU_KT; c++) CHECK(mprotect(pool + (size_t)page * (2 * c + 1), (size_t)page, PROT_NONE) == 0);
    CHECK(page >= 4 * DMAX);

    float *q = aligned_alloc(64, sizeof(float) * NR * DMAX), *o = aligned_alloc(64, sizeof(float) * NR * DMAX);
    float *s = aligned_alloc(64, sizeof(float) * NR * CPU_KT), *p = aligned_alloc(64, sizeof(float) * NR * CPU_KT);
    float *o0 = malloc(sizeof(float) * NR * DMAX), alpha[NR];
    const void *rows[CPU_KT];
    unsigned char colmask[CPU_KT];
    const int ds[] = {1, 7, 8, 15, 24, 40, 56, 63, 72, 88, 100, 104, 120, 136, 200, 248, 250, 509};
    const int nrs[] = {1, 2, 3, 4, 5, 8, 12, 16}, ncs[] = {1, 3, 16, 31, 64};
    const pa_dtype dts[] = {PA_DTYPE_F32,       PA_DTYPE_F16,       PA_DTYPE_BF16,
                            PA_DTYPE_FP8_E4M3, PA_DTYPE_FP8_E5M2, PA__CPU_E4M3B};
    int cases = 0, nan_scores = 0, nan_outputs = 0;
    /* tables: 0 AVX2, 1 AVX-512, 2 AVX-512 with the fp8 byte tables */
    for (int tb = 0; tb < 3; tb++) {
        const bool lut = tb == 2;
        if (tb && !run5) continue;
        if (lut && !f.avx512vbmi) {
            printf("no AVX512-VBMI: the byte-table kernels not run\n");
            continue;
        }
        pa__cpu_kernels k;
        pa__cpu_kernels_init_generic(&k);
        pa__cpu_kernels_init_avx2(&k);
        if (tb) pa__cpu_kernels_init_avx512(&k, false, lut);
        CHECK(k.qk_src_tail != NULL && k.pv_src_tail != NULL && k.tail_align == (tb ? 1 : 8));
        if (!k.qk_src_tail || !k.pv_src_tail || k.tail_align < 1) break;
        for (size_t di = 0; di < sizeof dts / sizeof dts[0]; di++)
            for (size_t dj = 0; dj < sizeof ds / sizeof ds[0]; dj++)
                for (int rep = 0; rep < 4; rep++) {
                    if (ds[dj] % k.tail_align) continue;
                    const pa_dtype dt = dts[di], vt = dt == PA__CPU_E4M3B ? PA_DTYPE_FP8_E4M3 : dt;
                    const int d = ds[dj], dp = pa__cpu_dpad(d), es = (int)pa_dtype_size(vt);
                    const int nr = nrs[next_u32() % 8], nc = ncs[(dj + (size_t)rep) % 5];
                    const bool masked = rep & 1, scaled = rep & 2;
                    /* NaN: one value of one key in half the cases, at the row's last dims
                     * mostly; the hidden keys' whole rows */
                    const int nan_key = rep < 2 ? (int)(next_u32() % (uint32_t)nc) : -1;
                    const int nan_dim = next_u32() % 2 ? d - 1 - (int)(next_u32() % (uint32_t)(d % 16 ? d % 16 : 1))
                                                       : (int)(next_u32() % (uint32_t)d);
                    for (int c = 0; c < nc; c++) {
                        colmask[c] = (unsigned char)(!masked || c == nan_key || next_u32() % 4 != 0);
                        unsigned char *row = pool + (size_t)page * (2 * c + 1) - (size_t)d * es;
                        for (int j = 0; j < d; j++) put(vt, row, j, !colmask[c] || (c == nan_key && j == nan_dim));
                        rows[c] = row;
                    }
                    /* QK: E4M3 as bf16 words takes the query rows 2^120 times (cpu.h) */
                    const float up = dt == PA__CPU_E4M3B ? PA__CPU_E4M3_UP : 1.0f;
                    for (int r = 0; r < nr; r++) {
                        for (int j = 0; j < dp; j++)
                            q[r * dp + j] = j < d ? ((float)(next_u32() % 2001) / 1000.0f - 1.0f) : 0.0f;
                        for (int c = 0; c < CPU_KT; c++) s[r * CPU_KT + c] = SENT;
                    }
                    for (int i = 0; i < nr * dp; i++) q[i] *= up;
                    k.qk_src_tail(dt, rows, nc, q, nr, d, dp, s, CPU_KT, NULL);
                    for (int r = 0; r < nr; r++)
                        for (int c = 0; c < CPU_KT; c++) {
                            const float got = s[r * CPU_KT + c];
                            if (c >= nc) {
                                if (got != SENT && bad++ < 8) TEST_FAIL("QK wrote s[%d][%d] past nc %d", r, c, nc);
                                continue;
                            }
                            double want = 0, mag = 0;
                            for (int j = 0; j < d; j++) {
                                const double t = (double)(q[r * dp + j] / up) * value(vt, rows[c], j);
                                want += t, mag += fabs(t);
                            }
                            nan_scores += isnan(want);
                            if (!close_to(want, mag, got) && bad++ < 8)
                                TEST_FAIL("QK %s %s, d %d, %d rows x %d keys: s[%d][%d] = %.9g, want %.9g",
                                          dt == PA__CPU_E4M3B ? "e4m3 words" : pa_dtype_name(dt), k.name,
                                          d, nr, nc, r, c, got, want);
                        }
                    /* PV: o's dims past d hold 3 and become 3 alpha (cpu.h), as the others */
                    for (int r = 0; r < nr; r++) {
                        alpha[r] = (float)(1 + next_u32() % 1000) / 1000.0f;
                        for (int c = 0; c < nc; c++) p[r * CPU_KT + c] = (float)(next_u32() % 1001) / 1000.0f;
                        for (int j = 0; j < dp; j++)
                            o[r * dp + j] = o0[r * dp + j] =
                                j < d ? (float)(next_u32() % 2001) / 100.0f - 10.0f : 3.0f;
                    }
                    k.pv_src_tail(dt, rows, nc, p, CPU_KT, nr, d, dp, scaled ? alpha : NULL, masked ? colmask : NULL,
                                  o, NULL);
                    for (int r = 0; r < nr; r++)
                        for (int j = 0; j < dp; j++) {
                            const float got = o[r * dp + j];
                            if (j >= d) {
                                const float want = scaled ? 3.0f * alpha[r] : 3.0f;
                                if (got != want && bad++ < 8)
                                    TEST_FAIL("PV o[%d][%d] past d %d: %.9g, want %.9g", r, j, d, got, want);
                                continue;
                            }
                            double want = (double)o0[r * dp + j] * (scaled ? alpha[r] : 1.0), mag = fabs(want);
                            for (int c = 0; c < nc; c++) {
                                if (masked && !colmask[c]) continue;
                                const double t = (double)p[r * CPU_KT + c] * value(vt, rows[c], j);
                                want += t, mag += fabs(t);
                            }
                            nan_outputs += isnan(want);
                            if (!close_to(want, mag, got) && bad++ < 8)
                                TEST_FAIL("PV %s %s, d %d, %d rows x %d keys%s%s: o[%d][%d] = %.9g, want %.9g",
                                          dt == PA__CPU_E4M3B ? "e4m3 words" : pa_dtype_name(dt), k.name,
                                          d, nr, nc, masked ? ", masked" : "", scaled ? ", alpha" : "", r, j, got, want);
                        }
                    cases++;
                }
    }
    test__checks++;
    CHECK_INT(bad, 0);
    CHECK(nan_scores > 0 && nan_outputs > 0); /* (the NaN values were among the listed keys) */
    printf("%d cases, %d NaN scores, %d NaN outputs\n", cases, nan_scores, nan_outputs);
    munmap(pool, (size_t)page * 2 * CPU_KT);
    free(q), free(o), free(s), free(p), free(o0);
    return test_exit();
}
