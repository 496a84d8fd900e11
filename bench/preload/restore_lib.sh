# Shared by bench/preload/kv_restore.sh and graph_restore.sh: both run the reference engine
# twice under the shim with --thaw-restore on the node of `make demo` and compare the runs.
#
# On the outside (sourced by the bench script):
#   restore_bench_prepare NAME DO_BUILD  builds what the node needs (unless DO_BUILD is 0) and
#                                        sets WORK (build/bench-preload/NAME) and INNER (the
#                                        script run on the node, removed at exit)
#   restore_bench_node ENV...           runs INNER on the node (tools/demo/run-demo.sh
#                                        --with-node) with ENV and RESTORE_LIB set
# On the node (INNER sources "$RESTORE_LIB"; it sets `args`, the engine's arguments):
#   restore_run NAME      one engine run; NAME.{timeline,out,err,shim.log} in $NODE_WORK
#                         (RUN_ENV="VAR=value ...": more environment for that run)
#   restore_show_errs NAME...  each run's stderr, prefixed with its name
#   restore_tokens NAME   the generated tokens of run NAME
#   restore_same_tokens A B    fails the bench unless runs A and B generated the same tokens

restore_bench_prepare() {
  local name=$1 do_build=$2
  BUILD=${BUILD:-$REPO_ROOT/build/default}
  if ((do_build)); then
    flock /tmp/thaw-build.lock cmake --build --preset default --target thawd thawctl thaw-fetch \
      thaw-genmodel thaw-preload refengine thaw_emu refengine_kernels_twins >/dev/null
  fi
  WORK=$REPO_ROOT/build/bench-preload/$name
  mkdir -p "$WORK"
  INNER=$(mktemp "$WORK/inner.XXXXXX.sh")
  trap 'rm -f "$INNER"' EXIT
}

restore_bench_node() {
  env REFENGINE="$BUILD/tools/refengine/refengine" RESTORE_LIB="${BASH_SOURCE[0]}" "$@" \
    "$REPO_ROOT/tools/demo/run-demo.sh" --build "$BUILD" --work "$WORK" --size "$SIZE" \
    --with-node "$INNER"
}

restore_run() {
  # shellcheck disable=SC2086  # RUN_ENV is a list of VAR=value words
  env LD_PRELOAD="$PRELOAD" THAW_PRELOAD_LOG="$NODE_WORK/$1.shim.log" ${RUN_ENV:-} \
    "$REFENGINE" "${args[@]}" \
    --timeline "$NODE_WORK/$1.timeline" >"$NODE_WORK/$1.out" 2>"$NODE_WORK/$1.err" ||
    { echo "engine run $1 failed: $(tail -3 "$NODE_WORK/$1.err")" >&2; exit 1; }
}

restore_show_errs() {
  local r
  for r in "$@"; do
    [[ -s $NODE_WORK/$r.err ]] && sed "s/^/  [$r] /" "$NODE_WORK/$r.err" >&2
  done
  return 0
}

restore_tokens() { grep -o '"tokens":\[[^]]*\]' "$NODE_WORK/$1.out"; }

restore_same_tokens() {
  [[ -n $(restore_tokens "$1") && $(restore_tokens "$1") == "$(restore_tokens "$2")" ]] ||
    { echo "the two runs' tokens differ: $(restore_tokens "$1") / $(restore_tokens "$2")" >&2; exit 1; }
}
