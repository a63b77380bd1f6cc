#!/usr/bin/env bash
# Builds ggml's CPU library from a source tree you supply (a llama.cpp checkout, or the copy
# vendored in llama-cpp-python's sdist) and links bench/compare/ggml_fa.c against it.
#   bench/compare/build_ggml.sh LLAMA_CPP_DIR [BUILD_DIR]   -> BUILD_DIR/ggml_fa
# Nothing is downloaded; the tree is built with -march=native (GGML_NATIVE), one-shot.
set -euo pipefail
src=${1:?usage: build_ggml.sh LLAMA_CPP_DIR [BUILD_DIR]}
out=${2:-build-ggml}
here=$(cd "$(dirname "$0")" && pwd)
cmake -S "$src" -B "$out" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_OPENMP=OFF \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF >"$out.cmake.log"
cmake --build "$out" -j"$(nproc)" --target ggml ggml-cpu >"$out.build.log"
libs=()
for l in libggml.a libggml-cpu.a libggml-base.a; do libs+=("$(find "$out" -name "$l" | head -1)"); done
cc -O2 -I"$src/ggml/include" "$here/ggml_fa.c" -o "$out/ggml_fa" "${libs[@]}" -lstdc++ -lm -lpthread
echo "$out/ggml_fa"
