#!/usr/bin/env bash
# Builds pagedattn (Release) and runs the main job, `pagedattn run`, on its embedded default
# workload. Extra arguments go to `pagedattn run` (see `pagedattn run --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
./build/tools/pagedattn run "$@"
