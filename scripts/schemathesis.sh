#!/usr/bin/env bash
# Contract test: schemathesis (PyPI, `st`) against a live embedded server over HTTPS, with an admin
# token, generating requests for every operation of the served /openapi.json. Fails on any 5xx, any
# response that does not match the spec (status, content type, headers, body schema), any schema-
# valid request refused or schema-violating request accepted, and on a server that dies or logs an
# error. Two passes: the default mode (examples, coverage, fuzzing with valid and invalid data), then
# fuzzing with invalid data only, each with up to SCHEMATHESIS_EXAMPLES (default 200) cases per
# operation. Set SCHEMATHESIS_SEED to replay a run (every run prints its seed).
set -euo pipefail
cd "$(dirname "$0")/.."

examples="${SCHEMATHESIS_EXAMPLES:-200}"
command -v st >/dev/null || {
    echo "schemathesis is required: python3 -m pip install schemathesis==4.32.5" >&2
    exit 1
}
command -v jq >/dev/null || { echo "jq is required" >&2; exit 1; }

cargo build --quiet --bin harvester-cloud
bin="$(cargo metadata --format-version 1 --no-deps | jq -r .target_directory)/debug/harvester-cloud"

work="$(mktemp -d)"
server_pid=""
cleanup() {
    if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
        kill -TERM "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

# A keep-alive connection idle for --header-timeout (10 s by default) is closed, as it should be;
# schemathesis keeps connections in a pool while it generates data, which on a loaded machine can
# take longer, and then a POST sent on a connection closing at that moment fails with an EOF (no
# client retries a POST). The contract is what is tested here, so idle connections stay open longer.
"$bin" --data-dir "$work/data" --log-format json --log info \
    serve --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --header-timeout 120s 2>"$work/server.log" &
server_pid=$!

url=""
for _ in $(seq 1 300); do
    url="$(grep -m1 '"message":"listening' "$work/server.log" 2>/dev/null | jq -r .url || true)"
    [ -n "$url" ] && break
    kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.log" >&2; echo "the server exited" >&2; exit 1; }
    sleep 0.1
done
[ -n "$url" ] || { cat "$work/server.log" >&2; echo "the server did not start" >&2; exit 1; }

token="$(cat "$work/data/admin-token")"
# Per-operation settings (which refusals of valid data are the API working); see the file.
config="$PWD/schemathesis.toml"
seed_args=()
[ -n "${SCHEMATHESIS_SEED:-}" ] && seed_args=(--seed "$SCHEMATHESIS_SEED")

run() {
    # From the scratch directory: schemathesis writes its example database and reports there.
    (cd "$work" && st --config-file "$config" run "$url/openapi.json" \
        --url "$url" \
        --tls-verify "$work/data/tls/ca.crt" \
        --header "Authorization: Bearer $token" \
        --checks all \
        --max-examples "$examples" \
        --generation-database none \
        --request-timeout 30 \
        --no-color \
        "${seed_args[@]}" \
        "$@")
}

status=0
echo "==> schemathesis: all phases, valid and invalid data, up to $examples cases per operation"
run || status=1
echo "==> schemathesis: fuzzing with invalid data only, up to $examples cases per operation"
run --mode negative --phases fuzzing || status=1

if ! kill -0 "$server_pid" 2>/dev/null; then
    echo "the server died during the run" >&2
    status=1
fi
if grep -E '"level":"(ERROR|WARN)"|panicked' "$work/server.log" | grep -v '"authentication failed"' >&2; then
    echo "the server logged errors or warnings during the run (above)" >&2
    status=1
fi
kill -TERM "$server_pid"
if ! wait "$server_pid"; then
    echo "the server did not exit cleanly after SIGTERM" >&2
    status=1
fi
server_pid=""
[ "$status" -eq 0 ] || { tail -50 "$work/server.log" >&2; exit 1; }
echo "schemathesis: no failures"
