#!/usr/bin/env bash
# devpack.sh: build the cuda backend's test and tool binaries here (nvcc, no GPU needed) with
# devcheck.sh's flags and copy the ones devcheck runs into build-devbin/ (~20 MB), so a device
# session spends no GPU time compiling:
#     bash src/backends/cuda/devpack.sh
#     device run, carry ["build-devbin"]:  PREBUILT=1 BUILD=build-devbin bash src/backends/cuda/devcheck.sh
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
cp "$B"/tests/test_cuda_ops "$B"/tests/test_cuda_splits "$B"/tests/test_cuda_grid build-devbin/tests/
cp "$B"/tools/pagedattn build-devbin/tools/
cp -L "$B"/libpagedattn.so build-devbin/libpagedattn.so
git rev-parse --short HEAD >build-devbin/commit
git status --porcelain --untracked-files=no | grep -q . && echo "dirty" >>build-devbin/commit
du -sh build-devbin
