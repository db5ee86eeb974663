#!/usr/bin/env bash
# Fuzzes the request parsers with cargo-fuzz (libFuzzer) for a bounded time per target. Not part of
# scripts/test.sh: the first build compiles the whole service with coverage instrumentation.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET]      (default 60; or FUZZ_SECONDS)
#   FUZZ_TARGETS="kubeconfig_json" scripts/fuzz.sh 300
#   FUZZ_SANITIZER=none scripts/fuzz.sh       (default address)
#
# Targets (fuzz/fuzz_targets/): kubeconfig_json (POST bodies), kubeconfig_query (GET queries),
# kubeconfig_agree (POST and GET parse the same fields alike), lb_bodies (IPPool and LoadBalancer
# bodies through the mutators and admission checks). Each accepted cloud-config request must have
# valid names and read back the same (fuzz_targets/oracle.rs). New inputs go to fuzz/corpus/<target>
# (ignored by git; the hand-written seeds are in fuzz/seeds/<target>); a crash is saved under
# fuzz/artifacts/<target>/ and fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."

secs="${1:-${FUZZ_SECONDS:-60}}"
sanitizer="${FUZZ_SANITIZER:-address}"

# cargo-fuzz passes -Z flags to rustc: nightly when it is installed, otherwise the stable toolchain
# with RUSTC_BOOTSTRAP=1, which lets stable accept them.
toolchain=()
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    toolchain=(+nightly)
else
    export RUSTC_BOOTSTRAP=1
fi
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked

targets="${FUZZ_TARGETS:-$(cargo "${toolchain[@]}" fuzz list --fuzz-dir fuzz)}"
for target in $targets; do
    printf '\n==> fuzzing %s for %ss (sanitizer: %s)\n' "$target" "$secs" "$sanitizer"
    corpus=(fuzz/corpus/"$target")
    mkdir -p "${corpus[0]}"
    [ -d fuzz/seeds/"$target" ] && corpus+=(fuzz/seeds/"$target")
    cargo "${toolchain[@]}" fuzz run --fuzz-dir fuzz --sanitizer "$sanitizer" "$target" "${corpus[@]}" -- \
        -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=8192 -print_final_stats=1
done
printf '\nfuzzing: no crash in %s\n' "$(echo $targets)"
