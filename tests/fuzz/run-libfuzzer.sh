#!/usr/bin/env bash
# Builds the libFuzzer target for the module image parsers with clang and runs it.
#
#   tests/fuzz/run-libfuzzer.sh [seconds (default 60)] [extra libFuzzer flags...]
#
# Configures tests/fuzz on its own (clang cannot build the rest of thaw) in build/fuzz, with
# ASan + UBSan + libFuzzer, seeds a working corpus (build/fuzz/corpus) from
# tests/fuzz/corpus/module_image and the images nvcc builds from tests/emu/testdata, and fuzzes
# for the given time. New interesting inputs stay in build/fuzz/corpus; a crash is written to
# build/fuzz/artifacts/ and the script exits non-zero. Reproduce one with
#   build/fuzz/module_image_fuzz build/fuzz/artifacts/crash-...
# or with the g++ build: build/default/tests/fuzz/module_image_fuzz_replay --mutations 0 <file>.
#
# Environment: CXX (default: clang++-14 if present, else clang++), JOBS (build jobs, default 2),
# FUZZ_JOBS (parallel fuzzing processes, default 1).
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
cmake --build "$build" -j "${JOBS:-2}" --target module_image_fuzz thaw_module_testdata

mkdir -p "$build/corpus" "$build/artifacts"
cp -n "$root/tests/fuzz/corpus/module_image/"* "$build/corpus/" 2>/dev/null || true
for f in "$build/testdata/images/"*; do
  [[ "$f" == *.d ]] || cp -n "$f" "$build/corpus/" 2>/dev/null || true
done

parallel=()
if [[ "${FUZZ_JOBS:-1}" -gt 1 ]]; then  # libFuzzer then logs to fuzz-<n>.log in build/fuzz
  parallel=(-jobs="$FUZZ_JOBS" -workers="$FUZZ_JOBS")
fi
echo "run-libfuzzer.sh: fuzzing for ${seconds}s (corpus $build/corpus)"
cd "$build"
exec ./module_image_fuzz -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=4096 \
  -artifact_prefix="$build/artifacts/" -print_final_stats=1 "${parallel[@]}" "$@" "$build/corpus"
