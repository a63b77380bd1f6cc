#!/usr/bin/env bash
# run_emu.sh: builds the cuda backend's kernels and host code with g++ against the CPU emulator
# (cuda_emu.h/.cpp: one fiber per CUDA thread, host memory as device memory) and runs the cuda
# tests on it: test_cuda_ops, test_cuda_splits and the shared case grid (optionally filtered). No GPU, no CUDA
# driver needed (only the CUDA headers). A pass here means the logic is right, not that the
# GPU build is: see cuda_emu.h for what it does not check.
#   bash src/backends/cuda/emu/run_emu.sh [grid-filter]      SAN=1 for ASan+UBSan
set -eu
ROOT=$(cd "$(dirname "$0")/../../../.." && pwd)
cd "$ROOT"
B=${BUILD:-build-cuda-emu}
CUDA_INC=${CUDA_INC:-/usr/local/cuda/include}
FLAGS="-O2 -g"
CMAKE_SAN=""
if [ "${SAN:-0}" = 1 ]; then FLAGS="$FLAGS -fsanitize=address,undefined -fno-omit-frame-pointer"; CMAKE_SAN="-DPAGEDATTN_SANITIZE=address,undefined"; fi
cmake -S . -B "$B" -DPAGEDATTN_CUDA=OFF -DPAGEDATTN_BUILD_TOOLS=OFF $CMAKE_SAN >/dev/null
cmake --build "$B" -j"$(nproc)" --target pagedattn_static pagedattn_testsupport >/dev/null
O="$B/emu-obj"
mkdir -p "$O"
rm -f "$O"/*.o # a failed compile must not leave an old object to link
INC="-Iinclude -Isrc -Isrc/backends/cuda -I$CUDA_INC -Itests -Itests/support"
pids=()
for f in cuda_attn cuda_ops cuda_host; do
    g++ -std=c++17 $FLAGS -DPA_CU_EMULATE -DPAGEDATTN_BUILDING -Wall -Wno-unused-function -Wno-unknown-pragmas $INC -x c++ -c src/backends/cuda/$f.cu -o "$O/$f.o" &
    pids+=($!)
done
g++ -std=c++17 $FLAGS -Wall $INC -c src/backends/cuda/emu/cuda_emu.cpp -o "$O/cuda_emu.o" &
pids+=($!)
gcc -std=c11 $FLAGS -DPAGEDATTN_BUILDING -DPAGEDATTN_HAVE_CUDA $INC -c src/backends/cuda/cuda_backend.c -o "$O/cuda_backend.o" &
pids+=($!)
gcc -std=c11 $FLAGS -DPAGEDATTN_BUILDING -DPAGEDATTN_HAVE_CUDA $INC -c src/core/registry.c -o "$O/registry.o" &
pids+=($!)
for p in "${pids[@]}"; do wait "$p"; done # (a bare wait returns 0 whatever the jobs did)
for t in test_cuda_grid test_cuda_ops test_cuda_splits test_large_cache; do
    gcc -std=c11 $FLAGS $INC -c tests/$t.c -o "$O/$t.o"
    g++ $FLAGS "$O/$t.o" "$O"/registry.o "$O"/cuda_backend.o "$O"/cuda_host.o "$O"/cuda_attn.o \
        "$O"/cuda_ops.o "$O"/cuda_emu.o "$B/tests/libpagedattn_testsupport.a" "$B/libpagedattn.a" \
        -lpthread -lm -o "$O/$t"
done
echo "== emulated test_cuda_ops"
"$O/test_cuda_ops"
echo "== emulated test_cuda_splits"
"$O/test_cuda_splits"
echo "== emulated test_large_cache (pools past 2^32 elements; its cpu part runs natively)"
"$O/test_large_cache"
echo "== emulated test_cuda_grid ${1:-(all cases)}"
"$O/test_cuda_grid" "$@"
