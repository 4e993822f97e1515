#!/usr/bin/env bash
# Groups compute-sanitizer racecheck's hazard reports (--racecheck-report hazard
# --print-limit 0, on stdin) by (kind, each side's access, warpgroup and PC) and
# prints the counts, largest first: racecheck's output on a fused-pass run is
# hundreds of thousands of lines, its pairs a few dozen.
#   compute-sanitizer --tool racecheck --racecheck-report hazard --print-limit 0 \
#     ./build/gdn --ops chunk_fwd+bwd --B 1 --T 1024 --H 2 --HV 4 --reps 1 --warmup 0 | bash bench/racecheck_pairs.sh
awk '
/Potential (RAW|WAR|WAW) hazard/ { match($0, /(RAW|WAR|WAW)/); kind = substr($0, RSTART, 3); n = 0; next }
/(Write|Read) Thread \(/ {
    match($0, /(Write|Read) Thread \([0-9]+/); s = substr($0, RSTART, RLENGTH); split(s, a, "(");
    acc = (s ~ /^Write/) ? "W" : "R"; wg = int(a[2] / 128);
    pc = "?"; if (match($0, /\+0x[0-9a-f]+/)) pc = substr($0, RSTART + 1, RLENGTH - 1);
    side[n++] = acc " wg" wg " " pc;
    if (n == 2) { cnt[kind ": " side[0] " / " side[1]]++; n = 0 }
    next
}
/invalid __shared__/ { inv++ }
END {
    for (k in cnt) printf "%8d  %s\n", cnt[k], k | "sort -rn";
    close("sort -rn");
    if (inv) printf "%8d  potential invalid __shared__ accesses\n", inv
}'
