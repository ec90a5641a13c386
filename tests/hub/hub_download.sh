#!/usr/bin/env bash
# Models by name against a local stand-in for the Hub (fake_hub.mjs): download by name, resume
# an interrupted download, refuse a wrong sha256 or size, --offline, reuse of a Hugging Face
# cache without writing to it, list, rm, and hostile names. The payload is a committed tiny
# model. Every mlxcel run is bounded by `timeout`, so a hang fails instead of stalling CI.
set -uo pipefail
src=${MLXCEL_SOURCE_DIR:?} bin=${MLXCEL_BIN_DIR:?}
payload=$src/tests/fixtures/llama_q4_g64
mlxcel=$bin/mlxcel
t=$(mktemp -d)
hub_pid=
cleanup() {
    [ -n "$hub_pid" ] && kill "$hub_pid" 2>/dev/null
    rm -rf "$t"
}
trap cleanup EXIT

passed=0 failed=0
check() { # check DESCRIPTION COMMAND...
    local what=$1
    shift
    if "$@"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        echo "FAILED: $what" >&2
    fi
}

node "$src/tests/hub/fake_hub.mjs" --root "$payload" --state "$t/hub" \
    --repo mlx-community/tiny-llama --repo acme/tiny &
hub_pid=$!
for _ in $(seq 100); do
    [ -s "$t/hub/port" ] && break
    sleep 0.1
done
if [ ! -s "$t/hub/port" ]; then
    echo "the fake hub did not start" >&2
    echo "0 passed, 1 failed"
    exit 1
fi
export HF_ENDPOINT=http://127.0.0.1:$(cat "$t/hub/port")
export MLXCEL_CACHE_DIR=$t/store HF_HOME=$t/hf
unset HF_HUB_CACHE HF_HUB_OFFLINE HF_TOKEN XDG_CACHE_HOME
mkdir -p "$t/cwd" && cd "$t/cwd"

# run ARGS...: mlxcel with a time limit; stdout in $t/out, stderr in $t/err, status in $rc.
run() {
    timeout 60 "$mlxcel" "$@" >"$t/out" 2>"$t/err"
    rc=$?
}
mode() { echo "$1" >"$t/hub/mode"; }
log_lines() { wc -l <"$t/hub/log" 2>/dev/null || echo 0; }
# Requests made since line $1 of the log whose path contains $2.
log_since() { tail -n +"$(($1 + 1))" "$t/hub/log" | grep -F -- "$2"; }
# True when such a request's log line matches the regex $3.
log_since_has() { log_since "$1" "$2" | grep -q -- "$3"; }
size() { stat -c %s "$1"; }
lfs_size=$(size "$payload/model.safetensors")

# 1. A bare name downloads mlx-community/<name>, with the token, only the runtime's files.
mode normal
HF_TOKEN=secret-token run inspect -m tiny-llama
m=$t/store/models/mlx-community/tiny-llama
check "download by name succeeds: $(cat "$t/err")" [ "$rc" = 0 ]
check "inspect reports the store directory" grep -qF "$m" "$t/out"
check "config.json arrived intact" cmp -s "$payload/config.json" "$m/config.json"
check "model.safetensors arrived intact" cmp -s "$payload/model.safetensors" "$m/model.safetensors"
check "the model is marked complete" [ -f "$m/.complete" ]
check "no partial file is left" [ -z "$(find "$m" -name '*.incomplete')" ]
check "files the runtime does not read are not fetched" \
    [ ! -e "$m/logits.npy" -a ! -e "$m/reference.json" -a ! -e "$m/README.md" -a ! -e "$m/sub" ]
check "nothing but listings and runtime files was requested" \
    [ -z "$(grep -E 'logits|reference|README|extra' "$t/hub/log")" ]
check "the paged listing was followed to its last page" \
    [ "$(grep -c 'cursor=' "$t/hub/log")" -ge 2 ]
check "the token went to the API as a Bearer header" \
    grep -q '"path":"/api/models/mlx-community/tiny-llama/tree/main?recursive=true","range":null,"auth":"Bearer secret-token"' "$t/hub/log"

