#!/usr/bin/env bash
# Cross-builds pagedattn for AArch64 (Linux) and runs its C test suite under qemu-user, so the
# NEON path of the cpu backend (src/backends/cpu/arm/cpu_neon.c) is built and checked against
# the reference on an x86 machine. INSTALLS, if missing (apt-get, sudo when not root): the cross
# compiler gcc-aarch64-linux-gnu and qemu-user. Not part of CI (slow: the cpu grid alone takes
# several minutes under emulation, the whole suite over an hour; the tests' timeouts are 7200 s
# under an emulator). Set PAGEDATTN_ARM_BUILD_DIR to build elsewhere than
# ./build-arm; extra arguments are passed to ctest (e.g. -R cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
need=()
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || need+=(gcc-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null 2>&1 || need+=(qemu-user)
if [ "${#need[@]}" -gt 0 ]; then
  echo "check-arm: installing ${need[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
fi
build="${PAGEDATTN_ARM_BUILD_DIR:-build-arm}"
# the toolchain file sets CMAKE_CROSSCOMPILING_EMULATOR: ctest runs each test under qemu
cmake -S . -B "$build" -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=Release \
  -DPAGEDATTN_CUDA=OFF -DPAGEDATTN_BUILD_TOOLS=ON -DPAGEDATTN_WERROR=ON >/dev/null
cmake --build "$build" -j"$(nproc)"
qemu-aarch64 -L /usr/aarch64-linux-gnu "$build/tools/pagedattn" info | grep -E '^  (isa|neon path):'
ctest --test-dir "$build" --output-on-failure -j"$(nproc)" "$@" # the cuda tests skip
