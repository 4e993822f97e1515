#!/usr/bin/env bash
# On a GPU machine: build, check and time chunk-forward variants in one go.
#   bench/gpu_variants.sh [tests|notests] [NAME=CUDA_FLAGS ...]
# Builds the default into build-gpu, runs the cuda test group (unless
# "notests"), then gdn_bench_cuda; each NAME=FLAGS builds build-NAME with
# those CUDA flags (e.g. nodbg=-DNDEBUG, or a kernel's build option) and
# runs its bench too, so variants are timed side by side on one card.
# Build options of the kernels that exist for this comparison:
#   war=-DGDN_FUSED_WAR_MBARRIER       the fused backward's WAR cluster barrier
#                                      as an mbarrier (src/cuda/chunk_bwd_fused.cu)
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-tests}; shift || true
J=$(nproc)
cmake -B build-gpu -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build build-gpu -j"$J" 2>&1 | grep -E "error|warning: [^(]" 
if [ "$mode" = tests ]; then
  ./build-gpu/gdn_tests --only=cuda 2>&1 | tail -n 25
fi
echo "==== default"; ./build-gpu/gdn_bench_cuda 2>&1 | grep -iE "qwen3next|long1|varlen|d256|chunk forward|copy"
for v in "$@"; do
  name=${v%%=*}; flags=${v#*=}
  cmake -B "build-$name" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_FLAGS="$flags" >/dev/null && cmake --build "build-$name" -j"$J" --target gdn_bench_cuda 2>&1 | grep -E "error"
  echo "==== $name ($flags)"; "./build-$name/gdn_bench_cuda" 2>&1 | grep -iE "qwen3next|long1|varlen|d256"
done
