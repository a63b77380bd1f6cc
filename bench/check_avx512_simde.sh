#!/bin/sh
# Runs the shared case grid on the cpu backend's AVX-512 kernels on a machine WITHOUT AVX-512,
# by compiling src/backends/cpu/x86/cpu_avx512.c and cpu_avx512bf16.c against SIMDe (apt install
# libsimde-dev), which emulates the intrinsics, and forcing the paths on: once as avx512, once as
# avx512bf16 (ISAS="avx512" for one). Without a filter the avx512bf16 pass runs only the cases
# with bf16 keys and values, the only ones whose kernels differ from avx512's. A
# development check of the kernels' logic, not of the instructions; the grid then compares with
# the reference as usual. Aligned loads and stores check their address here (the hardware faults
# on a misaligned one, SIMDe would not): a misaligned one aborts with "alignment check failed".
# Without a filter it also runs test_cpu_determinism, test_cpu_fp8_nan, test_cpu_fp8_codes,
# test_cpu_e4m3_nan_pv (the E4M3 decode PV called directly), test_cpu_fp8_lut (the decode QK
# and PV over fp8 rows by byte tables called directly), test_cpu_direct_tail (the decode kernels
# for head sizes that are not multiples of 16, rows before unmapped pages), test_cpu_fp8_qk_bf16 (the
# avx512bf16 QK over fp8 keys called directly; the script reports AVX512-VBMI, so every form),
# test_cpu_neg_inf_logit (visible keys with a logit of -inf, any_neg_inf), test_cpu_tiny_terms
# (subnormal weights and bf16 dot products over subnormal operands), test_cpu_big_scale (a scale
# above 1 over query values near FLT_MAX), test_large_cache and a short random sweep per path (SWEEP_SEED, SWEEP_COUNT; default 0x51ADE,
# 30 cases).
# Usage: bench/check_avx512_simde.sh [grid filter]        (from the repository root)
#        SAN="-fsanitize=address,undefined -fno-sanitize-recover=all" bench/check_avx512_simde.sh
#        builds everything under the sanitizers (a read past a row by a 512-bit load fails it).
set -eu
SAN=${SAN:-}
t0=$(date +%s)
# stamp PHASE: how long the script has run when PHASE ends (CI reads it for its time budget)
stamp() { echo "-- $1: $(( $(date +%s) - t0 )) s in"; }
root=$(pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/fake"
cat > "$work/fake/immintrin.h" <<'H'
#pragma once
#define PA_SIMDE 1 /* (kernels: no inline assembly) */
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <string.h>
#include <math.h>
#include "pagedattn.h"
typedef simde__mmask16 __mmask16;
typedef simde__mmask32 __mmask32;
typedef simde__mmask8 __mmask8;
typedef simde__mmask64 __mmask64;
static inline __m512i _mm512_maskz_loadu_epi8(__mmask64 k, const void *p) { uint8_t a[64] = {0}; __m512i r;
  for (int i = 0; i < 64; i++) if ((k >> i) & 1) a[i] = ((const uint8_t *)p)[i]; memcpy(&r, a, 64); return r; }
static inline __m512i _mm512_maskz_loadu_epi16(__mmask32 k, const void *p) { uint16_t a[32] = {0}; __m512i r;
  for (int i = 0; i < 32; i++) if ((k >> i) & 1) memcpy(&a[i], (const char *)p + 2 * i, 2); memcpy(&r, a, 64); return r; }
static inline __m128i _mm_maskz_loadu_epi8(__mmask16 k, const void *p) { uint8_t a[16] = {0}; __m128i r;
  for (int i = 0; i < 16; i++) if ((k >> i) & 1) a[i] = ((const uint8_t *)p)[i]; memcpy(&r, a, 16); return r; }
/* missing from SIMDe 0.7: */
static inline __m512 _mm512_cvtph_ps(__m256i h) { uint16_t a[16]; float f[16]; __m512 r; memcpy(a, &h, 32);
  for (int i = 0; i < 16; i++) f[i] = pa_f16_to_f32(a[i]); memcpy(&r, f, 64); return r; }
static inline __m512i _mm512_cvtepu16_epi32(__m256i h) { uint16_t a[16]; uint32_t u[16]; __m512i r; memcpy(a, &h, 32);
  for (int i = 0; i < 16; i++) u[i] = a[i]; memcpy(&r, u, 64); return r; }
static inline __m512i _mm512_cvtepu8_epi32(__m128i x) { uint8_t a[16]; uint32_t u[16]; __m512i r; memcpy(a, &x, 16);
  for (int i = 0; i < 16; i++) u[i] = a[i]; memcpy(&r, u, 64); return r; }
static inline __m512i _mm512_cvtepi8_epi32(__m128i x) { int8_t a[16]; int32_t u[16]; __m512i r; memcpy(a, &x, 16);
  for (int i = 0; i < 16; i++) u[i] = a[i]; memcpy(&r, u, 64); return r; }
static inline __mmask32 _mm512_cmpeq_epi16_mask(__m512i a, __m512i b) { uint16_t x[32], y[32]; __mmask32 k = 0;
  memcpy(x, &a, 64); memcpy(y, &b, 64); for (int i = 0; i < 32; i++) k |= (__mmask32)(x[i] == y[i]) << i; return k; }
static inline float _mm512_reduce_add_ps(__m512 x) { float f[16]; memcpy(f, &x, 64); float s = 0;
  for (int i = 0; i < 16; i++) s += f[i]; return s; }
#define _mm512_shuffle_f32x4(a, b, imm) simde_mm512_shuffle_f32x4((a), (b), (imm))
#define _MM_FROUND_TO_NEAREST_INT SIMDE_MM_FROUND_TO_NEAREST_INT
#define _MM_FROUND_NO_EXC SIMDE_MM_FROUND_NO_EXC
/* vcvtps2dq under the default rounding (to nearest even), as the exp's n is already integral */
static inline __m512i _mm512_cvtps_epi32(__m512 x) { float f[16]; int32_t u[16]; __m512i r; memcpy(f, &x, 64);
  for (int i = 0; i < 16; i++) u[i] = (int32_t)nearbyintf(f[i]); memcpy(&r, u, 64); return r; }
static inline __m512 _mm512_maskz_loadu_ps(__mmask16 k, const void *p) { float a[16] = {0}; __m512 r;
  for (int i = 0; i < 16; i++) if ((k >> i) & 1) memcpy(&a[i], (const char *)p + 4 * i, 4); memcpy(&r, a, 64); return r; }
static inline __m512 _mm512_mask_loadu_ps(__m512 src, __mmask16 k, const void *p) { float a[16]; __m512 r; memcpy(a, &src, 64);
  for (int i = 0; i < 16; i++) if ((k >> i) & 1) memcpy(&a[i], (const char *)p + 4 * i, 4); memcpy(&r, a, 64); return r; }
static inline float _mm512_cvtss_f32(__m512 x) { float f[16]; memcpy(f, &x, 64); return f[0]; }
static inline __m512i _mm512_zextsi256_si512(__m256i x) { __m512i r; memset(&r, 0, 64); memcpy(&r, &x, 32); return r; }
static inline __m512i _mm512_zextsi128_si512(__m128i x) { __m512i r; memset(&r, 0, 64); memcpy(&r, &x, 16); return r; }
static inline void _mm512_mask_storeu_ps(void *p, __mmask16 k, __m512 x) { float a[16]; memcpy(a, &x, 64);
  for (int i = 0; i < 16; i++) if ((k >> i) & 1) memcpy((char *)p + 4 * i, &a[i], 4); }
static inline void _mm_mask_storeu_ps(void *p, __mmask8 k, __m128 x) { float a[4]; memcpy(a, &x, 16);
  for (int i = 0; i < 4; i++) if ((k >> i) & 1) memcpy((char *)p + 4 * i, &a[i], 4); }
/* AVX512-BF16 as Intel's pseudo-code has it (SIMDe's dot product keeps subnormals): vdpbf16ps
 * takes subnormal inputs (its accumulator too) as zero, adds the odd pair's product and then the
 * even one's, each sum rounded to fp32 and flushed to zero below 2^-126; vcvtne2ps2bf16 rounds
 * to nearest even, subnormal inputs taken as zero, NaN kept quiet. */
#include <math.h>
static inline float pa_sim_ftz(float f) { return fabsf(f) < 0x1p-126f ? copysignf(0.0f, f) : f; }
static inline float pa_sim_bf(uint16_t h) { uint32_t u = (uint32_t)(h & 0x7f80 ? h : h & 0x8000) << 16; float f;
  memcpy(&f, &u, 4); return f; }
static inline uint16_t pa_sim_rne(float f) { uint32_t u; memcpy(&u, &f, 4); if (!(u & 0x7f800000u)) u &= 0x80000000u;
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16); }
static inline __m512 pa_sim_dpbf16(__m512 src, __m512bh a, __m512bh b) { float s[16]; uint16_t x[32], y[32];
  __m512 r; memcpy(s, &src, 64); memcpy(x, &a, 64); memcpy(y, &b, 64);
  for (int i = 0; i < 16; i++) { float t = pa_sim_ftz(s[i]);
    t = pa_sim_ftz((float)((double)t + (double)pa_sim_bf(x[2 * i + 1]) * pa_sim_bf(y[2 * i + 1])));
    s[i] = pa_sim_ftz((float)((double)t + (double)pa_sim_bf(x[2 * i]) * pa_sim_bf(y[2 * i]))); }
  memcpy(&r, s, 64); return r; }
