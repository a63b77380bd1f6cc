#!/usr/bin/env bash
# devcheck.sh: the cuda backend on a GPU, in one go (sized for ~4-5 minutes on an H100/H200 with
# 16 cores). Run from the repository root:
#     bash src/backends/cuda/devcheck.sh     (logs under $BUILD/logs, tarred into $OUT if set)
# Phases: configure + build with PAGEDATTN_CUDA=ON (Release; CUDA_ARCHS, default 90), `pagedattn
# info`; the correctness tests in parallel (ops, splits, the whole case grid against the
# reference, each also with the opt-in tensor-core path); compute-sanitizer memcheck and racecheck
# in parallel (ops test, grid slices); then, alone on the GPU, the speed runs (cuda_bench: copy
# bandwidth, decode, prefill, CUDA-graph capture; PyTorch SDPA on the prefill shape). Each step is
# time-boxed; a failed step is reported and the script goes on; the summary table comes last.
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
    timeout -k 10 "$limit" "$@" >"$LOGS/$name.log" 2>&1
    local rc=$? t=$(( $(date +%s) - t0 ))
    local verdict=ok
    if [ $rc -eq 77 ]; then verdict=SKIP; elif [ $rc -eq 124 ]; then verdict=TIMEOUT;
    elif [ $rc -ne 0 ]; then verdict="FAIL(rc=$rc)"; fi
    printf '%-16s %-12s %4ss  %s\n' "$name" "$verdict" "$t" "$(grep -E 'failures|RESULT|TFLOP|checks' "$LOGS/$name.log" | tail -1 | cut -c1-90)" >"$LOGS/$name.sum"
    echo "[$(( $(date +%s) - T0 ))s] $(cat "$LOGS/$name.sum")"
    return $rc
}
finish() {
    echo
    echo "=== devcheck summary ($(( $(date +%s) - T0 )) s; logs in $LOGS)"
    cat "$LOGS"/*.sum
    local fails
    fails=$(grep -vc -E '^[^ ]+ +(ok|SKIP) ' "$LOGS"/*.sum | awk -F: '{s += $2} END {print s + 0}')
    [ -n "${OUT:-}" ] && tar czf "$OUT/devcheck-logs.tgz" -C "$BUILD" logs
    exit "$fails"
}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv >"$LOGS/gpu.txt" 2>&1
cat "$LOGS/gpu.txt"

step configure 90 cmake -S . -B "$BUILD" $GEN -DPAGEDATTN_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90}" -DPAGEDATTN_BUILD_TESTS=ON -DPAGEDATTN_BUILD_TOOLS=ON || finish
step build 240 cmake --build "$BUILD" -j"$JOBS" || finish

CLI="$BUILD/tools/pagedattn"
T="$BUILD/tests"
step info 30 "$CLI" info

# Phase 1: correctness, in parallel (each test's reference side runs on its own CPU core).
step ops 90 "$T/test_cuda_ops" &
step splits 90 "$T/test_cuda_splits" &
step grid 150 "$T/test_cuda_grid" &
PAGEDATTN_CUDA_MMA=1 step grid_mma 150 "$T/test_cuda_grid" &
PAGEDATTN_CUDA_MMA=1 step splits_mma 90 "$T/test_cuda_splits" &
wait

# Phase 2: compute-sanitizer (10-100x slower), in parallel: the ops test whole, grid slices.
if [ -n "$SAN" ]; then
    step memcheck_ops 120 "$SAN" --tool memcheck --error-exitcode 1 "$T/test_cuda_ops" &
    step racecheck_ops 120 "$SAN" --tool racecheck --error-exitcode 1 "$T/test_cuda_ops" &
    step memcheck_grid 150 "$SAN" --tool memcheck --error-exitcode 1 "$T/test_cuda_grid" "/" &
    step racecheck_grid 150 "$SAN" --tool racecheck --error-exitcode 1 "$T/test_cuda_grid" "random/" &
    PAGEDATTN_CUDA_MMA=1 step memcheck_mma 150 "$SAN" --tool memcheck --error-exitcode 1 "$T/test_cuda_grid" "random/" &
    PAGEDATTN_CUDA_MMA=1 step racecheck_mma 150 "$SAN" --tool racecheck --error-exitcode 1 "$T/test_cuda_grid" "random/" &
    step memcheck_splits 120 "$SAN" --tool memcheck --error-exitcode 1 "$T/test_cuda_splits" &
    wait
else
    echo "compute-sanitizer not found" >"$LOGS/sanitizer.log"
    printf '%-16s %-12s\n' sanitizer "FAIL(not found)" >"$LOGS/sanitizer.sum"
fi

# Phase 3: speed, alone on the GPU.
CUDA_LIB=$(dirname "$(command -v nvcc)")/../lib64
gcc -std=c11 -O2 -Iinclude -I"$(dirname "$(command -v nvcc)")/../include" src/backends/cuda/bench/cuda_bench.c \
    "$BUILD/libpagedattn.a" "$CUDA_LIB/libcudart_static.a" -ldl -lrt -lpthread -lm -o "$BUILD/cuda_bench" \
    >"$LOGS/cuda_bench_build.log" 2>&1 || echo "cuda_bench did not build (see $LOGS/cuda_bench_build.log)"
step cuda_bench 90 "$BUILD/cuda_bench"
PAGEDATTN_CUDA_MMA=1 step cuda_bench_mma 90 "$BUILD/cuda_bench"
cat >"$BUILD/sdpa.py" <<'PY'
import torch, torch.nn.functional as F
S, H, HKV, D = 4096, 32, 8, 128
q = torch.randn(1, H, S, D, device="cuda", dtype=torch.bfloat16)
k = torch.randn(1, HKV, S, D, device="cuda", dtype=torch.bfloat16).repeat_interleave(H // HKV, 1)
v = torch.randn(1, HKV, S, D, device="cuda", dtype=torch.bfloat16).repeat_interleave(H // HKV, 1)
try:
    from torch.nn.attention import sdpa_kernel, SDPBackend
    ctx = sdpa_kernel(SDPBackend.FLASH_ATTENTION)
except Exception:
    ctx = torch.backends.cuda.sdp_kernel(enable_flash=True, enable_math=False, enable_mem_efficient=False)
with ctx:
    for _ in range(3): F.scaled_dot_product_attention(q, k, v, is_causal=True)
    ts = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); F.scaled_dot_product_attention(q, k, v, is_causal=True); b.record()
        torch.cuda.synchronize(); ts.append(a.elapsed_time(b))
ms = sorted(ts)[len(ts) // 2]
fl = 4.0 * (S * (S + 1) / 2) * D * H
print(f"sdpa flash prefill {S} causal bf16 {H}/{HKV}x{D}: {ms:.3f} ms -> {fl / ms / 1e9:.2f} TFLOP/s")
PY
step sdpa 60 python3 "$BUILD/sdpa.py"
# The Python package's suite against this build (torch is there, so test_torch runs too).
PAGEDATTN_LIBRARY="$ROOT/$BUILD/libpagedattn.so" PYTHONPATH="$ROOT/python" \
    step pytest 120 python3 -m pytest -q -rf --maxfail=30 -p no:cacheprovider python/tests
finish