# 2. A finished model is used without asking the Hub.
before=$(log_lines)
run inspect -m mlx-community/tiny-llama
check "second use succeeds" [ "$rc" = 0 ]
check "second use makes no request" [ "$(log_lines)" = "$before" ]

# 3. A download cut mid-file keeps its bytes and the next run fetches only the rest.
mode cut
before=$(log_lines)
run inspect -m acme/tiny
a=$t/store/models/acme/tiny
check "a cut download fails" [ "$rc" = 1 ]
check "the error names the file and says how to resume: $(cat "$t/err")" \
    grep -q 'model.safetensors.*run again to resume' "$t/err"
check "the partial file holds the bytes that arrived" \
    [ "$(size "$a/model.safetensors.incomplete" 2>/dev/null)" = 100000 ]
check "a cut file is not put in place" [ ! -e "$a/model.safetensors" ]
check "a cut model is not marked complete" [ ! -e "$a/.complete" ]
check "retries asked for the missing range" \
    [ "$(log_since "$before" /cdn/ | grep -c '"range":"bytes=100000-"')" -ge 1 ]
run list --json
check "list shows the cut model as partial" grep -q '"name":"acme/tiny","source":"partial"' "$t/out"
run inspect -m acme/tiny --offline
check "a partial model is never used" [ "$rc" = 1 ]
mode normal
before=$(log_lines)
run inspect -m acme/tiny
check "the resumed download succeeds: $(cat "$t/err")" [ "$rc" = 0 ]
check "the resumed file is byte-exact" cmp -s "$payload/model.safetensors" "$a/model.safetensors"
check "the resume made one request for the LFS file" [ "$(log_since "$before" /cdn/ | wc -l)" = 1 ]
check "the resume asked for the missing range only and got it" \
    log_since_has "$before" /cdn/ "\"range\":\"bytes=100000-\",\"auth\":null,\"status\":206,\"sent\":$((lfs_size - 100000))}"

# 4. A cut within one run is retried from where it stopped; a stale file of the wrong size
# left in an unfinished model's directory is fetched again.
run rm acme/tiny
mkdir -p "$a" && echo '{}' >"$a/config.json"
mode cut-once
before=$(log_lines)
run inspect -m acme/tiny
check "a download cut once completes in the same run: $(cat "$t/err")" [ "$rc" = 0 ]
check "the retry resumed at the cut" \
    log_since_has "$before" /cdn/ '"range":"bytes=100000-".*"status":206'
check "the retried file is byte-exact" cmp -s "$payload/model.safetensors" "$a/model.safetensors"
check "a stale file is replaced" cmp -s "$payload/config.json" "$a/config.json"

# 5. A wrong sha256 or a wrong size deletes the download and leaves nothing in place.
run rm acme/tiny
mode badsha
run inspect -m acme/tiny
check "a wrong sha256 fails" [ "$rc" = 1 ]
check "the sha256 error names the file: $(cat "$t/err")" grep -q 'model.safetensors: sha256' "$t/err"
check "a file with a wrong sha256 is not kept" \
    [ ! -e "$a/model.safetensors" -a ! -e "$a/model.safetensors.incomplete" -a ! -e "$a/.complete" ]
run rm acme/tiny
mode badsize
run inspect -m acme/tiny
check "a wrong size fails, naming the file: $(cat "$t/err")" grep -q 'config.json: downloaded' "$t/err"
check "a file with a wrong size is not kept" \
    [ ! -e "$a/config.json" -a ! -e "$a/config.json.incomplete" -a ! -e "$a/.complete" ]

# 6. A listing that names a path outside the repo is refused before any download.
run rm acme/tiny
mode evil
before=$(log_lines)
run inspect -m acme/tiny
check "an unsafe listing path is refused: $(cat "$t/err")" grep -q "unsafe path '../escape.safetensors'" "$t/err"
check "nothing escaped the store" [ -z "$(find "$t" -name 'escape*')" ]
check "no file was fetched for an unsafe listing" [ -z "$(log_since "$before" /resolve/)" ]
mode normal

