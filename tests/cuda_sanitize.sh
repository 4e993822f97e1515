#!/usr/bin/env bash
# Every CUDA kernel of gdn under compute-sanitizer at small shapes: memcheck
# (out-of-bounds and misaligned accesses, leaks), racecheck (shared-memory
# hazards), initcheck (reads of device memory never written) and synccheck
# (barriers). Each run is the gdn command on one small shape with one rep,
# so every op's kernels run once per tool: the chunk forward (whole and cut
# into segments), forward+backward (every gradient), recurrent, gate, L2 norm,
# decode step (+ conv update), conv1d and gated RMSNorm forward and backward,
# over dtypes, odd head sizes, GVA, varlen and the v-first state layout.
#
#   tests/cuda_sanitize.sh [-b BUILD_DIR] [-t TOOL,...] [-q]
#
#   -b DIR    the build with the CUDA backend (default build)
#   -t LIST   tools, comma-separated (default memcheck,racecheck,initcheck,synccheck)
#   -q        one shape per tool instead of all of them
#
# Prints one line per (tool, shape) with the sanitizer's error count and ends
# with "N runs clean, M with errors"; exit status 1 if any run reported an
# error or failed. Needs a GPU and compute-sanitizer (CUDA toolkit).
set -uo pipefail
cd "$(dirname "$0")/.."

build=build tools=memcheck,racecheck,initcheck,synccheck quick=0
while [ $# -gt 0 ]; do
  case $1 in
    -b) build=$2; shift 2 ;;
    -t) tools=$2; shift 2 ;;
    -q) quick=1; shift ;;
    *) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
  esac
done
gdn=$build/gdn
[ -x "$gdn" ] || { echo "cuda_sanitize: no gdn command at $gdn (build with CUDA first)" >&2; exit 2; }
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
[ -x "$san" ] || { echo "cuda_sanitize: compute-sanitizer not found" >&2; exit 2; }

# small shapes: every op, one rep, no warm-up (T past one chunk; odd sizes)
common="--backend cuda --reps 1 --warmup 0"
shapes=(
  "--T 200 --H 2 --HV 4 --K 128 --V 128"
  "--T 300 --H 2 --HV 4 --K 128 --V 128 --seq-split 3"
  "--T 150 --H 1 --HV 3 --K 40 --V 72 --dtype f32 --v-first"
  "--T 260 --H 2 --HV 2 --K 64 --V 64 --varlen 3 --dtype f16 --no-gate --no-beta-sigmoid"
  "--T 130 --H 1 --HV 2 --K 256 --V 256 --no-l2norm --decode-B 5"
)
[ "$quick" = 1 ] && shapes=("${shapes[0]}")

clean=0 bad=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for tool in ${tools//,/ }; do
  for s in "${shapes[@]}"; do
    t0=$(date +%s)
    # shellcheck disable=SC2086
    "$san" --tool "$tool" --error-exitcode 86 --print-limit 20 $( [ "$tool" = memcheck ] && echo --leak-check full ) \
      "$gdn" $common $s > "$log" 2>&1
    rc=$?
    n=$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) error.*/\1/p' "$log" | tail -n 1)
    [ -z "$n" ] && n=0
    if [ "$tool" = racecheck ]; then   # racecheck reports hazards, not errors
      h=$(sed -n 's/.*RACECHECK SUMMARY: \([0-9]*\) hazard.*/\1/p' "$log" | tail -n 1)
      [ -n "$h" ] && n=$((n + h))
    fi
    dt=$(( $(date +%s) - t0 ))
    if [ "$rc" = 0 ] && [ "$n" = 0 ]; then
      clean=$((clean + 1)); printf 'clean   %-9s %4d s  %s\n' "$tool" "$dt" "$s"
    else
      bad=$((bad + 1)); printf 'ERRORS  %-9s %4d s  %s  (exit %d, %s errors)\n' "$tool" "$dt" "$s" "$rc" "$n"
      grep -m 20 -E "=========|FAIL|error" "$log" | sed 's/^/    /'
    fi
  done
done
echo "$clean runs clean, $bad with errors"
[ "$bad" = 0 ]
