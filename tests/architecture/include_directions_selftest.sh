#!/bin/bash
# The dependency-direction check can fail: include_directions.sh runs on a small tree built
# here, first clean (it must pass, so allowed includes — relative ones, the emulator's
# public headers, system and fmt headers, tools/ using a library — are not flagged), then
# with one violation of each rule added (it must fail and list exactly those, by file:line).
# usage: include_directions_selftest.sh [CHECKER]
set -euo pipefail
checker=${1:-$(dirname "${BASH_SOURCE[0]}")/include_directions.sh}
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT

# put FILE LINE...: writes FILE under the tree, one argument a line.
put() {
  local file=$tree/$1
  shift
  mkdir -p "$(dirname "$file")"
  printf '%s\n' "$@" >"$file"
}
fail() {
  echo "include_directions_selftest: $*"
  exit 1
}

put common/CMakeLists.txt 'add_library(thaw_common_cuda STATIC cuda/driver.cpp)' \
  'target_link_libraries(thaw_common_cuda PUBLIC fmt::fmt)'
put common/cuda/driver.hpp '#pragma once' '#include <cuda.h>' '#include "fmt/format.h"'
put common/cuda/driver.cpp '#include "common/cuda/driver.hpp"' '#include "driver.hpp"'
put vmm/CMakeLists.txt 'add_library(thaw_vmm STATIC gpu.cpp)' \
  'target_link_libraries(thaw_vmm PUBLIC thaw_common_cuda Threads::Threads)'
put vmm/gpu.hpp '#pragma once' '#include "common/cuda/driver.hpp"' '#include "vmm/pool.hpp"'
put vmm/pool.hpp '#pragma once' '// #include "daemon/log/log.hpp" (a comment, not an include)'
put vmm/gpu.cpp '#include "vmm/gpu.hpp"'
put daemon/log/CMakeLists.txt 'add_library(thaw_daemon_log STATIC log.cpp)'
put daemon/log/log.hpp '#pragma once'
put daemon/service/svc.cpp '#include "daemon/log/log.hpp"' '#include "vmm/gpu.hpp"' \
  '#include "common/cuda/driver.hpp"'
put preload/thawd_client/client.hpp '#pragma once' '#include "common/cuda/driver.hpp"'
put preload/hooks/hooks.cpp '#include "../thawd_client/client.hpp"' '#include <dlfcn.h>'
put coordinator/CMakeLists.txt \
  'add_library(thaw_coordinator_policy STATIC policy/placement.cpp)' \
  'add_library(thaw_coordinator_server STATIC server/server.cpp)' \
  'target_link_libraries(thaw_coordinator_server PUBLIC thaw_coordinator_policy)'
put coordinator/policy/placement.hpp '#pragma once' '#include "coordinator/policy/snapshot.hpp"'
put coordinator/policy/snapshot.hpp '#pragma once'
put coordinator/server/server.hpp '#pragma once' '#include "coordinator/policy/placement.hpp"' \
  '#include "common/cuda/driver.hpp"'
# shellcheck disable=SC2016 # CMake's variable, literally
put emu/CMakeLists.txt 'add_library(thaw_emu_inspect_headers INTERFACE)' \
  'target_include_directories(thaw_emu_inspect_headers INTERFACE ${CMAKE_CURRENT_SOURCE_DIR}/include)' \
  'add_library(thaw_emu SHARED src/device.cpp)'
put emu/include/thaw/emu_twin.h '#pragma once'
put emu/src/device.hpp '#pragma once' '#include "thaw/emu_twin.h"'
put emu/src/device.cpp '#include "device.hpp"' '#include "thaw/emu_twin.h"'
put tools/refengine/CMakeLists.txt 'add_library(refengine_twins SHARED twins.cpp)' \
  'target_link_libraries(refengine_twins PRIVATE thaw_emu_inspect_headers)'
put tools/refengine/twins.cpp '#include "thaw/emu_twin.h"'
put tools/thawctl/main.cpp '#include "daemon/log/log.hpp"' '#include "common/cuda/driver.hpp"'

if ! out=$("$checker" --root "$tree" 2>&1); then
  fail "the clean tree was reported:"$'\n'"$out"
fi
echo "clean tree passes: $out"

# One violation of each rule; the expected file:line of each.
expected=()
violate() { # violate FILE TEXT: appends TEXT to FILE, expecting it reported there
  local file=$tree/$1
  mkdir -p "$(dirname "$file")"
  touch "$file"
  printf '%s\n' "$2" >>"$file"
  expected+=("$1:$(wc -l <"$file")")
}
violate common/cuda/driver.hpp '#include "vmm/gpu.hpp"'
violate vmm/pool.hpp '#include "daemon/service/svc.hpp"'
violate vmm/gpu.hpp '#include "tools/thawctl/commands.hpp"'
violate vmm/gpu.cpp '#include "preload/thawd_client/client.hpp"'
violate daemon/service/svc.cpp '#include "coordinator/server/server.hpp"'
violate daemon/service/svc.cpp '#include "preload/thawd_client/client.hpp"'
violate preload/hooks/hooks.cpp '#include "../../vmm/gpu.hpp"'
violate preload/hooks/hooks.cpp '#include "daemon/log/log.hpp"'
violate coordinator/policy/placement.hpp '#include "coordinator/server/server.hpp"'
violate coordinator/policy/snapshot.hpp '#include "daemon/log/log.hpp"'
violate coordinator/cluster/state.hpp '#include "coordinator/server/server.hpp"'
violate coordinator/server/server.hpp '#include "vmm/gpu.hpp"'
violate emu/src/device.hpp '#include "common/cuda/driver.hpp"'
violate emu/src/device.cpp '#  include <daemon/log/log.hpp>'
violate tools/refengine/twins.cpp '#include "common/cuda/driver.hpp"'
include_only=("${expected[@]}")
violate vmm/CMakeLists.txt 'target_link_libraries(thaw_vmm PRIVATE thaw_daemon_log)'
violate coordinator/CMakeLists.txt 'target_link_libraries(thaw_coordinator_policy'
printf '  PUBLIC thaw_coordinator_server)\n' >>"$tree/coordinator/CMakeLists.txt"

# check [ARGS...]: the checker must exit 1 and report exactly "${want[@]}".
check() {
  local status=0
  out=$("$checker" --root "$tree" "$@" 2>&1) || status=$?
  ((status == 1)) || fail "exit status $status (want 1) with violations ($*):"$'\n'"$out"
  local got want_sorted
  got=$(grep -oE '^[^ :]+:[0-9]+:' <<<"$out" | sed 's/:$//' | LC_ALL=C sort)
  want_sorted=$(printf '%s\n' "${want[@]}" | LC_ALL=C sort)
  if [[ $got != "$want_sorted" ]]; then
    fail "reported (left) differs from expected (right) ($*):"$'\n'"$(diff <(echo "$got") <(echo "$want_sorted") || true)"$'\n'"$out"
  fi
}
want=("${expected[@]}")
check
grep -q 'common/cuda/driver.hpp:[0-9]*: includes "vmm/gpu.hpp": common/ may use only common/' <<<"$out" ||
  fail "the report does not name the broken rule:"$'\n'"$out"
grep -q 'preload/hooks/hooks.cpp:[0-9]*: includes "../../vmm/gpu.hpp" (vmm/gpu.hpp): preload/' <<<"$out" ||
  fail "a relative include was not resolved:"$'\n'"$out"
echo "violating tree fails, listing all ${#want[@]}:"
echo "$out"
want=("${include_only[@]}")
check --no-cmake
echo "--no-cmake: the ${#want[@]} include violations only"
