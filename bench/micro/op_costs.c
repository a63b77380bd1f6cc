/* op_costs.c: what the AVX-512 instructions of the fp8 decode conversions cost on this core,
 * alone and beside FMAs (a development measurement behind bench/NOTES.md, thirty-seventh pass;
 * not part of the build).
 *
 *   gcc -O2 -mavx512f -mavx512bw -mavx512vbmi bench/micro/op_costs.c -o /tmp/op_costs
 *   taskset -c 0 /tmp/op_costs [GHz]        (GHz: the core's clock under AVX-512 FMAs, default
 *                                          3.07, the bench's fp32 FMA probe over 64 flops/cycle)
 *
 * Each line times a loop whose body is a fixed mix of independent instructions (8 chains of the
 * operation, each its own register, volatile asm so that nothing is folded or moved), 2e7
 * iterations, and prints cycles per iteration at the given clock. An instruction of one uop on
 * one port shows as 1 cycle per instruction alone and adds half a cycle beside the FMAs (which
 * take ports 0 and 5); the byte permutes' 2 cycles alone and 3 uops' worth beside the FMAs are
 * what made one permute per 16 values as dear as the f16 forms (cpu_avx512.c, f8l_cvt). */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#define N 20000000L
#define P(a) __asm__ volatile("vpermi2b %[b], %[t], %[x]" : [x] "+v"(a) : [t] "v"(t0), [b] "v"(t1))
#define PT(a) __asm__ volatile("vpermt2b %[b], %[t], %[x]" : [x] "+v"(a) : [t] "v"(t0), [b] "v"(t1))
#define PZ(a) __asm__ volatile("vpermi2b %[b], %[t], %[x]%{%[k]%}%{z%}" : [x] "+v"(a) : [t] "v"(t0), [b] "v"(t1), [k] "Yk"(kk))
#define UN(a) __asm__ volatile("vpunpcklbw %[b], %[t], %[x]" : [x] "+v"(a) : [t] "v"(t0), [b] "v"(t1))
#define SH(a) __asm__ volatile("vpslld $16, %[x], %[x]" : [x] "+v"(a))
#define SX(a) __asm__ volatile("vpmovsxbw %t[x], %[x]" : [x] "+v"(a))
#define CV(a) __asm__ volatile("vcvtph2ps %t[x], %[x]" : [x] "+v"(a))
#define F(a) __asm__ volatile("vfmadd231ps %[b], %[t], %[x]" : [x] "+v"(a) : [t] "v"(t0), [b] "v"(t1))
#define OPS8(OP) OP(a0); OP(a1); OP(a2); OP(a3); OP(a4); OP(a5); OP(a6); OP(a7);
#define F8 F(f0); F(f1); F(f2); F(f3); F(f4); F(f5); F(f6); F(f7);
#define RUN(name, BODY)                                                                                   \
    {                                                                                                     \
        __m512i a0 = _mm512_set1_epi32(1), a1 = _mm512_set1_epi32(2), a2 = _mm512_set1_epi32(3);        \
        __m512i a3 = _mm512_set1_epi32(4), a4 = _mm512_set1_epi32(5), a5 = _mm512_set1_epi32(6);        \
        __m512i a6 = _mm512_set1_epi32(7), a7 = _mm512_set1_epi32(8);                                   \
        __m512 f0 = _mm512_set1_ps(1), f1 = _mm512_set1_ps(2), f2 = _mm512_set1_ps(3), f3 = _mm512_set1_ps(4); \
        __m512 f4 = _mm512_set1_ps(5), f5 = _mm512_set1_ps(6), f6 = _mm512_set1_ps(7), f7 = _mm512_set1_ps(8); \
        __m512i t0 = _mm512_set1_epi32(0x01020304), t1 = _mm512_set1_epi32(0x05060708);                \
        __mmask64 kk = 0xccccccccccccccccull;                                                            \
        (void)kk, (void)t0, (void)t1;                                               \
        double t = now();                                                                                 \
        for (long i = 0; i < N; i++) { BODY }                                                             \
        t = now() - t;                                                                                    \
        __asm__ volatile("" ::"v"(a0), "v"(a1), "v"(a2), "v"(a3), "v"(a4), "v"(a5), "v"(a6), "v"(a7));   \
        __asm__ volatile("" ::"v"(f0), "v"(f1), "v"(f2), "v"(f3), "v"(f4), "v"(f5), "v"(f6), "v"(f7));   \
        printf("%-34s %6.2f cycles per iteration\n", name, t / N * ghz * 1e9);                         \
    }

int main(int argc, char **argv)
{
    const double ghz = argc > 1 ? atof(argv[1]) : 3.07;
    RUN("8 vfmadd231ps", F8)
    RUN("16 vfmadd231ps", F8 F8)
    RUN("8 vpermi2b", OPS8(P))
    RUN("8 vpermt2b", OPS8(PT))
    RUN("8 vpermi2b {k}{z}", OPS8(PZ))
    RUN("8 vpunpcklbw", OPS8(UN))
    RUN("8 vpslld", OPS8(SH))
    RUN("8 vpmovsxbw", OPS8(SX))
    RUN("8 vcvtph2ps", OPS8(CV))
    RUN("8 vpermi2b + 16 vfmadd231ps", OPS8(P) F8 F8)
    RUN("8 vpunpcklbw + 16 vfmadd231ps", OPS8(UN) F8 F8)
    RUN("8 vpslld + 16 vfmadd231ps", OPS8(SH) F8 F8)
    RUN("8 vpmovsxbw + 16 vfmadd231ps", OPS8(SX) F8 F8)
    RUN("8 vcvtph2ps + 16 vfmadd231ps", OPS8(CV) F8 F8)
    return 0;
}
