#!/usr/bin/env bash
# devcheck.sh: the cuda backend's first contact with a GPU, in one go (sized for ~8 minutes on
# an H100/H200 with 16 cores). Run from the repository root:
#     bash src/backends/cuda/devcheck.sh            (logs under ${OUT:-build-devcheck/logs})
# Steps: configure + build with PAGEDATTN_CUDA=ON (Release, sm_80;90, tests + CLI), print
# `pagedattn info`, run test_cuda_ops and the CUDA case grid, compute-sanitizer memcheck and
# racecheck on the ops test and on a filtered slice of the grid, then the speed runs (cuda_bench:
# copy bandwidth + decode + prefill; PyTorch SDPA on the prefill shape; `pagedattn bench`). Each step is time-boxed; a failed step is reported and the script goes on; the summary
# table comes last. Exit status: number of failed steps.
set -u
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$ROOT"
BUILD=${BUILD:-build-devcheck}
LOGS=${OUT:-$BUILD/logs}
mkdir -p "$LOGS"
JOBS=$(nproc 2>/dev/null || echo 4)
export PATH="/usr/local/cuda/bin:$PATH"
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1 || true)
GEN=""
command -v ninja >/dev/null 2>&1 && GEN="-G Ninja"
declare -a SUMMARY
FAILS=0

step() { # step NAME TIMEOUT_S CMD...
    local name=$1 limit=$2; shift 2
    local t0=$(date +%s)
    echo "=== $name (limit ${limit}s): $*"
    timeout -k 10 "$limit" "$@" >"$LOGS/$name.log" 2>&1
    local rc=$? t=$(( $(date +%s) - t0 ))
    tail -n 25 "$LOGS/$name.log"
    local verdict=ok
    if [ $rc -eq 77 ]; then verdict=SKIP; elif [ $rc -ne 0 ]; then verdict="FAIL(rc=$rc)"; FAILS=$((FAILS + 1)); fi
    [ $rc -eq 124 ] && verdict="TIMEOUT"
    SUMMARY+=("$(printf '%-22s %-12s %5ss' "$name" "$verdict" "$t")")
    return $rc
}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv >"$LOGS/gpu.txt" 2>&1
cat "$LOGS/gpu.txt"

step configure 90 cmake -S . -B "$BUILD" $GEN -DPAGEDATTN_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
    -DPAGEDATTN_BUILD_TESTS=ON -DPAGEDATTN_BUILD_TOOLS=ON || true
step build 240 cmake --build "$BUILD" -j"$JOBS" || true

CLI="$BUILD/tools/pagedattn"
[ -x "$CLI" ] || CLI=$(find "$BUILD" -maxdepth 3 -type f -name pagedattn -perm -u+x | head -1)
T="$BUILD/tests"

[ -n "$CLI" ] && step info 30 "$CLI" info
step ops 60 "$T/test_cuda_ops"
step splits 60 "$T/test_cuda_splits"
# The grid: the whole of it (every feature and dtype) against the reference.
step grid 150 "$T/test_cuda_grid"
# The opt-in tensor-core prefill tiles (16-bit q == cache dtype, head size 64/128, query > 16).
PAGEDATTN_CUDA_MMA=1 step grid_mma 150 "$T/test_cuda_grid"
PAGEDATTN_CUDA_MMA=1 step splits_mma 60 "$T/test_cuda_splits"
# Grid under the other backends too, as a baseline that the harness itself is sound here.
step grid_reference 60 "$T/test_grid_reference" || true

if [ -n "$SAN" ]; then
    step memcheck_ops 60 "$SAN" --tool memcheck --error-exitcode 1 "$T/test_cuda_ops"
    step racecheck_ops 60 "$SAN" --tool racecheck --error-exitcode 1 "$T/test_cuda_ops"
    # A slice of the grid (sanitizers are ~10-100x slower): decoder cases only.
    step memcheck_grid 90 "$SAN" --tool memcheck --error-exitcode 1 "$T/test_cuda_grid" "decoder"
    step racecheck_grid 90 "$SAN" --tool racecheck --error-exitcode 1 "$T/test_cuda_grid" "decoder"
else
    echo "compute-sanitizer not found: sanitizer steps skipped"
    SUMMARY+=("compute-sanitizer      SKIP(not found)")
fi

# Speed: the backend's own bench (copy bandwidth, decode, prefill in one run) and PyTorch SDPA
# (flash) on the prefill shape, for the issue's targets. `pagedattn bench --backend cuda` is
# tried too (the CLI may still drive host backends only).
CUDA_LIB=$(dirname "$(command -v nvcc)")/../lib64
gcc -std=c11 -O2 -Iinclude -I"$(dirname "$(command -v nvcc)")/../include" src/backends/cuda/bench/cuda_bench.c \
    "$BUILD/libpagedattn.a" "$CUDA_LIB/libcudart_static.a" -ldl -lrt -lpthread -lm -o "$BUILD/cuda_bench" \
    >"$LOGS/cuda_bench_build.log" 2>&1 || echo "cuda_bench did not build (see $LOGS/cuda_bench_build.log)"
[ -x "$BUILD/cuda_bench" ] && step cuda_bench 90 "$BUILD/cuda_bench"
[ -x "$BUILD/cuda_bench" ] && PAGEDATTN_CUDA_MMA=1 step cuda_bench_mma 90 "$BUILD/cuda_bench"
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
[ -n "$CLI" ] && step cli_bench 30 "$CLI" bench --backend cuda

echo
echo "=== devcheck summary (logs in $LOGS)"
printf '%s\n' "${SUMMARY[@]}"
exit $FAILS
