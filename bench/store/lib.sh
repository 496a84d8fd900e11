# shellcheck shell=bash
# Shared pieces of the model-store fetch benchmarks (issue 5). Sourced, not run.
# shellcheck disable=SC2034  # variables set here are used by the sourcing scripts
#
# Everything a benchmark creates (temp dirs, tmpfs caches, nginx, network namespaces,
# veth pairs) is registered with `defer` the moment it exists, and one trap undoes it in
# reverse order on exit, error, Ctrl-C or SIGTERM — so a failed or interrupted run leaves
# no namespace, link or server behind.
set -Eeuo pipefail
shopt -s inherit_errexit

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$BENCH_DIR/../.." && pwd)
BENCH_STATE="$REPO_ROOT/build/bench-store"  # generated model + registry root, kept across runs
MODEL_NAME=bench-2g
STATS="/usr/bin/python3 $BENCH_DIR/stats.py"

# The synthetic model: 32 layers, n_embd 1152, vocab 9000, f32, 2.09 GB in 5 shards. The
# vocabulary is chosen so the token embedding is as large relative to one layer as in
# Llama-2-7B (V / (L*d) ~ 0.24); see bench/store/README.md.
GENMODEL_ARGS=(--size custom --layers 32 --embd 1152 --heads 18 --vocab 9000 --shard-size 500MB)
# Chunk digests of 1 MiB (chained sha256): a stage of this 2 GB model then fetches at most
# ~2 MiB more than its layers per shard boundary instead of ~8 MiB with 4 MiB chunks.
PUBLISH_CHUNK=1MiB
PUBLISH_CHUNK_BYTES=1048576

# log, die, defer (one trap undoes everything in reverse order), WORK, now, elapsed: the
# demo's portable core (tools/demo/lib.sh). This file's start_nginx, below, replaces that one's.
THAW_WORK_PREFIX=thaw-bench TMPDIR=/tmp source "$REPO_ROOT/tools/demo/lib.sh"

# CACHE_ROOT: a fresh tmpfs directory for fetched bytes (page-cache backed, like thawd's
# cache). Not a command substitution: `defer` must run in this shell.
make_cache_root() {
  CACHE_ROOT=$(mktemp -d /dev/shm/thaw-bench-cache.XXXXXX)
  defer "rm -rf '$CACHE_ROOT'"
}

# --------------------------------------------------------------------------- binaries
# thaw-fetch: $THAW_FETCH, else the release build, else the default build.
find_thaw_fetch() {
  if [[ -n ${THAW_FETCH:-} ]]; then
    [[ -x $THAW_FETCH ]] || die "THAW_FETCH=$THAW_FETCH is not executable"
    printf '%s\n' "$THAW_FETCH"
    return
  fi
  local p
  for p in release default; do
    if [[ -x $REPO_ROOT/build/$p/tools/thaw-fetch/thaw-fetch ]]; then
      printf '%s\n' "$REPO_ROOT/build/$p/tools/thaw-fetch/thaw-fetch"
      return
    fi
  done
  die "thaw-fetch not built: cmake --preset release && cmake --build --preset release --target thaw-fetch -j2 (or set THAW_FETCH)"
}

find_genmodel() {
  local p
  for p in release default; do
    if [[ -x $REPO_ROOT/build/$p/tools/genmodel/thaw-genmodel ]]; then
      printf '%s\n' "$REPO_ROOT/build/$p/tools/genmodel/thaw-genmodel"
      return
    fi
  done
  die "thaw-genmodel not built: cmake --build --preset default --target thaw-genmodel -j2"
}

