# shellcheck shell=bash
# Shared by the kit's run script and its steps (sourced). A step is run as
#   bash steps/X.sh STEP_DIR
# with KIT, OUT, QUICK, KIT_DRIVER (real|emulator) in the environment, and leaves
# STEP_DIR/result: lines `status=passed|failed|skipped`, `reason=...` (one line, what a reader
# needs first), and any `figure.NAME=VALUE` lines (numbers shown in the report).

kit_log() { echo "[$(date +%H:%M:%S)] $*" >&2; }

# kit_result DIR STATUS REASON [figure.NAME=VALUE...]: a step's outcome (the last status wins).
kit_result() {
  local dir=$1 status=$2 reason=$3
  shift 3
  { echo "status=$status"; echo "reason=${reason//$'\n'/ }"; printf '%s\n' "$@"; } >>"$dir/result"
}

# Which driver the steps use: NVIDIA's when a GPU and libcuda.so.1 are here, else the emulator.
kit_select_driver() {
  local force_emulator=$1
  if ((force_emulator)); then
    KIT_DRIVER=emulator KIT_DRIVER_REASON="--emulator given"
  elif ! compgen -G '/dev/nvidia[0-9]*' >/dev/null; then
    KIT_DRIVER=emulator KIT_DRIVER_REASON="no /dev/nvidia* device on this machine"
  elif ! kit_system_libcuda >/dev/null; then
    KIT_DRIVER=emulator KIT_DRIVER_REASON="a GPU device exists but no libcuda.so.1 was found (is the NVIDIA driver installed?)"
  else
    KIT_DRIVER=real KIT_DRIVER_REASON="NVIDIA driver $(kit_driver_version)"
  fi
}

kit_system_libcuda() {
  local p
  p=$( (ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null) | sed -n 's/.*libcuda\.so\.1 (libc6,x86-64) => //p' | head -1)
  [[ -n $p && -e $p ]] || for p in /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/lib64/libcuda.so.1 /usr/lib/libcuda.so.1; do
    [[ -e $p ]] && break
    p=
  done
  [[ -n $p ]] && echo "$p"
}
kit_driver_version() {
  sed -n 's/.*Kernel Module  *\([0-9.]*\).*/\1/p' /proc/driver/nvidia/version 2>/dev/null | head -1 || true
}
kit_device_line() {
  if [[ $KIT_DRIVER == real ]]; then
    local name
    name=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1)
    echo "${name:-an NVIDIA GPU}, driver $(kit_driver_version) ($(kit_system_libcuda))"
  else
    echo "thaw's CUDA driver emulator ($KIT_DRIVER_REASON)"
  fi
}

# kit_emulator_env STATE_DIR: the environment every process of a step needs on the emulator
# (printed as NAME=VALUE words for `env`); nothing on a real driver.
kit_emulator_env() {
  [[ $KIT_DRIVER == emulator ]] || return 0
  echo "THAW_LIBCUDA=$KIT/emu/libcuda.so.1 REFENGINE_LIBCUDA=$KIT/emu/libcuda.so.1" \
    "THAW_EMU_KERNELS=$KIT/emu/librefengine_kernels_twins.so THAW_EMU_STATE_DIR=$1"
}

# kit_scratch NAME: a private directory for a step's files, on /dev/shm when it is there.
kit_scratch() {
  local base=/dev/shm
  [[ -d $base && -w $base ]] || base=${TMPDIR:-/tmp}
  mktemp -d "$base/thaw-kit-$1.XXXXXX"
}

# kit_round VALUE: a number to 4 significant digits (anything else unchanged), for the report.
kit_round() { awk -v v="$1" 'BEGIN { if (v ~ /^-?[0-9.]+([eE][-+]?[0-9]+)?$/) printf "%.4g\n", v; else print v }'; }

# ---------------------------------------------------------------------------- the report
json_str() {  # json_str TEXT: TEXT as a JSON string
  local s=$1
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\t'/\\t}
  s=${s//$'\r'/}
  s=${s//$'\n'/\\n}
  printf '"%s"' "$s"
}
json_value() {  # a number stays a number, true/false stay booleans, anything else is a string
  if [[ $1 =~ ^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$ || $1 == true || $1 == false ]]; then
    printf '%s' "$1"
  else
    json_str "$1"
  fi
}

# kit_summary LETTERS...: report.json and report.md from each step's result file.
kit_summary() {
  local letter dir status reason seconds
  local -A names=([a]="driver conformance" [b]="reference engine tokens" [c]="VMM benchmarks"
    [d]="thaw's main job" [e]="PyTorch under the shim" [f]="CUDA graphs restored under PyTorch")
  local commit first=1 line key value
  commit=$(head -1 "$KIT/share/commit")
  {
    printf '{"kit_commit":%s,"date":%s,"driver":%s,"device":%s,"quick":%s,"steps":[' \
      "$(json_str "$commit")" "$(json_str "$(date -u +%Y-%m-%dT%H:%M:%SZ)")" \
      "$(json_str "$KIT_DRIVER")" "$(json_str "$(kit_device_line)")" "$( ((QUICK)) && echo true || echo false)"
    for letter in "$@"; do
      dir=$OUT/$letter
      status=$(sed -n 's/^status=//p' "$dir/result" | tail -1)
      reason=$(sed -n 's/^reason=//p' "$dir/result" | tail -1)
      seconds=$(sed -n 's/^seconds=//p' "$dir/result" | tail -1)
      ((first)) || printf ','
      first=0
      printf '{"step":"%s","name":%s,"status":%s,"reason":%s,"seconds":%s,"figures":{' "$letter" \
        "$(json_str "${names[$letter]}")" "$(json_str "${status:-failed}")" "$(json_str "$reason")" \
        "$(json_value "${seconds:-0}")"
      local ffirst=1
      while IFS= read -r line; do
        key=${line%%=*}
        value=${line#*=}
        ((ffirst)) || printf ','
        ffirst=0
        printf '%s:%s' "$(json_str "${key#figure.}")" "$(json_value "$value")"
      done < <(grep '^figure\.' "$dir/result")
      printf '},"log":%s}' "$(json_str "$letter/log")"
    done
    printf ']}\n'
  } >"$OUT/report.json"
  {
    echo "# thaw gpu-kit report"
    echo
    echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "- kit commit: $commit"
    echo "- driver: $KIT_DRIVER — $(kit_device_line)"
    echo "- mode: $( ((QUICK)) && echo quick || echo full)"
    echo
    echo "| step | status | seconds | reason |"
    echo "|---|---|---|---|"
    for letter in "$@"; do
      dir=$OUT/$letter
      printf '| %s %s | %s | %s | %s |\n' "$letter" "${names[$letter]}" \
        "$(sed -n 's/^status=//p' "$dir/result" | tail -1)" "$(sed -n 's/^seconds=//p' "$dir/result" | tail -1)" \
        "$(sed -n 's/^reason=//p' "$dir/result" | tail -1 | sed 's/|/\\|/g')"
    done
    for letter in "$@"; do
      grep -q '^figure\.' "$OUT/$letter/result" || continue
      echo
      echo "## $letter: ${names[$letter]}"
      echo
      sed -n 's/^figure\.\([^=]*\)=\(.*\)/- \1: \2/p' "$OUT/$letter/result"
    done
  } >"$OUT/report.md"
}
