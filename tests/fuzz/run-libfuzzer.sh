#!/usr/bin/env bash
# Builds the libFuzzer targets with clang and runs them one after the other, sharing the time:
#   module_image_fuzz     the module image parsers (emu/src/cubin.cpp, fatbin.cpp)
#   safetensors_fuzz      the safetensors header and index parsers (common/safetensors core)
#   cluster_message_fuzz  the cluster control plane's decode-and-validate core
#                         (common/proto/cluster/cluster_codec_core)
#   shim_message_fuzz     the shim socket's codec (common/proto/shim_messages): what thawd
#                         decodes from any local user
#   graph_record_fuzz     the graph record codec (common/graphs/graph_record.cpp): the "graphs"
#                         artifacts thawd keeps and the preload shim reads
#
#   tests/fuzz/run-libfuzzer.sh [seconds (default 60)] [extra libFuzzer flags...]
#
# The seconds are the total, split evenly among the targets run (the earlier ones get the
# remainder's extra seconds; at least 1 s each). Extra flags go to every target.
#
# Configures tests/fuzz on its own (clang cannot build the rest of thaw) in build/fuzz, with
# ASan + UBSan + libFuzzer, seeds a working corpus per target -- build/fuzz/corpus from
# tests/fuzz/corpus/module_image and the images nvcc builds from tests/emu/testdata;
# build/fuzz/corpus-safetensors from tests/fuzz/corpus/safetensors and the shared tiny GPT-2;
# build/fuzz/corpus-cluster from tests/fuzz/corpus/cluster; build/fuzz/corpus-shim from
# tests/fuzz/corpus/shim; build/fuzz/corpus-graph_record from tests/fuzz/corpus/graph_record --
# and fuzzes. New interesting inputs stay in the working corpora; a
# crash is written to build/fuzz/artifacts/ (safetensors ones prefixed "safetensors-", cluster
# ones "cluster-", shim ones "shim-", graph record ones "graph_record-") and the script exits non-zero after all the runs.
# Reproduce one with
#   build/fuzz/module_image_fuzz build/fuzz/artifacts/crash-...
#   build/fuzz/safetensors_fuzz build/fuzz/artifacts/safetensors-crash-...
#   build/fuzz/cluster_message_fuzz build/fuzz/artifacts/cluster-crash-...
#   build/fuzz/shim_message_fuzz build/fuzz/artifacts/shim-crash-...
#   build/fuzz/graph_record_fuzz build/fuzz/artifacts/graph_record-crash-...
# or with the g++ build: build/default/tests/fuzz/<target>_replay --mutations 0 <file>.
#
# Environment: CXX (default: clang++-14 if present, else clang++), JOBS (build jobs, default 2),
# FUZZ_JOBS (parallel fuzzing processes, default 1), FUZZ_TARGETS (default
# "module_image safetensors cluster shim graph_record": which to run; one alone gets all the seconds).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
seconds="${1:-60}"
shift || true
build="$root/build/fuzz"

cxx="${CXX:-}"
if [[ -z "$cxx" ]]; then
  if command -v clang++-14 >/dev/null; then cxx=clang++-14; else cxx=clang++; fi
fi
if ! command -v "$cxx" >/dev/null; then
  echo "run-libfuzzer.sh: no clang++ found (set CXX)" >&2
  exit 2
fi

cmake -S "$root/tests/fuzz" -B "$build" -G Ninja \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTHAW_BUILD_FUZZERS=ON >/dev/null
read -r -a targets <<<"${FUZZ_TARGETS:-module_image safetensors cluster shim graph_record}"
build_targets=()
for t in "${targets[@]}"; do
  case "$t" in
    module_image) build_targets+=(module_image_fuzz thaw_module_testdata) ;;
    safetensors) build_targets+=(safetensors_fuzz) ;;
    cluster) build_targets+=(cluster_message_fuzz) ;;
    shim) build_targets+=(shim_message_fuzz) ;;
    graph_record) build_targets+=(graph_record_fuzz) ;;
    *)
      echo "run-libfuzzer.sh: unknown fuzz target '$t' (module_image, safetensors, cluster, shim, graph_record)" >&2
      exit 2
      ;;
  esac
done
cmake --build "$build" -j "${JOBS:-2}" --target "${build_targets[@]}"

mkdir -p "$build/corpus" "$build/corpus-safetensors" "$build/corpus-cluster" "$build/corpus-shim" \
  "$build/corpus-graph_record" "$build/artifacts"
