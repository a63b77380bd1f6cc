#!/usr/bin/env bash
# profile.sh: the evidence behind the README's account of the cpu backend's missed targets, in
# one run on one core. Run from the repository root after the README's build:
#     bash bench/profile.sh              (BUILD=dir: another build with tools; CPU=n: another core)
# For each decode of the targets (16 x 4096 bf16 and fp8 e4m3, 1 x 32768 bf16; bf16 queries,
# block 16, shuffled tables, one thread pinned to core $CPU):
#   1. the step as `pagedattn bench` times it (KV from DRAM), and the same step with every
#      context in two blocks (`--blocks hot`: the KV stays in L2, so the arithmetic alone);
#   2. the floor the targets are measured against, KV bytes over the bench's read probe;
#   3. where the time goes: `perf record -e cpu-clock` (software sampling: this development VM
#      exposes no hardware counters, so `perf stat` can count only task-clock, faults and
#      switches), the library's own samples by function, over the DRAM step.
# Then how fast the same core reads a pool in shuffled chunks of 4 to 64 KiB, as a paged cache
# lies (bench/micro/chunk_reads.c): at block 16 one KV head's rows of a block are a 4 KiB run.
# Needs perf (Debian: linux-perf) for step 3 and gcc with AVX-512 intrinsics for the micro;
# either missing is said and skipped. Takes 2-3 minutes; nothing else should run meanwhile.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BUILD=${BUILD:-build}
CPU=${CPU:-0}
CLI="$BUILD/tools/pagedattn"
[ -x "$CLI" ] || { echo "profile.sh: no $CLI (build first, or set BUILD)" >&2; exit 2; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pin() { taskset -c "$CPU" "$@"; }

# median ms and the read probe of one case from the bench's text output
bench_row() { # bench_row CASE [options]: prints "median_ms kv_gbs probe_gbs"
    local c=$1; shift
    pin "$CLI" bench --cases "$c" --threads 1 --repeats 9 "$@" > "$TMP/b.txt" 2>&1 || { cat "$TMP/b.txt" >&2; return 1; }
    awk -v c="$c" '/thread\(s\): read/ && !p { p = $4 }
        index($0, c) == 1 { o = ($(NF - 1) == "fma" || $(NF - 1) == "dot") # (a two-word bound)
                            if ($(NF - 8 - o) == 1) { m = $(NF - 6 - o); g = $(NF - 4 - o) } }
        END { print m, g, p }' "$TMP/b.txt"
}

echo "== $(date -u '+%F %T UTC'), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), core $CPU, load $(cut -d' ' -f1 /proc/loadavg)"
"$CLI" info | grep -E '^  isa:'
HAVE_PERF=0
if command -v perf > /dev/null && perf record -e cpu-clock -o "$TMP/t.data" true > /dev/null 2>&1; then HAVE_PERF=1; fi
if [ "$HAVE_PERF" = 1 ]; then
    echo "perf stat on this machine (hardware counters, where the VM has them):"
    perf stat -x, -e cycles,instructions -- true 2>&1 | awk -F, '{ print "  " $3 ": " $1 }'
fi

for c in "decode b16 x 4096 bf16" "decode b16 x 4096 fp8_e4m3" "decode b1 x 32768 bf16"; do
    echo
    echo "== $c, one thread"
    read -r dram gbs probe < <(bench_row "$c") || continue
    read -r hot _ _ < <(bench_row "$c" --blocks hot) || continue
    awk -v d="$dram" -v h="$hot" -v g="$gbs" -v p="$probe" 'BEGIN {
        floor = d * g / p
        printf "  step, KV from DRAM       %7.2f ms  (%.1f GB/s of KV)\n", d, g
        printf "  arithmetic alone (hot)   %7.2f ms  (%.0f%% of the step)\n", h, 100 * h / d
        printf "  KV bytes / read probe    %7.2f ms  (probe %.1f GB/s; the step reads at %.0f%% of it)\n", floor, p, 100 * g / p
        printf "  step - max(hot, floor)   %7.2f ms  (what neither the reads nor the arithmetic alone explain)\n",
               d - (h > floor ? h : floor) }'
    if [ "$HAVE_PERF" = 1 ]; then
        pin perf record -q -e cpu-clock -F 4000 -o "$TMP/p.data" -- \
            "$CLI" bench --cases "$c" --threads 1 --repeats 40 > /dev/null 2>&1
        # the library's functions only: the bench's limit probes, its filling of the cache and
        # of the probe's buffer (libc, the kernel) and the conversions that fill uses left out
        perf report -i "$TMP/p.data" --no-children --sort dso,symbol --stdio 2>/dev/null |
            awk '$1 ~ /%$/ && $2 == "pagedattn" && $3 == "[.]" {
                     s = $4; v = $1 + 0
                     if (s ~ /^(read_|fma_|bf16_(avx|gen)|lim_|fill_pattern|random_pattern|pattern_normal|setup_case|pa_convert|pa_f32_to_)/) next
                     t += v; n[s] = v; o[++k] = s }
                 END { printf "  perf record, the attention'\''s samples by function:\n"
                       for (i = 1; i <= k && i <= 8; i++) printf "    %-34s %5.1f%%\n", o[i], 100 * n[o[i]] / t }'
    fi
done

echo
echo "== one core reading a 1 GiB pool in shuffled chunks (bench/micro/chunk_reads.c)"
if gcc -O2 -mavx512f bench/micro/chunk_reads.c -o "$TMP/chunk_reads" 2> /dev/null; then
    pin "$TMP/chunk_reads" | sed 's/^/  /'
else
    echo "  skipped: gcc could not build it (needs AVX-512 intrinsics)"
fi
