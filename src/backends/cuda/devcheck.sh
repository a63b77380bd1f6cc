#!/usr/bin/env bash
# devcheck.sh: the cuda backend on a GPU, in one go (sized for ~4-5 minutes on an H100/H200 with
# 16 cores). Run from the repository root:
#     bash src/backends/cuda/devcheck.sh     (logs under $BUILD/logs, tarred into $OUT if set)
# Phases: configure + build with PAGEDATTN_CUDA=ON (Release; CUDA_ARCHS, default 90), `pagedattn
# info`; the correctness tests in parallel (ops, splits, the whole case grid against the
# reference, each also with the tensor-core paths off); compute-sanitizer memcheck and racecheck
# in parallel (ops test, grid slices); then, alone on the GPU, the speed runs (`pagedattn bench
# --backend cuda`: copy bandwidth, decode, prefill, CUDA-graph capture, PyTorch SDPA). Each step is
# time-boxed; a failed step is reported and the script goes on; the summary table comes last.
# FOCUS=prefill skips the decode A/B runs, FOCUS=decode the prefill variants' grid runs, A/B
# runs and Nsight Compute reports; CPU_NATIVE=DIR adds the cpu backend's ISA tests and
# speed runs on this host's CPU (DIR: a CPU-only build, devpack.sh's build-devbin/cpu; CPU_BENCH=0:
# the tests only); CPU_AB="DIR[:ISA] ..." times CPU builds against each other beside phase 3;
# DEC_AB names the decode A/B variants (below); DEADLINE_S bounds the run (see step); PYTEST=0
# skips the Python suite.
# Exit status: number of failed steps.
set -u
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$ROOT"
BUILD=${BUILD:-build-devcheck}
LOGS=$BUILD/logs
rm -rf "$LOGS"
mkdir -p "$LOGS"
JOBS=$(nproc 2>/dev/null || echo 4)
export PATH="/usr/local/cuda/bin:$PATH"
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1 || true)
GEN=""
command -v ninja >/dev/null 2>&1 && GEN="-G Ninja"
T0=$(date +%s)

