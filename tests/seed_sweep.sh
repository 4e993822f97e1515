#!/usr/bin/env bash
# Runs the gdn test program over N random base seeds and prints every seed
# that failed, with its FAIL lines, so a failure found by chance can be
# repeated with GDN_TEST_SEED=<seed>.
#
#   tests/seed_sweep.sh [-n N] [-j JOBS] [-t THREADS] [-b PROGRAM] [-s SECONDS] [-- ARGS...]
#
#   -n N        seeds to run (default 100)
#   -s SECONDS  start no seed after this many seconds (the summary counts the
#               seeds that ran); each failing seed is printed as it ends
#   -j JOBS     test programs run at once (default: the number of cores)
#   -t THREADS  OMP_NUM_THREADS for each (default 1)
#   -b PROGRAM  the test program (default build/gdn_tests)
#   ARGS        passed to every run, e.g. -- --only=decode
#
# Ends with "N passed, M failed" counted in seeds; exit status 1 if any seed failed.
set -euo pipefail
cd "$(dirname "$0")/.."

n=100 jobs=$(nproc) threads=1 prog=build/gdn_tests secs=0
while [ $# -gt 0 ]; do
  case $1 in
    -n) n=$2; shift 2 ;;
    -j) jobs=$2; shift 2 ;;
    -t) threads=$2; shift 2 ;;
    -b) prog=$2; shift 2 ;;
    -s) secs=$2; shift 2 ;;
    --) shift; break ;;
    *) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
  esac
done
[ -x "$prog" ] || { echo "seed_sweep: no test program at $prog (build it first)" >&2; exit 2; }

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
trap 'trap - TERM INT; kill 0; exit 130' TERM INT   # a stopped sweep stops its runs too
echo "seed_sweep: $n seeds of $prog $*, $jobs at a time, OMP_NUM_THREADS=$threads"
t0=$(date +%s)
# one random 63-bit seed a line
seeds=$(od -An -v -N$((8 * n)) -tu8 /dev/urandom | tr -s ' ' '\n' | sed '/^$/d' |
        awk '{ printf "%s\n", substr($1, 1, 18) }')
deadline=0
[ "$secs" -gt 0 ] && deadline=$(( t0 + secs ))
export prog threads dir deadline
run_one() {
  local seed=$1
  [ -d "$dir" ] || return 0
  if [ "$deadline" -gt 0 ] && [ "$(date +%s)" -ge "$deadline" ]; then return 0; fi
  echo "$seed" >> "$dir/ran"
  if GDN_TEST_SEED=$seed OMP_NUM_THREADS=$threads OMP_WAIT_POLICY=passive "$prog" "${@:2}" > "$dir/$seed.log" 2>&1; then
    rm -f "$dir/$seed.log"
  else
    echo "$seed" >> "$dir/failed"
    echo "failed: seed $seed"
  fi
}
export -f run_one
printf '%s\n' $seeds | xargs -P "$jobs" -I{} bash -c 'run_one "$@"' _ {} "$@"

ran=0
[ -f "$dir/ran" ] && ran=$(wc -l < "$dir/ran")
failed=0
if [ -f "$dir/failed" ]; then
  failed=$(wc -l < "$dir/failed")
  for seed in $(sort "$dir/failed"); do
    echo "FAILED seed $seed (repeat: GDN_TEST_SEED=$seed $prog $*)"
    grep -E '^FAIL|rror|Sanitizer|runtime error' "$dir/$seed.log" | head -n 20 | sed 's/^/    /'
  done
fi
echo "seed_sweep: $ran of $n seeds ran in $(( $(date +%s) - t0 )) s"
echo "$(( ran - failed )) passed, $failed failed"
[ "$failed" -eq 0 ]