# ------------------------------------------------------------------------------ model
# Generates the model once into build/bench-store/registry/bench-2g and publishes it
# (thaw-manifest.json) with thaw-fetch; later runs reuse it. Sets REGISTRY_ROOT,
# MODEL_DIR, MODEL_FILES (names), MODEL_BYTES (sum of their sizes, the goodput payload).
ensure_model() {
  local fetch=$1
  REGISTRY_ROOT="$BENCH_STATE/registry"
  MODEL_DIR="$REGISTRY_ROOT/$MODEL_NAME"
  if [[ ! -f $MODEL_DIR/config.json ]]; then
    log "generating the synthetic model into $MODEL_DIR"
    mkdir -p "$MODEL_DIR"
    "$(find_genmodel)" "${GENMODEL_ARGS[@]}" --out "$MODEL_DIR" --force --quiet >/dev/null
  fi
  # (Re)publish when there is no manifest, or one of another chunk size or without chained
  # digests (written by an older thaw-fetch).
  if ! /usr/bin/python3 - "$MODEL_DIR/thaw-manifest.json" "$PUBLISH_CHUNK_BYTES" <<'PY' 2>/dev/null; then
import json, sys
files = json.load(open(sys.argv[1]))["files"]
ok = all(f.get("chunk_size") == int(sys.argv[2]) and "chunk_chain_sha256" in f for f in files)
sys.exit(0 if ok else 1)
PY
    log "publishing (thaw-fetch publish --chunk-size $PUBLISH_CHUNK) — computes digests once"
    "$fetch" publish --chunk-size "$PUBLISH_CHUNK" "$MODEL_DIR" >&2
    [[ -f $MODEL_DIR/thaw-manifest.json ]] || die "thaw-fetch publish wrote no $MODEL_DIR/thaw-manifest.json"
  fi
  MODEL_FILES=()
  local f
  # The model is its files; thaw-manifest.json is the registry's metadata about them, which
  # only thaw-fetch reads (its few kB count against thaw's time, not in the payload).
  while IFS= read -r f; do MODEL_FILES+=("$f"); done < <(cd "$MODEL_DIR" &&
    find . -maxdepth 1 -type f ! -name thaw-manifest.json -printf '%P\n' | LC_ALL=C sort)
  MODEL_BYTES=$(cd "$MODEL_DIR" && stat -c %s "${MODEL_FILES[@]}" | awk '{s += $1} END {print s}')
}

# Reads every model file once so nginx serves all contenders from the page cache.
warm_page_cache() {
  local f
  for f in "${MODEL_FILES[@]}"; do cat "$MODEL_DIR/$f" >/dev/null; done
}

# Byte-compares every fetched file with the registry's copy (run once per contender, so a
# fast but wrong download cannot win). $1: directory holding the fetched files (searched
# recursively by name, because the thaw cache has its own layout).
verify_fetched() {
  local dir=$1 who=$2 f got
  for f in "${MODEL_FILES[@]}"; do
    got=$(find "$dir" -type f -name "$f" -print -quit)
    [[ -n $got ]] || die "$who: $f missing under $dir"
    cmp -s "$got" "$MODEL_DIR/$f" || die "$who: $got differs from the registry's $f"
  done
}

# ------------------------------------------------------------------------------ nginx
# start_nginx NAME LISTEN [NETNS]: a non-daemon nginx serving REGISTRY_ROOT on LISTEN
# (addr:port) with sendfile and keep-alive, optionally inside a network namespace.
start_nginx() {
  local name=$1 listen=$2 netns=${3:-}
  local dir="$WORK/nginx-$name"
  mkdir -p "$dir"
  write_nginx_conf "$dir" "$REGISTRY_ROOT" "$listen" reuseport
  local -a ns=()
  [[ -n $netns ]] && ns=(ip netns exec "$netns")
  "${ns[@]}" /usr/sbin/nginx -c "$dir/nginx.conf" -g 'daemon off;' 2>>"$dir/stderr" &
  local pid=$!
  defer "kill -TERM $pid; wait $pid"
  local i
  for ((i = 0; i < 100; i++)); do
    if "${ns[@]}" curl -sf -o /dev/null "http://$listen/$MODEL_NAME/config.json"; then return; fi
    kill -0 "$pid" 2>/dev/null || die "nginx $name exited: $(cat "$dir/stderr" "$dir/error.log" 2>/dev/null)"
    sleep 0.1
  done
  die "nginx $name did not answer on $listen"
}

# Picks a free TCP port on 127.0.0.1.
free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# ------------------------------------------------------------------------- namespaces
NS_PREFIX="thawb$$"
# make_netns, link_ns, shape_egress (SHAPE_BURST): shared with the cluster in a box.
# shellcheck source=tools/demo-cluster/netns.sh
source "$REPO_ROOT/tools/demo-cluster/netns.sh"

