#!/bin/bash
# Issue 6 benchmarks (bench/vmm/vmm_bench.cpp): prewarm slots on the emulator's timing model,
# or on a real GPU with NVIDIA's driver.
#
# usage: run.sh [--driver emulator|real] [--models default|small] [--models-dir DIR]
#               [--pcie GBPS] [--json] [--json-file FILE] [--kit DIR] [-h|--help]
#
#   --driver emulator   (default) thaw's CUDA driver emulator with its timing model: PCIe at
#                       --pcie GB/s (default 2) and each 2 MiB page create/map at a latency
#                       scaled with it (20 us at 25 GB/s, WarmServe's "10 GB mapped in 0.2 s"),
#                       so page-table work relative to transfer is an H100's at any setting;
#                       traced, so the activation thread check runs. Shares are of the
#                       configured rate; the measured copy rate is printed beside it.
#   --driver real       the driver the dynamic linker finds (libcuda.so.1; $LIBCUDA to name
#                       another), no THAW_EMU_* variables and no trace: shares are of the
#                       host->device rate the benchmark measures (pinned, median of 3).
#   --models default    B 3.16 GB (f32, 15 layers of width 2048), A 0.27 GB: the figures in
#                       docs/BENCHMARKS.md. small: B 0.29 GB, A 0.08 GB (under a minute on
#                       the emulator). Generated once into the models directory (deterministic).
#   --models-dir DIR    where the models are kept (default build/bench-vmm in the repository;
#                       required when run outside it, e.g. from a kit).
#   --json              the results as JSON on stdout instead of text.
#   --json-file FILE    also write the JSON to FILE.
#   --kit DIR           take the binaries from a gpu-kit bundle: DIR/bin/thaw-vmm-bench,
#                       DIR/bin/thaw-genmodel and the emulator DIR/emu/libcuda.so.1.
#
# Environment: BUILD (build directory, default build/release), VMM_BENCH and GENMODEL (the two
# binaries; when both are given and exist nothing is built), LIBCUDA (the driver to load).
#
# The default PCIe rate, 2 GB/s, keeps the host's own work under the model: a 3 GB prewarm
# costs a 2-core VM ~0.7 s of memcpy and page-table population with the timing model off
# (4.5 GB/s), so at 4 GB/s and above the loaders measured are host-bound and the shares say
# more about the VM than about thaw.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
IN_REPO=0
[[ -f $REPO/CMakePresets.json && -f $REPO/bench/vmm/vmm_bench.cpp ]] && IN_REPO=1

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }
fail() { echo "vmm/run.sh: $*" >&2; exit 2; }

DRIVER=emulator
MODELS=default
MODELS_DIR=
PCIE=
KIT=
BENCH_ARGS=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --driver | --models | --models-dir | --pcie | --json-file | --kit)
      [[ $# -ge 2 && -n $2 ]] || fail "$1 needs a value (--help for usage)" ;;&
    --driver) DRIVER=$2; shift 2 ;;
    --models) MODELS=$2; shift 2 ;;
    --models-dir) MODELS_DIR=$2; shift 2 ;;
    --pcie) PCIE=$2; shift 2 ;;
    --json) BENCH_ARGS+=(--json); shift ;;
    --json-file) BENCH_ARGS+=(--json-file "$2"); shift 2 ;;
    --kit) KIT=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) fail "unknown argument '$1' (--help for usage)" ;;
  esac
done
[[ $DRIVER == emulator || $DRIVER == real ]] || fail "--driver '$DRIVER': emulator or real"
[[ $MODELS == default || $MODELS == small ]] || fail "--models '$MODELS': default or small"
if [[ -n $PCIE ]]; then
  [[ $DRIVER == emulator ]] || fail "--pcie sets the emulator's modelled rate; a real GPU's is measured"
  awk -v g="$PCIE" 'BEGIN { exit !(g + 0 > 0) }' || fail "--pcie '$PCIE': a positive number of GB/s"
fi
PCIE=${PCIE:-2}

if [[ -n $KIT ]]; then
  [[ -d $KIT ]] || fail "--kit $KIT: no such directory"
  VMM_BENCH=${VMM_BENCH:-$KIT/bin/thaw-vmm-bench}
  GENMODEL=${GENMODEL:-$KIT/bin/thaw-genmodel}
  [[ $DRIVER == real ]] || LIBCUDA=${LIBCUDA:-$KIT/emu/libcuda.so.1}
