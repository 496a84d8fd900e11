#!/bin/bash
# libthaw-preload.so is loaded into engine processes, which must not inherit thaw's own shared
# libraries (fmt, protobuf, zmq, curl...): an engine may bring other versions of them. Its
# DT_NEEDED list may name only the C/C++ runtime (and, in a sanitizer build, the sanitizers').
# usage: shim_linkage_test.sh LIBTHAW_PRELOAD_SO
set -euo pipefail
so=$1
[[ -f $so ]] || { echo "FAIL: $so does not exist"; exit 1; }
allowed='^(libc\.so\.6|libstdc\+\+\.so\.6|libgcc_s\.so\.1|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|ld-linux-x86-64\.so\.2|libasan\.so\.[0-9]+|libubsan\.so\.[0-9]+)$'
needed=$(readelf -d "$so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
[[ -n $needed ]] || { echo "FAIL: readelf found no NEEDED entries in $so"; exit 1; }
bad=$(grep -Ev "$allowed" <<<"$needed" || true)
echo "NEEDED: $(tr '\n' ' ' <<<"$needed")"
if [[ -n $bad ]]; then
  echo "FAIL: libthaw-preload.so needs $(tr '\n' ' ' <<<"$bad")— link the *_shim variants of common/ (fmt header-only), see preload/CMakeLists.txt"
  exit 1
fi
echo "ok: only the C/C++ runtime"
