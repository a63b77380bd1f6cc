/* test_cpu_default_isa.c: the path a cpu context takes when PAGEDATTN_CPU_ISA is unset
 * (pa__cpu_default_isa): the widest one the features allow, except that avx512bf16 is the
 * default on AMD only and avx512 elsewhere (bench/NOTES.md, twenty-fourth pass). Synthetic
 * feature sets, so every case runs on any x86 host whatever its own CPU; paths this build lacks
 * (a compiler without the AVX-512 flags) are checked as unusable instead. */
#include "test.h"

#include "backends/cpu/cpu.h"

#include <string.h>

/* weak: a build without the cpu backend (PAGEDATTN_CPU=OFF) links and skips */
extern pa__cpu_isa pa__cpu_default_isa(const pa__cpu_features *f) __attribute__((weak));
extern bool pa__cpu_avx512_rows12(const pa__cpu_features *f) __attribute__((weak));

static void expect(const char *what, const pa__cpu_features *f, pa__cpu_isa want)
{
    const pa__cpu_isa got = pa__cpu_default_isa(f);
    if (got != want) printf("%s: default path %s, want %s\n", what, pa__cpu_isa_name(got), pa__cpu_isa_name(want));
    CHECK(got == want);
}

int main(void)
{
    if (!pa__cpu_default_isa) {
        printf("SKIP: the cpu backend is not built\n");
        return 77;
    }
    pa__cpu_features f;
    memset(&f, 0, sizeof f);
    expect("no features", &f, PA__ISA_GENERIC);
#ifdef PA__CPU_X86
    f.avx2 = f.fma = f.f16c = f.os_ymm = true;
    expect("AVX2+FMA+F16C", &f, PA__ISA_AVX2);
    f.amd = true;
    expect("AVX2, AMD", &f, PA__ISA_AVX2);
    f.amd = false;
    f.avx512f = f.avx512bw = f.avx512vl = f.os_zmm = true;
    const bool has512 = pa__cpu_isa_usable(PA__ISA_AVX512, &f);
    printf("this build %s the AVX-512 paths\n", has512 ? "has" : "lacks");
    const pa__cpu_isa wide = has512 ? PA__ISA_AVX512 : PA__ISA_AVX2;
    expect("AVX-512 F/BW/VL", &f, wide);
    f.avx512bf16 = true;
    expect("AVX512-BF16, not AMD (Intel)", &f, wide);
    f.amd = true;
    expect("AVX512-BF16, AMD", &f, has512 ? PA__ISA_AVX512BF16 : PA__ISA_AVX2);
    f.avx512bf16 = false;
    expect("AVX-512 without BF16, AMD", &f, wide);
    f.os_zmm = false; /* the OS does not save the ZMM state: no AVX-512 path at all */
    f.avx512bf16 = true;
    expect("AVX512-BF16 without OS support, AMD", &f, PA__ISA_AVX2);
    /* the AVX-512 prefill blocking: 12 x 16 on Zen 4 (family 0x19) only */
    f.family = 0x19;
    CHECK(pa__cpu_avx512_rows12(&f));
    f.family = 0x1a; /* Zen 5 */
    CHECK(!pa__cpu_avx512_rows12(&f));
    f.amd = false;
    f.family = 0x19; /* (no such Intel family; the vendor decides first) */
    CHECK(!pa__cpu_avx512_rows12(&f));
    f.family = 6;
    CHECK(!pa__cpu_avx512_rows12(&f));
#elif defined(PA__CPU_ARM64)
    f.neon = true;
    expect("AArch64 Advanced SIMD", &f, PA__ISA_NEON);
#endif
    return test_exit();
}
