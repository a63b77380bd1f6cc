/* test_fpenv.c: the library computes in the default floating-point environment, whatever the
 * caller's. The caller here turns on flush-to-zero and denormals-are-zero (x86 MXCSR FTZ|DAZ,
 * Arm FPCR.FZ: what -ffast-math start-up code and torch.set_flush_denormal(True) do), rounds
 * upward and, where the C library can, enables the invalid and overflow traps (SIGFPE), then:
 *  - a set of grid cases (every E4M3-cache row, under both conversions on the AVX paths, and
 *    every thirteenth other row) on every cpu ISA path this machine runs, on 2
 *    threads, must give the bits they give in the default environment on 1 thread, and pass
 *    against the reference (the contexts are made in the caller's mode, so the pool's workers
 *    start in it too; the harness computes its inputs and the reference in the default
 *    environment, grid.c);
 *  - pa_merge_states, on the host and on a cpu context, pa_convert and pa_cache_read_token
 *    must give the bits of the default environment;
 *  - after those calls the caller's rounding mode, flush bits and exception flags are as they
 *    were (the library raises no flag of its own in the caller's environment). */
#define _GNU_SOURCE /* feenableexcept (glibc) */
#include "grid.h"
#include "test.h"
#include "test_cpu_isa.h"

#include <fenv.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

/* the caller's flush bits (0 where this test does not know the machine's) */
static unsigned long flush_bits(void)
{
#if defined(__x86_64__) || defined(__i386__)
    return _mm_getcsr() & 0x8040u; /* FTZ (bit 15), DAZ (bit 6) */
#elif defined(__aarch64__)
    uint64_t r;
    __asm__ __volatile__("mrs %0, fpcr" : "=r"(r));
    return (unsigned long)(r & (1u << 24)); /* FZ */
#else
    return 0;
#endif
}

static void set_flush(int on)
{
#if defined(__x86_64__) || defined(__i386__)
    _mm_setcsr(on ? _mm_getcsr() | 0x8040u : _mm_getcsr() & ~0x8040u);
#elif defined(__aarch64__)
    uint64_t r;
    __asm__ __volatile__("mrs %0, fpcr" : "=r"(r));
    r = on ? r | (1u << 24) : r & ~(uint64_t)(1u << 24);
    __asm__ __volatile__("msr fpcr, %0" : : "r"(r));
#else
    (void)on;
#endif
}

static unsigned long hostile_flush; /* flush_bits() in the hostile environment */

/* FP traps the caller enables where the C library can (glibc; hardware without trapping, as
 * most Arm cores, refuses, and the test goes on without them) */
#if defined(__GLIBC__) && defined(FE_INVALID) && defined(FE_OVERFLOW)
#define TRAPS (FE_INVALID | FE_OVERFLOW)
#endif
static int traps_on;

static void hostile(void)
{
#ifdef FE_UPWARD
    CHECK_INT(fesetround(FE_UPWARD), 0);
#endif
    set_flush(1);
    hostile_flush = flush_bits();
#ifdef TRAPS
    feclearexcept(FE_ALL_EXCEPT);
    traps_on = feenableexcept(TRAPS) != -1 && fegetexcept() == TRAPS;
#endif
}

static void friendly(void)
{
#ifdef TRAPS
    fedisableexcept(FE_ALL_EXCEPT);
#endif
    set_flush(0);
    CHECK_INT(fesetround(FE_TONEAREST), 0);
}

/* the caller's environment is the hostile one still */
static void check_still_hostile(const char *after)
{
#ifdef FE_UPWARD
    if (fegetround() != FE_UPWARD) TEST_FAIL("after %s: rounding mode %d, want FE_UPWARD", after, fegetround());
#endif
    if (flush_bits() != hostile_flush)
        TEST_FAIL("after %s: flush bits %#lx, want %#lx", after, flush_bits(), hostile_flush);
#ifdef TRAPS
    if (traps_on && fegetexcept() != TRAPS)
        TEST_FAIL("after %s: enabled traps %#x, want %#x", after, fegetexcept(), TRAPS);
#endif
    test__checks++;
}

