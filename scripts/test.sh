#!/usr/bin/env bash
# Builds pagedattn and runs every test: the C suite under CTest (unit tests, validation tests,
# the shared case grid on every backend and CPU ISA path this machine runs, determinism; the
# CUDA tests skip without a GPU) and the Python package's pytest suite in a fresh virtual
# environment. Set PAGEDATTN_BUILD_DIR to build elsewhere than ./build.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build="${PAGEDATTN_BUILD_DIR:-build}"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DPAGEDATTN_WERROR=ON >/dev/null
cmake --build "$build" -j"$(nproc)"
ctest --test-dir "$build" --output-on-failure -j2

# The Python package: built from source (CMake, like above) into a fresh venv.
venv="${PAGEDATTN_VENV:-.venv}"
python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check -r python/requirements-test.txt
"$venv/bin/pip" install -q --disable-pip-version-check ./python
"$venv/bin/python" -m pytest -q python/tests
