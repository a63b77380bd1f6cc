/* cpu_detect.c: CPU feature detection (baseline flags; no intrinsics). A path is usable only
 * when the CPU reports the instructions (CPUID) and the OS saves the wide registers (XGETBV:
 * XCR0 bits 1-2 for YMM; bits 5-7 too for ZMM and the opmask registers). */
#include "../cpu.h"

#if defined(PA__CPU_X86) && defined(__GNUC__)
#include <cpuid.h>

static uint64_t xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ __volatile__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

void pa__cpu_detect(pa__cpu_features *f)
{
    memset(f, 0, sizeof *f);
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return;
    /* vendor string: EBX, EDX, ECX */
    f->amd = (b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u)     /* AuthenticAMD */
             || (b == 0x6f677948u && d == 0x6e65476eu && c == 0x656e6975u); /* HygonGenuine */
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    bool osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
    /* EAX: base family in bits 8-11, extended family in bits 20-27 (added when base is 15) */
    f->family = (int)((a >> 8) & 0xf);
    if (f->family == 0xf) f->family += (int)((a >> 20) & 0xff);
    f->fma = (c >> 12) & 1;
    f->f16c = (c >> 29) & 1;
    uint64_t xcr0 = osxsave ? xgetbv0() : 0;
    f->os_ymm = avx && (xcr0 & 0x6) == 0x6;
    f->os_zmm = f->os_ymm && (xcr0 & 0xe0) == 0xe0;
    if (__get_cpuid_max(0, NULL) < 7) return;
    __cpuid_count(7, 0, a, b, c, d);
    unsigned max_sub = a;
    f->avx2 = (b >> 5) & 1;
    f->avx512f = (b >> 16) & 1;
    f->avx512bw = (b >> 30) & 1;
    f->avx512vl = (b >> 31) & 1;
    f->avx512vbmi = (c >> 1) & 1;
    if (max_sub >= 1) {
        __cpuid_count(7, 1, a, b, c, d);
        f->avx512bf16 = (a >> 5) & 1;
    }
}
#else
void pa__cpu_detect(pa__cpu_features *f)
{
    memset(f, 0, sizeof *f);
}
#endif