static void run_cases(const pa_backend *cpu, const char *isa, const char *form, int fp8_only)
{
    const int two_forms = !strncmp(isa, "avx", 3);
    int n = 0, before = test__failures;
    for (int i = 0; i < grid_count(); i++) {
        pa_dtype q, kv, cache;
        CHECK_INT(grid_case_dtypes(i, &q, &kv, &cache), 0);
        const int e4m3 = cache == PA_DTYPE_FP8_E4M3;
        /* every E4M3 row and every 13th other; the E4M3 rows under each conversion where there
         * are two (fp8_only) */
        if (fp8_only ? !e4m3 : (e4m3 ? two_forms : i % 13 != 0)) continue;
        grid_result a, b;
        friendly();
        grid_run_case(cpu, i, 1, &a);
        hostile();
        grid_run_case(cpu, i, 2, &b);
        friendly();
        n++;
        const char *name = grid_case_name(i);
        if (a.failed)
            TEST_FAIL("isa %s, E4M3 conversion %s, default environment: %s: %s", isa, form, name,
                      a.reason);
        if (b.failed)
            TEST_FAIL("isa %s, E4M3 conversion %s, FTZ/DAZ + upward: %s: %s", isa, form, name,
                      b.reason);
        if (a.skipped != b.skipped || a.digest != b.digest)
            TEST_FAIL("isa %s, E4M3 conversion %s: %s: output bits %016llx in the default "
                      "environment, %016llx under FTZ/DAZ + rounding upward",
                      isa, form, name, (unsigned long long)a.digest, (unsigned long long)b.digest);
        test__checks += 3;
    }
    printf("isa %s, E4M3 conversion %s: %d cases, %s\n", isa, form, n,
           test__failures == before ? "the same bits in both environments" : "FAILED");
}

/* merge of two partial states whose arithmetic rounds (exp, division): bits in both
 * environments, flags raised by the caller kept and none added */
static void check_merge(pa_context *ctx, const char *where)
{
    enum { T = 3, H = 2, D = 8, E = T * H * D };
    float oa[E], ob[E], la[T * H], lb[T * H], o0[E], o1[E], l0[T * H], l1[T * H];
    for (int i = 0; i < E; i++) {
        oa[i] = (float)(i % 11) / 3.0f - 1.7f;
        ob[i] = 1.1f - (float)(i % 5) / 7.0f;
    }
    for (int i = 0; i < T * H; i++) {
        la[i] = 0.3f * (float)i - 0.9f;
        lb[i] = 1.3f - 0.7f * (float)i;
    }
    pa_merge_args m = {T, H, D, PA_DTYPE_F32, oa, la, ob, lb, o0, l0, 0, 0};
    friendly();
    CHECK_OK(pa_merge_states(ctx, &m));
    hostile();
    m.out = o1;
    m.out_lse = l1;
    feclearexcept(FE_ALL_EXCEPT);
    feraiseexcept(FE_DIVBYZERO);
    CHECK_OK(pa_merge_states(ctx, &m));
    int flags = fetestexcept(FE_ALL_EXCEPT);
    check_still_hostile(where);
    friendly();
    if (flags != FE_DIVBYZERO)
        TEST_FAIL("%s: exception flags %#x after the call, want only the caller's FE_DIVBYZERO (%#x)", where, flags,
                  FE_DIVBYZERO);
    if (memcmp(o0, o1, sizeof o0) || memcmp(l0, l1, sizeof l0))
        TEST_FAIL("%s: merged output or LSE bits differ under FTZ/DAZ + rounding upward", where);
    test__checks += 2;
}

/* pa_convert and pa_cache_read_token (which compute: the scale's quotient or product) give the
 * default environment's bits: inputs where FTZ/DAZ or rounding upward change them (subnormal
 * f32 over a scale of 2e-38, E4M3 codes times 2e-38 and times 0.1); until 2026-11-30 both ran
 * in the caller's environment (bench/NOTES.md, thirty-sixth pass) */