fi
BUILD=${BUILD:-$REPO/build/release}
need_build=0
[[ -n ${VMM_BENCH:-} && -x $VMM_BENCH ]] || need_build=1
[[ -n ${GENMODEL:-} && -x $GENMODEL ]] || need_build=1
[[ $DRIVER == real || (-n ${LIBCUDA:-} && -f $LIBCUDA) ]] || need_build=1
if ((need_build)); then
  if ((!IN_REPO)); then
    what="VMM_BENCH and GENMODEL"
    [[ $DRIVER == real ]] || what="VMM_BENCH, GENMODEL and LIBCUDA"
    fail "outside the repository $what must name existing files (or use --kit DIR)"
  fi
  for v in VMM_BENCH GENMODEL LIBCUDA; do
    [[ -z ${!v:-} || -e ${!v} ]] || fail "$v=${!v}: no such file"
  done
  (
    cd "$REPO"
    [[ -f $BUILD/CMakeCache.txt ]] || flock /tmp/thaw-build.lock cmake --preset release >/dev/null
    flock /tmp/thaw-build.lock cmake --build "$BUILD" --target thaw-vmm-bench thaw-genmodel thaw_emu >/dev/null
  )
fi
VMM_BENCH=${VMM_BENCH:-$BUILD/bench/vmm/thaw-vmm-bench}
GENMODEL=${GENMODEL:-$BUILD/tools/genmodel/thaw-genmodel}
[[ $DRIVER == real ]] || LIBCUDA=${LIBCUDA:-$BUILD/emu/libcuda.so.1}

if [[ -z $MODELS_DIR ]]; then
  ((IN_REPO)) || fail "--models-dir DIR is required outside the repository"
  MODELS_DIR=$REPO/build/bench-vmm
fi
mkdir -p "$MODELS_DIR" || fail "cannot create $MODELS_DIR"
gen() {  # gen DIR GENMODEL-ARGS...: once; a directory without config.json is regenerated
  local dir=$MODELS_DIR/$1; shift
  [[ -f $dir/config.json ]] && return
  "$GENMODEL" --size custom --heads 16 --shard-size 1GB "$@" --out "$dir" --force --quiet
}
if [[ $MODELS == default ]]; then
  gen model-b --layers 15 --embd 2048 --vocab 16000   # 3.16 GB
  gen model-a --layers 4 --embd 1024 --vocab 16000 --seed 7  # 0.27 GB
  A=$MODELS_DIR/model-a B=$MODELS_DIR/model-b
else
  gen small-b --layers 5 --embd 1024 --vocab 8000   # 0.29 GB
  gen small-a --layers 2 --embd 768 --vocab 8000 --seed 7  # 0.08 GB
  A=$MODELS_DIR/small-a B=$MODELS_DIR/small-b
fi
cat "$A"/* "$B"/* >/dev/null  # page cache: every loader reads from it

if [[ $DRIVER == real ]]; then
  # Nothing of the emulator's: a THAW_EMU_* left in the environment would mean nothing to
  # NVIDIA's driver, and THAW_LIBCUDA only where LIBCUDA names a driver.
  unset "${!THAW_EMU_@}" THAW_LIBCUDA
  [[ -z ${LIBCUDA:-} ]] || export THAW_LIBCUDA=$LIBCUDA
  echo "real driver: ${LIBCUDA:-libcuda.so.1 as the dynamic linker finds it}; models $A, $B" >&2
  exec "$VMM_BENCH" --expect-driver real "${BENCH_ARGS[@]}" "$A" "$B"
fi

LATENCY_US=$(awk -v g="$PCIE" 'BEGIN { printf "%d", 20 * 25 / g }')
STATE=$(mktemp -d /dev/shm/thaw-vmm-bench.XXXXXX)
trap 'rm -rf "$STATE"' EXIT
echo "emulator: PCIe $PCIE GB/s, page latency $LATENCY_US us, prefaulted device memory; models $A, $B" >&2
env THAW_LIBCUDA="$LIBCUDA" THAW_EMU_TIMING=1 THAW_EMU_PREFAULT=1 \
  THAW_EMU_PCIE_GBPS="$PCIE" THAW_EMU_PAGE_LATENCY_US="$LATENCY_US" THAW_EMU_DEVICE_MEMORY=16G \
  THAW_EMU_STATE_DIR="$STATE" THAW_EMU_TRACE="$STATE/trace.jsonl" \
  "$VMM_BENCH" --expect-driver emulator "${BENCH_ARGS[@]}" "$A" "$B"
