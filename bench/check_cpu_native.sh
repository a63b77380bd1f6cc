#!/usr/bin/env bash
# check_cpu_native.sh: the cpu backend's ISA paths run natively on a host other than the
# development machine (which has AVX2 only), above all one with AVX-512 or AVX512-BF16 such as
# the host of a lent GPU machine. Run from the repository root:
#     BUILD=build-devbin bash bench/check_cpu_native.sh     (BUILD: any build with tests and tools)
# 1. the CPU (lscpu model and SIMD flags) and `pagedattn info` (which path the backend picks);
# 2. every cpu test that walks the ISA paths (case grid, determinism, fp8 codes and NaN, random
#    sweep, pools past 2^32 elements), in parallel: each runs every path this CPU executes;
# 3. unless BENCH=0, `pagedattn bench` once per x86 path (avx2, avx512, avx512bf16 where the CPU
#    has them) on decode 16 x 4096 (bf16, f16, fp8) and causal prefill 2048 (f32, bf16), threads
#    1 and all, so the paths are compared side by side on one machine in one run; and bf16
#    decode once more over an NHD cache (FlashAttention's layout) on the default path.
# Each step is time-boxed (LIMIT_S, default 240 s for the tests, 150 s per bench run). Output goes
# to stdout and, when $OUT is set, to $OUT/cpu-native.txt. Exit status: number of failed steps.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BUILD=${BUILD:-build}
CLI="$BUILD/tools/pagedattn"
LOG=${OUT:+$OUT/cpu-native.txt}
LOG=${LOG:-/dev/null}
fails=0
say() { echo "$@" | tee -a "$LOG"; }
run() { # run LIMIT_S CMD...: output to stdout and the log, status counted
    local limit=$1; shift
    say "\$ $*"
    timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$LOG"
    local rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then fails=$((fails + 1)); say "-> FAILED (rc=$rc)"; fi
}

say "== $(date -u '+%F %T UTC') on $(hostname), $(nproc) CPUs"
lscpu | grep -E 'Model name|^CPU\(s\)|Thread|Socket|L2|L3' | tee -a "$LOG"
say "SIMD flags: $(grep -o -w -E 'avx2|fma|f16c|avx512[a-z_0-9]*|amx[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' ')"
run 30 "$CLI" info

say "== cpu tests (every ISA path this CPU runs)"
TESTS="test_cpu_grid test_cpu_determinism test_cpu_fp8_codes test_cpu_fp8_nan test_cpu_sweep test_large_cache"
pids=""
for t in $TESTS; do
    [ -x "$BUILD/tests/$t" ] || { say "$t: not built in $BUILD"; fails=$((fails + 1)); continue; }
    ( timeout -k 10 "${LIMIT_S:-240}" "$BUILD/tests/$t" >"/tmp/cpu-native-$t.log" 2>&1
      echo $? >"/tmp/cpu-native-$t.rc" ) &
    pids="$pids $!"
done
wait $pids
for t in $TESTS; do
    [ -f "/tmp/cpu-native-$t.rc" ] || continue
    rc=$(cat "/tmp/cpu-native-$t.rc")
    skipped=$(grep -i -E 'cannot run|not runnable' "/tmp/cpu-native-$t.log" | grep -o -E 'avx512bf16|avx512|avx2|neon|generic' | sort -u | tr '\n' ' ')
    say "$t: rc=$rc  $(grep -E 'checks|failures|passed' "/tmp/cpu-native-$t.log" | tail -1)  [paths skipped: ${skipped:-none}]"
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then
        fails=$((fails + 1))
        grep -m 20 FAIL "/tmp/cpu-native-$t.log" | tee -a "$LOG"
    fi
    rm -f "/tmp/cpu-native-$t.rc"
done

if [ "${BENCH:-1}" != 0 ] && [ "$(uname -m)" = x86_64 ]; then
    for isa in avx2 avx512 avx512bf16; do
        if ! PAGEDATTN_CPU_ISA=$isa "$CLI" info 2>&1 | grep -q -E "^ +isa: $isa \(" ||
           PAGEDATTN_CPU_ISA=$isa "$CLI" info 2>&1 | grep -E "^ +isa: " | grep -q "cannot run"; then
            say "== bench, $isa: this CPU does not run it"
            continue
        fi
        for cases in "decode b16 x 4096" "prefill 2048"; do
            say "== bench, PAGEDATTN_CPU_ISA=$isa, cases \"$cases\""
            PAGEDATTN_CPU_ISA=$isa run "${BENCH_LIMIT_S:-150}" "$CLI" bench --cases "$cases" \
                --threads "1,$(nproc)" --repeats 3
        done
    done
    # FlashAttention's cache layout (NHD) against the backend's own (HND), on the path the
    # backend picks: on the development hosts NHD decode was 10-15% slower (compute-bound
    # cores); DESIGN.md expects a third of the bandwidth on a memory-bound Zen 4
    say "== bench, default path, decode bf16 over an NHD cache (the HND rows are above)"
    run "${BENCH_LIMIT_S:-150}" "$CLI" bench --cases "decode b16 x 4096 bf16" --layout nhd \
        --threads "1,$(nproc)" --repeats 3
fi
say "== check_cpu_native: $fails failed step(s)"
exit "$fails"