static void check_convert(void)
{
    enum { N = 128 };
    float src[N], f0[N], f1[N];
    uint8_t q0[N], q1[N], codes[N];
    for (int i = 0; i < N; i++) {
        uint32_t u = 0x00400000u + (uint32_t)i * 0x00010101u; /* f32 subnormals */
        memcpy(&src[i], &u, sizeof u);
        codes[i] = (uint8_t)i; /* every non-negative E4M3 code, its NaN included */
    }
    const float scales[2] = {2e-38f, 0.1f};
    for (int k = 0; k < 2; k++) {
        friendly();
        CHECK_OK(pa_convert(PA_DTYPE_FP8_E4M3, q0, PA_DTYPE_F32, src, N, 2e-38f));
        CHECK_OK(pa_convert(PA_DTYPE_F32, f0, PA_DTYPE_FP8_E4M3, codes, N, scales[k]));
        hostile();
        feclearexcept(FE_ALL_EXCEPT);
        feraiseexcept(FE_DIVBYZERO);
        CHECK_OK(pa_convert(PA_DTYPE_FP8_E4M3, q1, PA_DTYPE_F32, src, N, 2e-38f));
        CHECK_OK(pa_convert(PA_DTYPE_F32, f1, PA_DTYPE_FP8_E4M3, codes, N, scales[k]));
        int flags = fetestexcept(FE_ALL_EXCEPT);
        check_still_hostile("pa_convert");
        friendly();
        if (flags != FE_DIVBYZERO)
            TEST_FAIL("pa_convert: exception flags %#x after the calls, want %#x", flags, FE_DIVBYZERO);
        if (memcmp(q0, q1, sizeof q0)) TEST_FAIL("pa_convert f32 -> E4M3 / 2e-38: codes differ under FTZ/DAZ");
        if (memcmp(f0, f1, sizeof f0))
            TEST_FAIL("pa_convert E4M3 -> f32 * %g: bits differ under FTZ/DAZ, rounding upward", (double)scales[k]);
        test__checks += 2;
    }
    /* the same products through pa_cache_read_token, from a one-block E4M3 cache */
    pa_cache c;
    CHECK_OK(pa_cache_init(&c, PA_LAYOUT_NHD, PA_DTYPE_FP8_E4M3, 1, 1, 1, N));
    CHECK_OK(pa_cache_alloc(&c));
    memcpy(c.key, codes, N);
    memcpy(c.value, codes, N);
    float k0[N], v0[N], k1[N], v1[N];
    friendly();
    CHECK_OK(pa_cache_read_token(&c, 0, 2e-38f, 0.1f, k0, v0));
    hostile();
    CHECK_OK(pa_cache_read_token(&c, 0, 2e-38f, 0.1f, k1, v1));
    check_still_hostile("pa_cache_read_token");
    friendly();
    if (memcmp(k0, k1, sizeof k0) || memcmp(v0, v1, sizeof v0))
        TEST_FAIL("pa_cache_read_token: bits differ under FTZ/DAZ, rounding upward");
    test__checks++;
    pa_cache_free(&c);
}

int main(void)
{
    check_convert();
    const pa_backend *cpu = test_cpu_backend_or_skip();
    check_merge(NULL, "pa_merge_states on the host");
    printf("the caller's invalid and overflow traps: %s\n",
           traps_on ? "enabled" : "not available here (the test runs without them)");
    pa_context *ctx = NULL;
    hostile();
    CHECK_OK(pa_context_create(cpu, NULL, &ctx));
    friendly();
    check_merge(ctx, "pa_merge_states on a cpu context");
    pa_context_destroy(ctx);

    int ran = 0;
    for (int i = 0; i < TEST_CPU_NISA; i++) {
        if (!test_cpu_isa_set(cpu, test_cpu_isas[i])) {
            printf("isa %s: not runnable here, skipped\n", test_cpu_isas[i]);
            continue;
        }
        ran++;
        run_cases(cpu, test_cpu_isas[i], "default", 0);
        for (int f = 0; f < TEST_CPU_NFP8 && !strncmp(test_cpu_isas[i], "avx", 3); f++) {
            if (!test_cpu_fp8_form_distinct(test_cpu_isas[i], test_cpu_fp8_forms[f])) continue;
            setenv("PAGEDATTN_CPU_FP8", test_cpu_fp8_forms[f], 1);
            run_cases(cpu, test_cpu_isas[i], test_cpu_fp8_forms[f], 1);
        }
        unsetenv("PAGEDATTN_CPU_FP8");
    }
    unsetenv("PAGEDATTN_CPU_ISA");
    CHECK(ran >= 1);
    return test_exit();
}
