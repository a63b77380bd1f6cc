/* test_cpu_isa.h: walking the cpu backend's ISA paths in a test (include after test.h, with
 * _POSIX_C_SOURCE defined for setenv). */
#ifndef PAGEDATTN_TEST_CPU_ISA_H
#define PAGEDATTN_TEST_CPU_ISA_H

static const char *const test_cpu_isas[] = {"generic", "avx2", "avx512", "avx512bf16", "neon"};
#define TEST_CPU_NISA ((int)(sizeof test_cpu_isas / sizeof *test_cpu_isas))

/* Points the cpu backend at ISA path `isa` (PAGEDATTN_CPU_ISA, read when a context is created);
 * 0 when this machine cannot run it. */
static inline int test_cpu_isa_set(const pa_backend *cpu, const char *isa)
{
    setenv("PAGEDATTN_CPU_ISA", isa, 1);
    pa_context *probe = NULL;
    if (pa_context_create(cpu, NULL, &probe) == PA_STATUS_UNAVAILABLE) return 0;
    pa_context_destroy(probe);
    return 1;
}

/* The E4M3 decode conversions (PAGEDATTN_CPU_FP8, read when a context is created): the backend
 * picks one by CPU vendor; tests of fp8 run both on every ISA path (the paths without bf16-word
 * kernels run f16 forms either way). */
static const char *const test_cpu_fp8_forms[] = {"f16", "bf16"};
#define TEST_CPU_NFP8 2

#endif
