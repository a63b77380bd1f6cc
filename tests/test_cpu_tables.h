/* test_cpu_tables.h: the cpu backend's kernel tables, for tests that call kernels directly
 * (include after test.h and backends/cpu/cpu.h). The entry points are weak: a build without the
 * cpu backend or without an ISA file still links, and the test skips. */
#ifndef PAGEDATTN_TEST_CPU_TABLES_H
#define PAGEDATTN_TEST_CPU_TABLES_H

#include <stdio.h>

extern void pa__cpu_kernels_init_generic(pa__cpu_kernels *k) __attribute__((weak));
extern void pa__cpu_kernels_init_avx2(pa__cpu_kernels *k) __attribute__((weak));
extern void pa__cpu_kernels_init_avx512(pa__cpu_kernels *k, bool rows12, int lut) __attribute__((weak));
extern void pa__cpu_kernels_init_avx512bf16(pa__cpu_kernels *k, bool vbmi) __attribute__((weak));
extern void pa__cpu_kernels_init_neon(pa__cpu_kernels *k) __attribute__((weak));
extern void pa__cpu_detect(pa__cpu_features *f) __attribute__((weak));
extern bool pa__cpu_isa_usable(pa__cpu_isa isa, const pa__cpu_features *f) __attribute__((weak));

/* 0 where this build has the AVX-512 kernels and this CPU runs them; else says why and returns
 * 77 (CTest's skip status here). (pa_backend_find is a strong reference into the library's
 * backend list, so that the static link pulls in the cpu backend's objects, and with them the
 * kernels the weak names above refer to.) */
static inline int test_cpu_avx512_skip(void)
{
    if (!pa_backend_find("cpu")) {
        printf("SKIP: the cpu backend is not built\n");
        return 77;
    }
    if (!pa__cpu_kernels_init_avx512 || !pa__cpu_kernels_init_generic || !pa__cpu_detect || !pa__cpu_isa_usable) {
        printf("SKIP: this build has no AVX-512 kernels\n");
        return 77;
    }
    pa__cpu_features f;
    pa__cpu_detect(&f);
    if (!pa__cpu_isa_usable(PA__ISA_AVX512, &f)) {
        printf("SKIP: this CPU does not run the avx512 path\n");
        return 77;
    }
    return 0;
}

#endif
