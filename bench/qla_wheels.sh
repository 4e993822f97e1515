#!/usr/bin/env bash
# FlashQLA (pip wheels flash-qla and tilelang) for bench/bench_gpu.py on a GPU
# machine that reaches no package index: fetch the wheels where PyPI is
# reachable, carry them over, install them offline there.
#
#   bench/qla_wheels.sh download DIR [PYVER]   wheels for CPython PYVER (default 3.12), manylinux x86_64:
#                                              DIR/a: tilelang (~50 MB), DIR/b: flash-qla and tilelang's
#                                              other dependencies (~34 MB): under a 64 MiB upload, one each
#   bench/qla_wheels.sh install DIR/a ...      pip install --no-deps every wheel in the folders given
#
# torch, numpy and the CUDA toolkit are the GPU machine's own. Then
#   PYTHONPATH=$PWD/python:$PWD/.fla python3 bench/bench_gpu.py --only=chunk_fwd+bwd
# adds FlashQLA's columns (QLA us, QLA/gdn, QLA MiB).
# TileLang compiles FlashQLA's kernels for each shape on first use (its backward
# kernel alone takes minutes on an H100 host). On a machine that does not keep
# its home between runs, point TILELANG_CACHE_DIR (and TRITON_CACHE_DIR, for
# FLA) at a folder that is kept, and bring it back on the next run.
set -euo pipefail
cmd=${1:-}
case $cmd in
  download)
    dir=${2:?usage: qla_wheels.sh download DIR [PYVER]}; py=${3:-3.12}
    mkdir -p "$dir/a" "$dir/b"
    plat=(--only-binary=:all: --python-version "$py" --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64
          --platform manylinux_2_17_x86_64 --no-deps)
    pip download "${plat[@]}" -d "$dir/a" "tilelang==0.1.15"
    pip download "${plat[@]}" -d "$dir/b" "flash-qla==0.1.3" "apache-tvm-ffi>=0.1.11,<0.1.13" torch-c-dlpack-ext \
      cloudpickle ml-dtypes "z3-solver>=4.13.0,<4.15.5" "tqdm>=4.62.3" "typing-extensions>=4.10.0" psutil
    du -sh "$dir/a" "$dir/b" ;;
  install)
    shift
    [ $# -gt 0 ] || { echo "usage: qla_wheels.sh install DIR ..." >&2; exit 2; }
    for d in "$@"; do python3 -m pip install --no-index --no-deps "$d"/*.whl; done ;;
  *)
    sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
esac
