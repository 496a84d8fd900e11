# shellcheck shell=bash
# What tools/demo/run-demo.sh needs besides its own steps (log, die, defer and its cleanup
# trap, timing, a loopback nginx), and the core bench/store/lib.sh builds on. Sourced, not
# run; it travels with
# the script (the real-GPU kit copies both into KIT/share), so it uses nothing but bash,
# coreutils, grep, sed, awk and findutils: no python3, no curl (a minimal Debian root has none).
# shellcheck disable=SC2034  # WORK is used by the sourcing script
set -Eeuo pipefail
shopt -s inherit_errexit

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# ---------------------------------------------------------------------------- cleanup
# Everything the demo starts or creates is registered with `defer` the moment it exists; one
# trap undoes it in reverse order on exit, error, Ctrl-C or SIGTERM.
_DEFERRED=()
defer() { _DEFERRED+=("$*"); }
_run_deferred() {
  local rc=$?
  trap - EXIT INT TERM ERR
  local i
  for ((i = ${#_DEFERRED[@]} - 1; i >= 0; i--)); do
    eval "${_DEFERRED[i]}" >/dev/null 2>&1 || true
  done
  _DEFERRED=()
  return $rc
}
trap '_run_deferred' EXIT
trap 'log "interrupted"; exit 130' INT
trap 'log "terminated"; exit 143' TERM

# bench/store/lib.sh sources this file too, with its own prefix for the work directory.
WORK=$(mktemp -d "${TMPDIR:-/tmp}/${THAW_WORK_PREFIX:-thaw-demo}.XXXXXX")
defer "rm -rf '$WORK'"

# ---------------------------------------------------------------------------- timing
now() { printf '%s\n' "$EPOCHREALTIME"; }
# elapsed T0 T1: seconds between two `now`s (awk's doubles keep microseconds at epoch scale).
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.6f\n", b - a }'; }

# ------------------------------------------------------------------------------ nginx
# http_ok HOST PORT PATH: a GET answered 200, over bash's /dev/tcp (no curl).
http_ok() {
  (
    exec 3<>"/dev/tcp/$1/$2" || exit 1
    printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' "$3" "$1" >&3
    IFS= read -r -t 2 line <&3 || exit 1
    [[ $line == HTTP/1.[01]\ 200* ]]
  ) 2>/dev/null
}

# port_listened PORT: something on this host listens on TCP PORT (/proc/net/tcp, state 0A).
port_listened() {
  local hex
  hex=$(printf '%04X' "$1")
  awk -v p=":$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { f = 1 } END { exit !f }' \
    /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# write_nginx_conf DIR ROOT LISTEN [LISTEN_OPTIONS]: DIR/nginx.conf for a non-daemon nginx
# serving ROOT (JSON directory listings) on LISTEN with sendfile and long keep-alive; its pid,
# logs and temporary files stay in DIR. Shared with bench/store/lib.sh.
write_nginx_conf() {
  local dir=$1 root=$2 listen=$3 options=${4:-}
  cat >"$dir/nginx.conf" <<CONF
worker_processes 2;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  sendfile on;
  tcp_nopush on;
  tcp_nodelay on;
  keepalive_requests 100000;
  keepalive_timeout 120s;
  client_body_temp_path $dir/body;
  proxy_temp_path $dir/proxy;
  fastcgi_temp_path $dir/fastcgi;
  uwsgi_temp_path $dir/uwsgi;
  scgi_temp_path $dir/scgi;
  default_type application/octet-stream;
  server {
    listen $listen${options:+ $options};
    root $root;
    autoindex on;
    autoindex_format json;
  }
}
CONF
}

# start_nginx NGINX ROOT PROBE: a non-daemon nginx serving ROOT on a free loopback port, with
# sendfile and keep-alive; PROBE is a path under ROOT it must serve before we go on. Sets
# NGINX_PID and NGINX_PORT. A port taken between the check and nginx's bind is retried.
start_nginx() {
  local nginx=$1 root=$2 probe=$3 dir="$WORK/nginx" port try i
  mkdir -p "$dir"
  for ((try = 0; try < 10; try++)); do
    # 40000..59999: clear of the ports coordinators hand their workers (20000..32767 in the
    # tests and the cluster box), which a demo's registry running beside them took once.
    port=$((40000 + RANDOM % 20000))
    port_listened "$port" && continue
    write_nginx_conf "$dir" "$root" "127.0.0.1:$port"
    "$nginx" -c "$dir/nginx.conf" -g 'daemon off;' 2>>"$dir/stderr" &
    NGINX_PID=$!
    defer "kill -TERM $NGINX_PID; wait $NGINX_PID"
    for ((i = 0; i < 100; i++)); do
      if http_ok 127.0.0.1 "$port" "$probe"; then
        NGINX_PORT=$port
        return
      fi
      kill -0 "$NGINX_PID" 2>/dev/null || break
      sleep 0.1
    done
    kill -0 "$NGINX_PID" 2>/dev/null &&
      die "nginx answered no GET $probe on 127.0.0.1:$port in 10 s: $(cat "$dir/error.log" 2>/dev/null)"
    grep -q 'Address already in use' "$dir/stderr" "$dir/error.log" 2>/dev/null ||
      die "nginx exited: $(cat "$dir/stderr" "$dir/error.log" 2>/dev/null)"
  done
  die "nginx found no free loopback port in 10 tries: $(tail -3 "$dir/stderr")"
}
