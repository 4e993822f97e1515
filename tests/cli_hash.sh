#!/usr/bin/env bash
# The gdn command's --hash and --no-check (ctest gdn_cli_hash): an output's hash
# is the same for one thread and two (the blocks are hashed in parallel, then
# folded in order), some tensors span several 1 MiB blocks, and --no-check
# times and hashes the same outputs without the float64 check, saying so.
#   tests/cli_hash.sh PATH_TO_GDN
set -uo pipefail
gdn=$1
args="--backend cpu --T 3000 --H 2 --HV 4 --ops chunk_fwd,conv1d_bwd --reps 1 --warmup 0 --hash"
fail() { echo "cli_hash: $*" >&2; exit 1; }
one=$(OMP_NUM_THREADS=1 "$gdn" $args --threads 1) || fail "one thread failed"
two=$(OMP_NUM_THREADS=2 "$gdn" $args --threads 2) || fail "two threads failed"
nc=$(OMP_NUM_THREADS=2 "$gdn" $args --threads 2 --no-check) || fail "--no-check failed"
h1=$(grep '^hash ' <<<"$one"); h2=$(grep '^hash ' <<<"$two"); h3=$(grep '^hash ' <<<"$nc")
[ "$(wc -l <<<"$h1")" -eq 6 ] || fail "expected 6 hash lines, got: $h1"
[ "$h1" = "$h2" ] || fail "hashes differ between 1 and 2 threads: $h1 / $h2"
[ "$h1" = "$h3" ] || fail "hashes differ with --no-check: $h1 / $h3"
grep -q 'all within bounds' <<<"$one" || fail "the checked run did not check"
grep -q 'not checked (--no-check)' <<<"$nc" || fail "--no-check did not say so"
grep -q 'within bounds' <<<"$nc" && fail "--no-check claimed a check"
echo "cli_hash: 6 outputs, the same hashes for 1 and 2 threads and with --no-check"