cp -n "$root/tests/fuzz/corpus/module_image/"* "$build/corpus/" 2>/dev/null || true
for f in "$build/testdata/images/"*; do
  [[ "$f" == *.d ]] || cp -n "$f" "$build/corpus/" 2>/dev/null || true
done
cp -n "$root/tests/fuzz/corpus/safetensors/"* "$build/corpus-safetensors/" 2>/dev/null || true
tiny_gpt2="$root/../shared/data/models/tiny_gpt2/model.safetensors"
if [[ -f "$tiny_gpt2" ]]; then
  cp -n "$tiny_gpt2" "$build/corpus-safetensors/tiny_gpt2.safetensors" 2>/dev/null || true
fi
chmod -R u+w "$build/corpus-safetensors"  # the shared copy is read-only; libFuzzer adds files
cp -n "$root/tests/fuzz/corpus/cluster/"* "$build/corpus-cluster/" 2>/dev/null || true
cp -n "$root/tests/fuzz/corpus/shim/"* "$build/corpus-shim/" 2>/dev/null || true
cp -n "$root/tests/fuzz/corpus/graph_record/"* "$build/corpus-graph_record/" 2>/dev/null || true

parallel=()
if [[ "${FUZZ_JOBS:-1}" -gt 1 ]]; then  # libFuzzer then logs to fuzz-<n>.log in build/fuzz
  parallel=(-jobs="$FUZZ_JOBS" -workers="$FUZZ_JOBS")
fi

# The time split: even, the first (seconds mod targets) targets get one second more.
declare -A share
n=${#targets[@]}
for i in "${!targets[@]}"; do
  s=$(( seconds / n + (i < seconds % n ? 1 : 0) ))
  share[${targets[$i]}]=$(( s > 0 ? s : 1 ))
done

cd "$build"
status=0
for t in "${targets[@]}"; do
  case "$t" in
    module_image)
      echo "run-libfuzzer.sh: module_image_fuzz for ${share[$t]}s (corpus $build/corpus)"
      ./module_image_fuzz -max_total_time="${share[$t]}" -max_len=65536 -timeout=10 \
        -rss_limit_mb=4096 -artifact_prefix="$build/artifacts/" -print_final_stats=1 \
        "${parallel[@]}" "$@" "$build/corpus" || status=$?
      ;;
    safetensors)
      echo "run-libfuzzer.sh: safetensors_fuzz for ${share[$t]}s (corpus $build/corpus-safetensors)"
      ./safetensors_fuzz -max_total_time="${share[$t]}" -max_len=65536 -timeout=10 \
        -rss_limit_mb=4096 -dict="$root/tests/fuzz/safetensors.dict" \
        -artifact_prefix="$build/artifacts/safetensors-" -print_final_stats=1 \
        "${parallel[@]}" "$@" "$build/corpus-safetensors" || status=$?
      ;;
    cluster)
      echo "run-libfuzzer.sh: cluster_message_fuzz for ${share[$t]}s (corpus $build/corpus-cluster)"
      ./cluster_message_fuzz -max_total_time="${share[$t]}" -max_len=16384 -timeout=10 \
        -rss_limit_mb=4096 -artifact_prefix="$build/artifacts/cluster-" -print_final_stats=1 \
        "${parallel[@]}" "$@" "$build/corpus-cluster" || status=$?
      ;;
    shim)
      echo "run-libfuzzer.sh: shim_message_fuzz for ${share[$t]}s (corpus $build/corpus-shim)"
      ./shim_message_fuzz -max_total_time="${share[$t]}" -max_len=65552 -timeout=10 \
        -rss_limit_mb=4096 -artifact_prefix="$build/artifacts/shim-" -print_final_stats=1 \
        "${parallel[@]}" "$@" "$build/corpus-shim" || status=$?
      ;;
    graph_record)
      echo "run-libfuzzer.sh: graph_record_fuzz for ${share[$t]}s (corpus $build/corpus-graph_record)"
      ./graph_record_fuzz -max_total_time="${share[$t]}" -max_len=65536 -timeout=10 \
        -rss_limit_mb=4096 -artifact_prefix="$build/artifacts/graph_record-" -print_final_stats=1 \
        "${parallel[@]}" "$@" "$build/corpus-graph_record" || status=$?
      ;;
  esac
done
exit "$status"