step() { # step NAME TIMEOUT_S CMD...   (result line in $LOGS/NAME.sum)
    local name=$1 limit=$2; shift 2
    local t0=$(date +%s)
    # DEADLINE_S: no step starts later than that many seconds into the run, and none runs past it
    # (so the summary and the log tarball come back inside the device tool's time limit)
    local left=$(( ${DEADLINE_S:-1000000} - (t0 - T0) ))
    if [ "$left" -le 5 ]; then
        printf '%-16s %-12s\n' "$name" "SKIP(deadline)" >"$LOGS/$name.sum"
        return 0
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    timeout -k 10 "$limit" "$@" >"$LOGS/$name.log" 2>&1
    local rc=$? t=$(( $(date +%s) - t0 ))
    local verdict=ok
    if [ $rc -eq 77 ]; then verdict=SKIP; elif [ $rc -eq 124 ]; then verdict=TIMEOUT;
    elif [ $rc -ne 0 ]; then verdict="FAIL(rc=$rc)"; fi
    printf '%-16s %-12s %4ss  %s\n' "$name" "$verdict" "$t" "$(grep -E 'failures|SDPA|checks|passed|failed' "$LOGS/$name.log" | tail -1 | cut -c1-150)" >"$LOGS/$name.sum"
    echo "[$(( $(date +%s) - T0 ))s] $(cat "$LOGS/$name.sum")"
    return $rc
}
finish() {
    echo
    echo "=== devcheck summary ($(( $(date +%s) - T0 )) s; logs in $LOGS)"
    cat "$LOGS"/*.sum
    [ -s "$LOGS/resusage.log" ] && { echo "--- decode kernels' resources"; cat "$LOGS/resusage.log"; }
    [ -f "$LOGS/cpu_ab.txt" ] && { echo "--- cpu A/B (min med max ms, fraction of the limit)"; cat "$LOGS/cpu_ab.txt"; }
    [ -f "$LOGS/dec_ab.txt" ] && { echo "--- decode A/B (bf16 and fp8 medians, fraction of the copy bandwidth)"; cat "$LOGS/dec_ab.txt"; }
    local fails
    fails=$(grep -vc -E '^[^ ]+ +(ok|SKIP)[ (]' "$LOGS"/*.sum | awk -F: '{s += $2} END {print s + 0}')
    [ -n "${OUT:-}" ] && tar czf "$OUT/devcheck-logs.tgz" -C "$BUILD" logs
    exit "$fails"
}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv >"$LOGS/gpu.txt" 2>&1
cat "$LOGS/gpu.txt"

if [ -n "${PREBUILT:-}" ]; then
    # binaries built elsewhere with nvcc (same flags; see devpack.sh): no compile on the GPU machine
    export LD_LIBRARY_PATH="$ROOT/$BUILD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
    step configure 90 cmake -S . -B "$BUILD" $GEN -DPAGEDATTN_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90}" -DPAGEDATTN_BUILD_TESTS=ON -DPAGEDATTN_BUILD_TOOLS=ON || finish
    step build 240 cmake --build "$BUILD" -j"$JOBS" || finish
fi

CLI="$BUILD/tools/pagedattn"
T="$BUILD/tests"
step info 30 "$CLI" info
# registers, stack and shared memory of the decode kernels (what decides blocks per SM)
command -v cuobjdump >/dev/null 2>&1 && step resusage 30 bash -c "cuobjdump -res-usage '$BUILD/libpagedattn.so' 2>&1 | grep -A1 -E 'decode_mmat|decode_kernel' | grep -E 'Function|REG' | paste - - | sed -E 's/Function ([^ ]*):.*(REG:[0-9]+ STACK:[0-9]+ SHARED:[0-9]+).*/\\2 \\1/'"

# CPU_NATIVE=DIR (a CPU-only build with the cpu tests and tools, devpack.sh's build-devbin/cpu):
# the cpu backend's ISA tests on this host's CPU beside phase 1 (bench/check_cpu_native.sh,
# BENCH=0); its speed runs come after phase 3
if [ -n "${CPU_NATIVE:-}" ]; then
    BUILD=$CPU_NATIVE BENCH=0 step cpu_native_tests 300 bash bench/check_cpu_native.sh &
fi
# Phase 1: correctness, in parallel (each test's reference side runs on its own CPU core).
step ops 90 "$T/test_cuda_ops" &
step splits 90 "$T/test_cuda_splits" &
step grid 150 "$T/test_cuda_grid" &
step large_cache 120 "$T/test_large_cache" & # (device pools of up to 2 x 16 GiB)
PAGEDATTN_CUDA_MMA=0 PAGEDATTN_CUDA_DECODE=simt step grid_simt 150 "$T/test_cuda_grid" &
PAGEDATTN_CUDA_MMA=0 PAGEDATTN_CUDA_DECODE=0 step grid_nodec 150 "$T/test_cuda_grid" &
# a forward's kernels by plain launches, and all three of its launches programmatic (the
# default: the attention kernels only)
PAGEDATTN_CUDA_PDL=0 step grid_nopdl 150 "$T/test_cuda_grid" &
PAGEDATTN_CUDA_PDL=0 step splits_nopdl 90 "$T/test_cuda_splits" &
PAGEDATTN_CUDA_PDL=wac step grid_pdlall 150 "$T/test_cuda_grid" &
PAGEDATTN_CUDA_PDL=wac step splits_pdlall 90 "$T/test_cuda_splits" &
# every decode kernel variant (PAGEDATTN_CUDA_DECODE, A/B runs below) on the short-query rows
for v in simt mmat4; do
    PAGEDATTN_CUDA_DECODE=$v step grid_$v 150 "$T/test_cuda_grid" "decoder" &
    PAGEDATTN_CUDA_DECODE=$v step splits_$v 90 "$T/test_cuda_splits" &
done
# decode blocks with each KV head's items side by side (PAGEDATTN_CUDA_DEC_ORDER=items; the
# default puts a work item's KV heads side by side), alone and with simt
PAGEDATTN_CUDA_DEC_ORDER=items step grid_items 150 "$T/test_cuda_grid" "decoder" &
PAGEDATTN_CUDA_DEC_ORDER=items step splits_items 90 "$T/test_cuda_splits" &
PAGEDATTN_CUDA_DEC_ORDER=items PAGEDATTN_CUDA_DECODE=simt step grid_items_simt 150 "$T/test_cuda_grid" "decoder" &
# every prefill kernel variant (PAGEDATTN_CUDA_PREFILL; the default is fa) on the whole grid
for v in fa-ldg fa-st fa32 ldm; do
    [ "${FOCUS:-}" = decode ] && break
    PAGEDATTN_CUDA_PREFILL=$v step grid_$v 150 "$T/test_cuda_grid" &
done
# random cases beyond the grid, each run twice and with every sequence alone: bits must match
PAGEDATTN_CUDA_SWEEP="0x5EED 120" step sweep 150 "$T/test_cuda_grid" "(no grid case)" &
for k in 256 512 1024; do # other decode split lengths
    PAGEDATTN_CUDA_SPLIT_KEYS=$k step grid_split$k 150 "$T/test_cuda_grid" "decoder" &
    PAGEDATTN_CUDA_SPLIT_KEYS=$k step splits_split$k 90 "$T/test_cuda_splits" &
done
PAGEDATTN_CUDA_MMA=0 PAGEDATTN_CUDA_DECODE=simt step splits_simt 90 "$T/test_cuda_splits" &
wait

# Phase 2: compute-sanitizer (10-100x slower), in parallel: the ops test whole, grid slices.
if [ -n "$SAN" ]; then
    step memcheck_ops 120 "$SAN" --tool memcheck --error-exitcode 1 "$T/test_cuda_ops" &
    step racecheck_ops 120 "$SAN" --tool racecheck --error-exitcode 1 "$T/test_cuda_ops" &
    step memcheck_grid 150 "$SAN" --tool memcheck --error-exitcode 1 "$T/test_cuda_grid" "/" &
    step racecheck_grid 150 "$SAN" --tool racecheck --error-exitcode 1 "$T/test_cuda_grid" "random/" &
    PAGEDATTN_CUDA_MMA=0 PAGEDATTN_CUDA_DECODE=simt step memcheck_simt 150 "$SAN" --tool memcheck --error-exitcode 1 "$T/test_cuda_grid" "random/" &
    PAGEDATTN_CUDA_MMA=0 PAGEDATTN_CUDA_DECODE=simt step racecheck_simt 150 "$SAN" --tool racecheck --error-exitcode 1 "$T/test_cuda_grid" "random/" &
    step memcheck_splits 120 "$SAN" --tool memcheck --error-exitcode 1 "$T/test_cuda_splits" &
    step memcheck_decode 150 "$SAN" --tool memcheck --error-exitcode 1 "$T/test_cuda_grid" "decode/" &
    step racecheck_decode 150 "$SAN" --tool racecheck --error-exitcode 1 "$T/test_cuda_grid" "decode/" &
    PAGEDATTN_CUDA_PREFILL=ldm step memcheck_ldm 150 "$SAN" --tool memcheck --error-exitcode 1 "$T/test_cuda_grid" "prefill16" &
    step racecheck_prefill 150 "$SAN" --tool racecheck --error-exitcode 1 "$T/test_cuda_grid" "prefill16" &
    step memcheck_prefill 150 "$SAN" --tool memcheck --error-exitcode 1 "$T/test_cuda_grid" "prefill16" &
    PAGEDATTN_CUDA_PREFILL=fa32 step memcheck_fa32 150 "$SAN" --tool memcheck --error-exitcode 1 "$T/test_cuda_grid" "prefill16" &
    PAGEDATTN_CUDA_PREFILL=fa32 step racecheck_fa32 150 "$SAN" --tool racecheck --error-exitcode 1 "$T/test_cuda_grid" "prefill16" &
    step memcheck_nonfin 150 "$SAN" --tool memcheck --error-exitcode 1 "$T/test_cuda_grid" "nonfinite" &
    PAGEDATTN_CUDA_PREFILL=fa-ldg step memcheck_faldg 150 "$SAN" --tool memcheck --error-exitcode 1 "$T/test_cuda_grid" "prefill16" &
    PAGEDATTN_CUDA_PREFILL=fa-ldg step racecheck_faldg 150 "$SAN" --tool racecheck --error-exitcode 1 "$T/test_cuda_grid" "prefill16" &
    step synccheck_prefill 150 "$SAN" --tool synccheck --error-exitcode 1 "$T/test_cuda_grid" "prefill16" &
    PAGEDATTN_CUDA_PREFILL=ldm step racecheck_ldm 150 "$SAN" --tool racecheck --error-exitcode 1 "$T/test_cuda_grid" "prefill16" &
    step racecheck_nonfin 150 "$SAN" --tool racecheck --error-exitcode 1 "$T/test_cuda_grid" "nonfinite" &
    PAGEDATTN_CUDA_DECODE=simt step memcheck_decsimt 150 "$SAN" --tool memcheck --error-exitcode 1 "$T/test_cuda_grid" "decode/" &
    PAGEDATTN_CUDA_DEC_ORDER=items step memcheck_dec_items 150 "$SAN" --tool memcheck --error-exitcode 1 "$T/test_cuda_grid" "decode/" &
    wait
else
    echo "compute-sanitizer not found" >"$LOGS/sanitizer.log"
    printf '%-16s %-12s\n' sanitizer "FAIL(not found)" >"$LOGS/sanitizer.sum"
fi

# Phase 3: speed, alone on the GPU: `pagedattn bench --backend cuda` (copy bandwidth, decode
# 64 x 4096 in bf16/f16/fp8, prefill 4096 causal beside PyTorch SDPA, CUDA-graph replay check),
# as shipped, then decode with each variant of the decode kernel and prefill without tensor
# cores (A/B).
# CPU_AB="DIR[:ISA] ..." (CPU-only builds, each with tools/pagedattn): the cpu backend's bf16
# decode (two rounds) and prefill (one) on one core of this host, each entry on path ISA
# (default avx512bf16), beside the GPU runs below (which use another core)
if [ -n "${CPU_AB:-}" ]; then
    PIN=""
    command -v taskset >/dev/null 2>&1 && PIN="taskset -c $((JOBS - 1))"
    (for r in 1 2; do
        for e in $CPU_AB; do
            d=${e%%:*} isa=avx512bf16
            [ "$d" != "$e" ] && isa=${e#*:}
            for c in "decode b16 x 4096 bf16" "prefill 2048 causal bf16"; do
                # (a prefill row times 16 layers per repeat: ~40 s a run there; one round)
                [ $r = 2 ] && [ "${c%% *}" = prefill ] && continue
                PAGEDATTN_CPU_ISA=$isa step "cpu_ab_$(basename "$d")-${isa}_${c%% *}.$r" 120 \
                    $PIN "$d/tools/pagedattn" bench --cases "$c" --threads 1 --repeats 5
            done
        done
    done) &
    CPU_AB_PID=$!
fi
step bench 120 "$CLI" bench --backend cuda
# decode A/B: DEC_AB lists NAME=ENV[,ENV...][/--layout=L][@DIR] variants, run in two rounds in
# opposite orders (NAME base: as shipped; @DIR: DIR/tools/pagedattn, a static CLI of another
# commit); default: the kernel variants, block order, cache layout and split lengths
DEC_AB=${DEC_AB:-"base= nopdl=PAGEDATTN_CUDA_PDL=0 pdlwac=PAGEDATTN_CUDA_PDL=wac items=PAGEDATTN_CUDA_DEC_ORDER=items s512=PAGEDATTN_CUDA_SPLIT_KEYS=512 s1024=PAGEDATTN_CUDA_SPLIT_KEYS=1024 s1280=PAGEDATTN_CUDA_SPLIT_KEYS=1280"}
dec_ab() { # dec_ab ROUND VARIANT...
    local r=$1; shift
    for x in "$@"; do
        local cli=$CLI
        case "$x" in *@*) cli=${x##*@}/tools/pagedattn; x=${x%@*} ;; esac
        local name=${x%%=*} rest=${x#*=} envs opts=""
        envs=${rest%%/*}
        [ "$envs" != "$rest" ] && opts=$(echo "${rest#*/}" | tr '=' ' ')
        step bench_dec_$name.$r 60 env $(echo "$envs" | tr ',' ' ') "$cli" bench --backend cuda --cases decode $opts
    done
}
if [ "${FOCUS:-}" != prefill ]; then # FOCUS=prefill: no decode A/B (nor its ncu) this time
    dec_ab 1 $DEC_AB
    dec_ab 2 $(echo $DEC_AB | tr ' ' '\n' | tac)
    grep -h -E "KV (bf16|fp8)" "$LOGS"/bench_dec_*.log >/dev/null 2>&1 &&
        for f in "$LOGS"/bench_dec_*.log; do
            printf '%-28s %s\n' "$(basename "$f" .log)" "$(grep -E 'KV (bf16|fp8)' "$f" | awk '{printf "%s med %s ms %s  ", $6, $8, $12}')"
        done >"$LOGS/dec_ab.txt"
fi
[ -z "${FOCUS:-}" ] && PAGEDATTN_CUDA_MMA=0 step bench_prefill_simt 90 "$CLI" bench --backend cuda --cases prefill
# prefill variants, two rounds in opposite orders, beside earlier builds: AB_BUILDS lists
# DIR[:VARIANT] (DIR holding tools/pagedattn and libpagedattn.so of an earlier commit, run with
# PAGEDATTN_CUDA_PREFILL=VARIANT when given)
ab_old() { # ab_old ROUND
    for b in ${AB_BUILDS:-}; do
        local dir=${b%%:*} var=
        [ "$dir" != "$b" ] && var=${b#*:}
        PAGEDATTN_CUDA_PREFILL=$var LD_LIBRARY_PATH="$ROOT/$dir" \
            step bench_prefill_$(basename "$dir")$var.$1 60 "$dir/tools/pagedattn" bench --backend cuda --cases prefill
    done
}
PF_VARIANTS=${PF_VARIANTS:-"fa fa32"}
for round in 1 2; do
    [ "${FOCUS:-}" = decode ] && break
    vs=$PF_VARIANTS
    [ $round = 2 ] && vs=$(echo $PF_VARIANTS | tr ' ' '\n' | tac | tr '\n' ' ')
    [ $round = 1 ] && ab_old $round
    for v in $vs; do
        PAGEDATTN_CUDA_PREFILL=$v step bench_prefill_$v.$round 60 "$CLI" bench --backend cuda --cases prefill
    done
    [ $round = 2 ] && ab_old $round
done
# Where the decode time goes: Nsight Compute on one decode-kernel launch of the bench (bf16)
# (memory throughput against the peak, achieved occupancy, stall reasons), clocks left alone.
if command -v ncu >/dev/null 2>&1 && [ "${FOCUS:-}" != prefill ]; then
    for o in items heads; do
        PAGEDATTN_CUDA_DEC_ORDER=$o step ncu_decode_$o 90 ncu --clock-control none --kernel-name regex:decode \
            --launch-skip 3 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
            --section MemoryWorkloadAnalysis_Tables --section Occupancy --section WarpStateStats \
            --section SchedulerStats --section LaunchStats "$CLI" bench --backend cuda --cases decode
    done
    # the same for the fp8 (E4M3, bf16 q) decode kernel, with the instruction mix
    step ncu_decode_fp8 90 ncu --clock-control none --kernel-name-base demangled \
        --kernel-name "regex:decode_mmat_kernel<128, 3" --launch-skip 3 --launch-count 1 --section SpeedOfLight \
        --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats \
        --section InstructionStats "$CLI" bench --backend cuda --cases decode
fi
if command -v ncu >/dev/null 2>&1; then
    # one launch of the prefill kernel of each fa variant (tensor-pipe use, issue rate, stalls)
    for v in ${NCU_PREFILL:-fa}; do # NCU_PREFILL=none: none
        [ "$v" = none ] || [ "${FOCUS:-}" = decode ] && continue
        PAGEDATTN_CUDA_PREFILL=$v step ncu_prefill_$v 90 ncu --clock-control none --kernel-name regex:attn_fa \
            --launch-skip 2 --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis \
            --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats \
            --section InstructionStats "$CLI" bench --backend cuda --cases prefill
    done
    # where a prefill kernel's warps stall, by source line (-lineinfo): a report, then its details
    # (the source counters' tables of uncoalesced accesses and bank conflicts) and its
    # per-instruction SASS page; NCU_SRC names the variant (default: the default kernel; none)
    [ "${NCU_SRC:-}" != none ] && [ "${FOCUS:-}" != decode ] && PAGEDATTN_CUDA_PREFILL=${NCU_SRC:-} step ncu_prefill_src 90 ncu --clock-control none --kernel-name regex:attn_fa --launch-skip 2 --launch-count 1 \
        --section WarpStateStats --section SourceCounters --section MemoryWorkloadAnalysis_Tables \
        -f -o "$LOGS/prefill_src" "$CLI" bench --backend cuda --cases prefill
    if [ -f "$LOGS/prefill_src.ncu-rep" ]; then
        step ncu_prefill_details 60 ncu --import "$LOGS/prefill_src.ncu-rep" --page details --print-details all
        step ncu_prefill_sass 60 ncu --import "$LOGS/prefill_src.ncu-rep" --page source --csv --print-source sass
    fi
fi
if [ -n "${CPU_NATIVE:-}" ] && [ "${CPU_BENCH:-1}" != 0 ]; then
    # the cpu backend's x86 paths side by side on this host, threads 1 and all: the bf16 cases
    # (CPU_CASES: another --cases filter; CPU_BENCH=0: none)
    for isa in avx2 avx512 avx512bf16; do
        PAGEDATTN_CPU_ISA=$isa step cpu_bench_$isa 90 "$CPU_NATIVE/tools/pagedattn" bench \
            --cases "${CPU_CASES:-bf16}" --threads "1,$JOBS" --repeats 3
    done
fi
if [ -n "${CPU_AB_PID:-}" ]; then
    wait "$CPU_AB_PID"
    for f in "$LOGS"/cpu_ab_*.log; do
        printf '%-34s %s\n' "$(basename "$f" .log)" "$(grep -E '^(decode|prefill) ' "$f" | awk '{for (i = 1; i < NF; i++) if ($i == "cpu") break; printf "%s %s %s ms  %s  ", $(i + 2), $(i + 3), $(i + 4), $NF}')"
    done >"$LOGS/cpu_ab.txt"
fi
# The Python package's suite against this build (torch is there, so test_torch runs too).
[ "${PYTEST:-1}" != 0 ] && PAGEDATTN_LIBRARY="$ROOT/$BUILD/libpagedattn.so" PYTHONPATH="$ROOT/python" \
    step pytest 120 python3 -m pytest -q -rf --maxfail=30 -p no:cacheprovider python/tests
finish
