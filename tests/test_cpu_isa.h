/* test_cpu_isa.h: walking the cpu backend's ISA paths in a test (include after test.h, with
 * _POSIX_C_SOURCE defined for setenv). */
#ifndef PAGEDATTN_TEST_CPU_ISA_H
#define PAGEDATTN_TEST_CPU_ISA_H

#include <string.h>

static const char *const test_cpu_isas[] = {"generic", "avx2", "avx512", "avx512bf16", "neon"};
#define TEST_CPU_NISA ((int)(sizeof test_cpu_isas / sizeof *test_cpu_isas))

/* The cpu backend; a build without one skips the test (exit 77, CTest's SKIP_RETURN_CODE). */
static inline const pa_backend *test_cpu_backend_or_skip(void)
{
    const pa_backend *cpu = pa_backend_find("cpu");
    if (!cpu) {
        printf("SKIP: this build has no cpu backend (configured with -DPAGEDATTN_CPU=OFF)\n");
        exit(77);
    }
    return cpu;
}

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

/* The fp8 decode conversions (PAGEDATTN_CPU_FP8, read when a context is created): the backend
 * picks one by CPU vendor; tests of fp8 run each on every ISA path (the paths without bf16-word
 * kernels, or without AVX512-VBMI tables, run f16 forms instead). */
static const char *const test_cpu_fp8_forms[] = {"f16", "bf16", "lut", "mixed"};
#define TEST_CPU_NFP8 4

/* Whether forcing fp8 form `form` on ISA path `isa` runs kernels of its own: the byte tables
 * exist on the AVX-512 paths only (elsewhere `lut` runs the f16 forms again and `mixed` the bf16
 * words; the slow tests skip that repeat). */
static inline int test_cpu_fp8_form_distinct(const char *isa, const char *form)
{
    return (strcmp(form, "lut") != 0 && strcmp(form, "mixed") != 0) || strncmp(isa, "avx512", 6) == 0;
}

/* out and lse (f32, poisoned first: nout and nlse elements) of one forward of one sequence
 * (context_len ctx, query_len qlen, block_size bs over the nb blocks of table) by `be`, its ISA
 * from the environment */
static inline void test_cpu_forward_one(const pa_backend *be, const pa_layer *layer, int64_t ctx, int64_t qlen,
                                        int32_t bs, pa_cache *cache, const int32_t *table, int32_t nb,
                                        const void *q, const float *k, const float *v, float *out, size_t nout,
                                        float *lse, size_t nlse)
{
    pa_context *c = NULL;
    pa_batch *batch = NULL;
    pa_seq seq = {.context_len = ctx, .query_len = qlen, .is_prefill = qlen > 1, .block_table = table,
                  .num_blocks = nb};
    pa_batch_config bc = {.block_size = bs, .num_blocks = nb};
    CHECK_OK(pa_context_create(be, NULL, &c));
    CHECK_OK(pa_batch_create(&bc, &seq, 1, &batch));
    for (size_t i = 0; i < nout; i++) out[i] = -12345.0f;
    for (size_t i = 0; i < nlse; i++) lse[i] = -12345.0f;
    pa_forward_args a = {.q = q, .k = k, .v = v, .cache = cache, .out = out, .lse = lse};
    CHECK_OK(pa_attn_forward(c, layer, batch, NULL, &a));
    pa_batch_destroy(batch);
    pa_context_destroy(c);
}

#endif