#undef _mm512_dpbf16_ps
#define _mm512_dpbf16_ps(s, a, b) pa_sim_dpbf16((s), (a), (b))
/* the 256-bit form: the low half of the 512-bit one */
static inline __m256 pa_sim_dpbf16_256(__m256 src, __m256bh a, __m256bh b) { __m512 s = _mm512_setzero_ps();
  __m512bh x, y; memset(&x, 0, 64); memset(&y, 0, 64); memcpy(&s, &src, 32); memcpy(&x, &a, 32); memcpy(&y, &b, 32);
  __m512 r = pa_sim_dpbf16(s, x, y); __m256 h; memcpy(&h, &r, 32); return h; }
#undef _mm256_dpbf16_ps
#define _mm256_dpbf16_ps(s, a, b) pa_sim_dpbf16_256((s), (a), (b))
static inline __m512bh _mm512_cvtne2ps_pbh(__m512 a, __m512 b) { float fa[16], fb[16]; uint16_t w[32]; __m512bh r;
  memcpy(fa, &a, 64); memcpy(fb, &b, 64); for (int i = 0; i < 16; i++) { w[i] = pa_sim_rne(fb[i]); w[16 + i] = pa_sim_rne(fa[i]); }
  memcpy(&r, w, 64); return r; }
static inline __m256i _mm256_maskz_loadu_epi16(__mmask16 k, const void *p) { uint16_t a[16] = {0}; __m256i r;
  for (int i = 0; i < 16; i++) if ((k >> i) & 1) memcpy(&a[i], (const char *)p + 2 * i, 2); memcpy(&r, a, 32); return r; }