# tc_rate_bps 1gbit -> 1000000000 (tc's units: kbit/mbit/gbit are powers of 1000).
tc_rate_bps() {
  /usr/bin/python3 -c '
import re, sys
m = re.fullmatch(r"([0-9.]+)(bit|kbit|mbit|gbit)", sys.argv[1])
if not m: sys.exit("rate must look like 1gbit or 250mbit")
print(int(float(m[1]) * {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[m[2]]))' "$1"
}

# ---------------------------------------------------------------------------- timing

# timed FILE CMD...: runs CMD under /usr/bin/time, leaving "user sys" CPU seconds (of CMD
# and the children it waited for) as the last line of FILE; cpu_of FILE prints their sum.
timed() {
  local file=$1
  shift
  /usr/bin/time -f '%U %S' -o "$file" "$@"
}
cpu_of() { tail -1 "$1" | awk '{printf "%.2f", $1 + $2}'; }

# Load average and who else is busy, for the record.
note_load() {
  log "load average: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
}

# ---------------------------------------------------------------------- the contenders
# Each writes into a fresh directory and leaves the elapsed wall seconds in $T and its
# CPU seconds (user + system) in $CPU.
# thaw: `thaw-fetch fetch --json`; its JSON summary is kept in $THAW_JSON.
THAW_EXTRA_ARGS=()
run_thaw() {
  local netns=$1 registry=$2 cache=$3
  shift 3
  local -a ns=()
  [[ -n $netns ]] && ns=(ip netns exec "$netns")
  local t0 t1
  t0=$(now)
  THAW_JSON=$(timed "$WORK/cpu" "${ns[@]}" "$THAW_FETCH_BIN" fetch --registry "$registry" --model "$MODEL_NAME" \
    --cache "$cache" --json --quiet "${THAW_EXTRA_ARGS[@]}" "$@" 2>"$WORK/thaw.stderr") ||
    die "thaw-fetch failed: $(tail -5 "$WORK/thaw.stderr")"
  t1=$(now)
  T=$(elapsed "$t0" "$t1")
  CPU=$(cpu_of "$WORK/cpu")
}

# aria2c -x8 -s8, all files from one input list (aria2's default -j5 files at a time).
run_aria2c() {
  local netns=$1 base=$2 dir=$3
  local -a ns=()
  [[ -n $netns ]] && ns=(ip netns exec "$netns")
  local list="$WORK/aria2.list" f
  : >"$list"
  for f in "${MODEL_FILES[@]}"; do printf '%s/%s\n' "$base" "$f" >>"$list"; done
  local t0 t1
  t0=$(now)
  timed "$WORK/cpu" "${ns[@]}" aria2c -x8 -s8 -q -d "$dir" -i "$list" --allow-overwrite=true \
    --auto-file-renaming=false 2>"$WORK/aria2.stderr" ||
    die "aria2c failed: $(tail -5 "$WORK/aria2.stderr")"
  t1=$(now)
  T=$(elapsed "$t0" "$t1")
  CPU=$(cpu_of "$WORK/cpu")
}

# curl: one process, one kept-alive connection, the files one after another — a plain
# download.
run_curl() {
  local netns=$1 base=$2 dir=$3
  local -a ns=() args=() f
  [[ -n $netns ]] && ns=(ip netns exec "$netns")
  for f in "${MODEL_FILES[@]}"; do args+=(-o "$dir/$f" "$base/$f"); done
  local t0 t1
  t0=$(now)
  timed "$WORK/cpu" "${ns[@]}" curl -sS --fail "${args[@]}" 2>"$WORK/curl.stderr" ||
    die "curl failed: $(tail -5 "$WORK/curl.stderr")"
  t1=$(now)
  T=$(elapsed "$t0" "$t1")
  CPU=$(cpu_of "$WORK/cpu")
}

# curl | sha256sum: the peer that verifies, as thaw-fetch does. The files one after another,
# each streamed by its own curl through `tee` into its file and into the hash (so the bytes
# are both stored and hashed, in one pass, as thaw-fetch's are); /usr/bin/time counts the
# whole pipeline's CPU. Every file's digest is then checked against the sha256 the registry's
# thaw-manifest.json publishes (the digests thaw-fetch checks), every round.
# run_curl_hash NETNS BASE DIR WHO HASH...: HASH reads stdin and prints the hex digest first
# (`sha256sum`, or `openssl dgst -sha256 -r`: coreutils' sha256sum may lack the CPU's SHA
# instructions, OpenSSL uses them).
run_curl_hash() {
  local netns=$1 base=$2 dir=$3 who=$4
  shift 4
  local -a ns=()
  [[ -n $netns ]] && ns=(ip netns exec "$netns")
  local sums="$WORK/$who.sums"
  local t0 t1
  t0=$(now)
  # shellcheck disable=SC2016  # the script is bash -c's, expanded there
  timed "$WORK/cpu" "${ns[@]}" bash -c 'set -o pipefail
    base=$1 dir=$2 n=$3
    shift 3
    hash=("${@:1:n}")
    shift "$n"
    for f; do
      sum=$(curl -sS --fail "$base/$f" | tee "$dir/$f" | "${hash[@]}") || exit 1
      printf "%s  %s\n" "${sum%% *}" "$f"
    done' "$who" "$base" "$dir" $# "$@" "${MODEL_FILES[@]}" >"$sums" 2>"$WORK/$who.stderr" ||
    die "curl | $*: failed: $(tail -5 "$WORK/$who.stderr")"
  t1=$(now)
  T=$(elapsed "$t0" "$t1")
  CPU=$(cpu_of "$WORK/cpu")
  check_manifest_digests "$sums" "curl | $*"
}

# check_manifest_digests SUMS WHO: every model file has a line "<sha256>  <name>" in SUMS
# equal to the sha256 of MODEL_DIR/thaw-manifest.json.
check_manifest_digests() {
  /usr/bin/python3 - "$MODEL_DIR/thaw-manifest.json" "$1" "$2" "${MODEL_FILES[@]}" <<'PY' ||
import json, sys
manifest, sums, who, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
want = {f["path"]: f["sha256"] for f in json.load(open(manifest))["files"]}
got = dict(reversed(l.rstrip("\n").split("  ", 1)) for l in open(sums) if l.strip())
for n in names:
    if n not in want:
        sys.exit(f"{who}: {n} has no sha256 in {manifest}; republish the model (delete it)")
    if got.get(n) != want[n]:
        sys.exit(f"{who}: {n} hashed to {got.get(n)}, the manifest says {want[n]}")
PY
    die "$2: a digest does not match the manifest (see above)"
}

# run_contender WHO ROUND NETNS REGISTRY: one fetch of the whole model by WHO (thaw,
# aria2c, curl, curl-sha256 or curl-openssl) into a fresh directory under CACHE_ROOT; the first round is
# byte-compared with the registry's files; appends the run to RESULTS.
run_contender() {
  local who=$1 round=$2 netns=$3 registry=$4 dir="$CACHE_ROOT/$1"
  mkdir -p "$dir"
  local extra=-
  case $who in
    thaw)
      run_thaw "$netns" "$registry" "$dir"
      extra=$(compact_json <<<"$THAW_JSON")
      ;;
    aria2c) run_aria2c "$netns" "$registry/$MODEL_NAME" "$dir" ;;
    curl) run_curl "$netns" "$registry/$MODEL_NAME" "$dir" ;;
    curl-sha256) run_curl_hash "$netns" "$registry/$MODEL_NAME" "$dir" "$who" sha256sum ;;
    curl-openssl)
      run_curl_hash "$netns" "$registry/$MODEL_NAME" "$dir" "$who" openssl dgst -sha256 -r
      ;;
    *) die "unknown contender $who" ;;
  esac
  log "round $round $who: $T s, $CPU CPU s"
  if [[ $round == 1 ]]; then verify_fetched "$dir" "$who"; fi
  rm -rf "$dir"
  printf '%s\t%s\t%s\t%s\t%s\n' "$who" "$T" "$MODEL_BYTES" "$CPU" "$extra" >>"$RESULTS"
}

compact_json() {
  /usr/bin/python3 -c 'import json,sys; print(json.dumps(json.loads(sys.stdin.read())))'
}
