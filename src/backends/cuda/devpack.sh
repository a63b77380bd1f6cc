#!/usr/bin/env bash
# devpack.sh: build the cuda backend's test and tool binaries here (nvcc, no GPU needed) with
# devcheck.sh's flags and copy the ones devcheck runs into build-devbin/ (~20 MB), so a device
# session spends no GPU time compiling:
#     bash src/backends/cuda/devpack.sh
#     device run, carry ["build-devbin"]:  PREBUILT=1 BUILD=build-devbin bash src/backends/cuda/devcheck.sh
#     (and, for the host CPU's ISA paths: BUILD=build-devbin/cpu bash bench/check_cpu_native.sh)
set -eu
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$ROOT"
B=build-devcheck
GEN=""
command -v ninja >/dev/null 2>&1 && GEN="-G Ninja"
cmake -S . -B "$B" $GEN -DPAGEDATTN_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90}" -DPAGEDATTN_BUILD_TESTS=ON -DPAGEDATTN_BUILD_TOOLS=ON >/dev/null
cmake --build "$B" -j"$(nproc)"
rm -rf build-devbin
mkdir -p build-devbin/tests build-devbin/tools
cp "$B"/tests/test_cuda_ops "$B"/tests/test_cuda_splits "$B"/tests/test_cuda_grid "$B"/tests/test_large_cache \
    build-devbin/tests/
cp "$B"/tools/pagedattn build-devbin/tools/
# the cpu backend's ISA-walking tests and the CLI without CUDA (0.3-0.5 MB each, against ~5 MB
# with the kernels' fatbin), for bench/check_cpu_native.sh on the GPU machine's host CPU:
#     BUILD=build-devbin/cpu bash bench/check_cpu_native.sh
C=build-cpunative
CPU_TESTS="test_cpu_grid test_cpu_determinism test_cpu_fp8_codes test_cpu_fp8_nan test_cpu_sweep test_large_cache"
cmake -S . -B "$C" $GEN -DPAGEDATTN_CUDA=OFF -DCMAKE_BUILD_TYPE=Release -DPAGEDATTN_BUILD_TESTS=ON \
    -DPAGEDATTN_BUILD_TOOLS=ON >/dev/null
cmake --build "$C" -j"$(nproc)" --target pagedattn_cli $CPU_TESTS
mkdir -p build-devbin/cpu/tests build-devbin/cpu/tools
for t in $CPU_TESTS; do cp "$C/tests/$t" build-devbin/cpu/tests/; done
cp "$C"/tools/pagedattn build-devbin/cpu/tools/
cp -L "$B"/libpagedattn.so build-devbin/libpagedattn.so
git rev-parse --short HEAD >build-devbin/commit
git status --porcelain --untracked-files=no | grep -q . && echo "dirty" >>build-devbin/commit
du -sh build-devbin