static inline __mmask32 _mm512_cmplt_epu16_mask(__m512i a, __m512i b) { uint16_t x[32], y[32]; __mmask32 m = 0;
  memcpy(x, &a, 64); memcpy(y, &b, 64); for (int i = 0; i < 32; i++) m |= (__mmask32)(x[i] < y[i]) << i; return m; }
/* aligned accesses check their address as the hardware would (SIMDe only needs 16 bytes here) */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
static inline const void *pa_al(const void *p, unsigned a, const char *f) { if ((uintptr_t)p % a) {
  fprintf(stderr, "alignment check failed: %s at %p\n", f, p); abort(); } return p; }
#undef _mm512_load_ps
#define _mm512_load_ps(p) simde_mm512_load_ps(pa_al((p), 64, "_mm512_load_ps"))
#undef _mm512_store_ps
#define _mm512_store_ps(p, x) simde_mm512_store_ps((void *)pa_al((p), 64, "_mm512_store_ps"), (x))
#undef _mm512_load_si512
#define _mm512_load_si512(p) simde_mm512_load_si512(pa_al((p), 64, "_mm512_load_si512"))
#undef _mm512_store_si512
#define _mm512_store_si512(p, x) simde_mm512_store_si512((void *)pa_al((p), 64, "_mm512_store_si512"), (x))
#undef _mm256_load_ps
#define _mm256_load_ps(p) simde_mm256_load_ps(pa_al((p), 32, "_mm256_load_ps"))
#undef _mm256_store_ps
#define _mm256_store_ps(p, x) simde_mm256_store_ps((void *)pa_al((p), 32, "_mm256_store_ps"), (x))
H
S=$root/src
CF="-std=gnu11 -O2 -w -Wno-psabi -I$root/include -I$S -I$S/backends/cpu -I$S/backends/cpu/x86 -DPAGEDATTN_HAVE_CPU -DPAGEDATTN_HAVE_AVX512 -DPAGEDATTN_BUILDING"
# the backend with the AVX-512 path declared usable
sed -e 's|    case PA__ISA_AVX512:|    case PA__ISA_AVX512: return true;|' \
    -e 's|    case PA__ISA_AVX512BF16:|    case PA__ISA_AVX512BF16: return true;|' \
    "$S/backends/cpu/cpu_backend.c" > "$work/cpu_backend_forced.c"