# 7. Offline: a missing model is a clear error and no request is made.
before=$(log_lines)
run inspect -m acme/missing --offline
check "--offline with a missing model fails" [ "$rc" = 1 ]
check "--offline says the model is not downloaded: $(cat "$t/err")" grep -q 'acme/missing is not downloaded' "$t/err"
HF_HUB_OFFLINE=1 run tokenize -m acme/missing </dev/null
check "HF_HUB_OFFLINE=1 also keeps it offline" grep -q 'not downloaded' "$t/err"
check "offline runs make no request" [ "$(log_lines)" = "$before" ]

# 8. A Hugging Face cache is reused read only.
hf=$t/hf/hub/models--acme--cached
mkdir -p "$hf/blobs" "$hf/refs" "$hf/snapshots/0123abc"
cfg_sha=$(sha256sum "$payload/config.json" | cut -d' ' -f1)
st_sha=$(sha256sum "$payload/model.safetensors" | cut -d' ' -f1)
cp "$payload/config.json" "$hf/blobs/$cfg_sha"
cp "$payload/model.safetensors" "$hf/blobs/$st_sha"
ln -s "../../blobs/$cfg_sha" "$hf/snapshots/0123abc/config.json"
ln -s "../../blobs/$st_sha" "$hf/snapshots/0123abc/model.safetensors"
printf 0123abc >"$hf/refs/main"
snapshot_state() { find "$t/hf" -printf '%p %y %s %T@ %m\n' | sort; }
snapshot_state >"$t/hf.before"
before=$(log_lines)
run inspect -m acme/cached
check "a model in the Hugging Face cache is used: $(cat "$t/err")" grep -qF "$hf/snapshots/0123abc" "$t/out"
check "using the Hugging Face cache makes no request" [ "$(log_lines)" = "$before" ]
check "the model is not copied into the store" [ ! -e "$t/store/models/acme/cached" ]
run list --json
check "list shows the cached model with its blobs' size" \
    grep -q "\"name\":\"acme/cached\",\"source\":\"hf-cache\",\"complete\":true,\"bytes\":$((lfs_size + $(size "$payload/config.json")))" "$t/out"
run rm acme/cached
check "rm refuses a model only the Hugging Face cache holds" grep -q 'Hugging Face cache' "$t/err"
snapshot_state >"$t/hf.after"
check "the Hugging Face cache is unchanged" cmp -s "$t/hf.before" "$t/hf.after"
rm "$hf/snapshots/0123abc/model.safetensors"
run inspect -m acme/cached --offline
check "a cache snapshot without weights is not used" [ "$rc" = 1 ]

# 9. list and rm.
run list
check "list names the downloaded model" grep -q '^mlx-community/tiny-llama .* store ' "$t/out"
run list --json
want=$(find "$m" -maxdepth 1 -type f -printf '%s\n' | awk '{ s += $1 } END { print s }')
check "list --json gives the store model's bytes on disk" \
    grep -q "\"name\":\"mlx-community/tiny-llama\",\"source\":\"store\",\"complete\":true,\"bytes\":$want" "$t/out"
mkdir -p "$t/outside/dir" && echo keep >"$t/outside/file" && echo keep >"$t/outside/dir/file"
ln -s "$t/outside/file" "$m/link-to-file"
ln -s "$t/outside/dir" "$m/link-to-dir"
run rm tiny-llama
check "rm succeeds: $(cat "$t/err")" [ "$rc" = 0 ]
check "rm deletes the model" [ ! -e "$m" ]
check "rm does not follow links out of the store" \
    [ -f "$t/outside/file" -a -f "$t/outside/dir/file" ]
check "rm drops the emptied owner directory" [ ! -e "$t/store/models/mlx-community" ]
run rm tiny-llama
check "rm of a missing model fails" grep -q 'not in the store' "$t/err"

# 10. Hostile names are refused and create nothing.
top_before=$(find "$t" -path "$t/hub" -prune -o -print | sort)
for name in '../x' '/abs' 'a/b/c' 'a\b' '' 'owner/..' '../../etc' 'a b/c'; do
    run rm "$name"
    check "rm refuses '$name'" [ "$rc" != 0 ]
    run inspect -m "$name"
    check "-m refuses '$name'" [ "$rc" != 0 ]
done
check "hostile names created nothing" [ "$(find "$t" -path "$t/hub" -prune -o -print | sort)" = "$top_before" ]

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