# and AVX512-VBMI reported (the avx512bf16 path's E4M3 QK by byte tables)
sed -e 's|f->avx512vbmi = (c >> 1) \& 1;|f->avx512vbmi = true;|' "$S/backends/cpu/x86/cpu_detect.c" > "$work/cpu_detect_vbmi.c"
grep -q 'avx512vbmi = true' "$work/cpu_detect_vbmi.c" || { echo "FAIL: cpu_detect.c no longer matches the script's edit"; exit 1; }
# st LOG CMD...: runs CMD with its output in LOG and prints its status (0 or 1), for jobs run in
# the background (set -e stays out of them)
st() { o=$1; shift; if "$@" > "$o" 2>&1; then echo 0; else echo 1; fi; }
# the SIMDe kernel files without -w and with implicit declarations as errors: an intrinsic SIMDe lacks (and no shim above covers)
# would otherwise compile as an int-returning call and fail only at link or run time
# at -O1: gcc 12 took 13 minutes over cpu_avx512.c at -O2 under SIMDe on a Zen 3 without
# AVX-512 (where CI emulates both paths), 2.7 at -O1 (bench/NOTES.md, forty-sixth pass); this is
# a check of the kernels' logic, not of their speed
CFS="$(printf '%s' "$CF" | sed 's/ -w / /; s/ -O2 / -O1 /') -Werror=implicit-function-declaration"
# the three kernel files side by side (the SIMDe ones take minutes), the longest first, and the
# rest of the library meanwhile
st "$work/cc_avx512.log" gcc $CFS $SAN -I"$work/fake" -c "$S/backends/cpu/x86/cpu_avx512.c" -o "$work/cpu_avx512.o" > "$work/cc_avx512" &
st "$work/cc_avx512bf16.log" gcc $CFS $SAN -I"$work/fake" -c "$S/backends/cpu/x86/cpu_avx512bf16.c" -o "$work/cpu_avx512bf16.o" > "$work/cc_avx512bf16" &
st "$work/cc_avx2.log" gcc $CF $SAN -mavx2 -mfma -mf16c -c "$S/backends/cpu/x86/cpu_avx2.c" -o "$work/cpu_avx2.o" > "$work/cc_avx2" &
for f in $S/core/*.c $S/cache/*.c $S/batch/*.c $S/backends/reference/*.c "$S/backends/cpu/cpu_pool.c" \
         "$S/backends/cpu/cpu_plan.c" "$S/backends/cpu/cpu_attn.c" "$S/backends/cpu/cpu_kernels_generic.c" \
         "$work/cpu_detect_vbmi.c" "$work/cpu_backend_forced.c"; do
  gcc $CF $SAN -c "$f" -o "$work/$(basename "$f" .c).o"
done
wait
for f in avx2 avx512 avx512bf16; do
  [ "$(cat "$work/cc_$f")" = 0 ] || { cat "$work/cc_$f.log"; echo "FAIL: compiling cpu_$f.c"; exit 1; }
done
stamp "the kernel files compiled"
cat > "$work/main.c" <<'C'
#include "grid.h"
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv)
{
    const pa_backend *cpu = pa_backend_find("cpu");
    const char *isa = getenv("PAGEDATTN_CPU_ISA"); /* the script sets it */
    if (argc > 1 || !isa || strcmp(isa, "avx512bf16") != 0)
        return grid_run_all(cpu, argc > 1 ? argv[1] : NULL, 0, stdout) != 0;
    /* avx512bf16 is avx512 with the dot products of bf16 queries by bf16 (or fp8) keys and
     * of the probabilities by bf16 values replaced
     * (pa__cpu_kernels_init_avx512bf16): only the cases with bf16 keys and values, or bf16
     * queries over an fp8 cache, run again here */
    int run = 0, failed = 0;
    for (int i = 0; i < grid_count(); i++) {
        pa_dtype q, kv, cache;
        if (grid_case_dtypes(i, &q, &kv, &cache) != 0) return 1;
        if (kv != PA_DTYPE_BF16 && cache != PA_DTYPE_BF16 &&
            !(q == PA_DTYPE_BF16 && (cache == PA_DTYPE_FP8_E4M3 || cache == PA_DTYPE_FP8_E5M2)))
            continue;
        grid_result r;
        failed += grid_run_case(cpu, i, 0, &r);
        run++;
        printf("%-4d %-6s %10.3g %10.3g %10.3g  %s\n", i, r.failed ? "FAIL" : r.skipped ? "skip" : "ok",
               r.max_abs_err, r.max_rel_err, r.max_lse_err, grid_case_name(i));
        if (r.failed || r.skipped) printf("     -> %s\n", r.reason);
    }
    printf("cpu (avx512bf16): %d cases with bf16 keys and values or bf16 queries over fp8, %d failed\n", run, failed);
    return failed != 0 || run == 0;
}
C
gcc $SAN -std=gnu11 -O2 -w -I"$root/include" -I"$S" -I"$root/tests" -I"$root/tests/support" "$work/main.c" \
    "$root/tests/support/grid.c" "$work"/*.o -lm -lpthread -o "$work/grid_avx512"
rc=0
# report TITLE STATUS LOG PATTERN [LINES]: a job's lines matching PATTERN (the last LINES of them,
# default 12); a failed status or a misaligned access fails the check
report() {
  echo "== $1"
  grep -E "$4" "$3" | grep -v "alignment check failed" | tail -n "${5:-12}" || true
  [ "$(cat "$2")" = 0 ] || rc=1
  if grep -q "alignment check failed" "$3"; then
    echo "FAIL: misaligned aligned access (a fault on AVX-512 hardware) in $1:"
    grep "alignment check failed" "$3" | sort -u | head; rc=1
  fi
}
# each path's grid pass and, without a filter, every test below: two jobs at a time, reported in order
for isa in ${ISAS:-avx512 avx512bf16}; do
  st "$work/out_$isa" env PAGEDATTN_CPU_ISA=$isa "$work/grid_avx512" "$@" > "$work/rc_$isa" &
done
wait
stamp "the grid passes"
for isa in ${ISAS:-avx512 avx512bf16}; do report "isa $isa (SIMDe)" "$work/rc_$isa" "$work/out_$isa" . 100000; done
# the determinism and fp8/NaN tests walk every ISA themselves (all x86 ones are usable here)
if [ $# -eq 0 ]; then
  tests="test_cpu_determinism test_cpu_fp8_nan test_cpu_fp8_codes test_large_cache test_cpu_e4m3_nan_pv test_cpu_fp8_lut test_cpu_direct_tail test_cpu_fp8_qk_bf16 test_cpu_neg_inf_logit test_cpu_tiny_terms test_cpu_big_scale test_cpu_softcap_rows"
  # (built side by side; a failed build fails its run below)
  for t in $tests; do
    gcc $SAN -std=gnu11 -O2 -w -I"$root/include" -I"$S" -I"$root/tests" -I"$root/tests/support" "$root/tests/$t.c" \
        "$work"/[!m]*.o -lm -lpthread -o "$work/$t" &
  done
  # random sweeps (tests/test_cpu_sweep.c), a short one per path: long decodes, 512-dim heads,
  # NaN/inf, two threads against one bit for bit, the reference against the oracle
  gcc $SAN -std=gnu11 -O2 -w -I"$root/include" -I"$S" -I"$root/tests" -I"$root/tests/support" \
      "$root/tests/test_cpu_sweep.c" "$root/tests/support/grid.c" "$work"/[!m]*.o -lm -lpthread -o "$work/sweep" &
  wait
  # every test and each path's sweep, two jobs at a time from one queue (the sweeps and the
  # determinism test, the longest, first), each job's output in its log and status in its rc file
  cat > "$work/job.sh" <<'J'
w=$1 kind=$2 name=$3
if [ "$kind" = sweep ]; then
  if PAGEDATTN_CPU_ISA="$name" "$w/sweep" > "$w/sweep_$name.log" 2>&1; then echo 0; else echo 1; fi > "$w/rc_sweep_$name"
else
  if "$w/$name" > "$w/$name.log" 2>&1; then echo 0; else echo 1; fi > "$w/rc_$name"
fi
J
  { for isa in ${ISAS:-avx512 avx512bf16}; do echo "sweep $isa"; done
    for t in $tests; do echo "test $t"; done; } |
    PAGEDATTN_SWEEP="${SWEEP_SEED:-0x51ADE} ${SWEEP_COUNT:-30}" xargs -P 2 -L 1 sh "$work/job.sh" "$work"
  stamp "the kernel tests and the sweeps"
  for t in $tests; do report "$t (SIMDe)" "$work/rc_$t" "$work/$t.log" "^isa|checks|FAIL"; done
  for isa in ${ISAS:-avx512 avx512bf16}; do
    report "test_cpu_sweep, isa $isa (SIMDe)" "$work/rc_sweep_$isa" "$work/sweep_$isa.log" "sweep from|FAIL|->"
  done
fi
exit $rc
