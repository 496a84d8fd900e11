#!/bin/bash
# The one-way dependencies of thaw's architecture brief: common ← vmm ← daemon; common ← preload;
# common ← coordinator/policy ← coordinator (and sim); the emulator depends on nothing of
# thaw's. Every #include in the source folders below, and every target_link_libraries in
# their CMakeLists.txt, must point the way the rules allow; each that does not is listed as
# FILE:LINE with the rule it breaks, and the script exits 1.
#
# Rules name folders, not files (a file's folder is matched by its longest rule prefix), so
# renames inside a folder (daemon/node → daemon/service, …) need no change here. tools/ is
# the top of the graph (thawctl, thaw-fetch and the demos may use any library); what is
# checked there is that nothing below includes tools/, and that the reference engine — a
# stand-in for an unmodified engine — uses nothing of thaw's but the emulator's public
# headers. tests/ and bench/ may include anything and are not scanned.
#
# An include is resolved as the compiler would for the project's include path: first next
# to the including file, then from the source root ("vmm/…"), then from a top-level
# folder's include/ directory (emu/include/thaw/emu_twin.h). One that resolves to none of
# them (system, fmt, generated in the build tree) is not thaw's and is not checked.
#
# usage: include_directions.sh [--root DIR] [--no-cmake]
#   --root DIR   the source tree to check (default: the repository holding this script)
#   --no-cmake   check #include lines only
# exit: 0 clean, 1 violations found, 2 usage error
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
check_cmake=1
while (($#)); do
  case $1 in
    --root)
      root=$(cd "${2:?--root needs a directory}" && pwd)
      shift 2
      ;;
    --no-cmake)
      check_cmake=0
      shift
      ;;
    -h | --help)
      sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "include_directions.sh: unknown argument '$1' (see --help)" >&2
      exit 2
      ;;
  esac
done

# layer | folders it may include or link (its own among them) | why
rules=(
  "common|common|common is the base every part shares: it uses nothing of thaw's above it"
  "vmm|vmm common|common ← vmm ← daemon: vmm is a library the daemon links"
  "daemon|daemon vmm common bpf|common ← vmm ← daemon; the daemon shares only common/proto with the coordinator, and bpf/ (its traffic classifier and the class header both sides compile) only with itself"
  "preload|preload common|common ← preload: the shim is loaded into engines and shares only common/ with thawd"
  "coordinator/policy|coordinator/policy common|common ← coordinator/policy: policies are pure functions of a cluster snapshot, shared with sim/"
  "coordinator/cluster|coordinator/cluster coordinator/policy common|coordinator/cluster is state and decisions without sockets: it uses policy/, not server/"
  "coordinator|coordinator common|common ← coordinator/policy ← coordinator; the coordinator shares only common/proto with the daemon"
  "sim|sim coordinator/policy common|common ← coordinator/policy ← sim: the simulator runs the coordinator's own policies"
  "gateway|gateway common|common ← gateway: the front door shares only common/proto with the coordinator it subscribes to"
  "emu|emu|the emulator stands in for NVIDIA's driver: it depends on nothing of thaw's"
  "tools/refengine|tools/refengine emu/include|the reference engine stands in for an unmodified engine: it may use only the emulator's public headers (emu/include)"
)
declare -A allowed=() why=()
layers=()
for r in "${rules[@]}"; do
  IFS='|' read -r layer allow reason <<<"$r"
  layers+=("$layer")
  allowed[$layer]=$allow
  why[$layer]=$reason
done

# under PATH PREFIX: PATH is PREFIX or inside it.
under() { [[ $1 == "$2" || $1 == "$2"/* ]]; }

# The rule that governs PATH (the longest layer prefix), or nothing.
layer_of() {
  local best="" l
  for l in "${layers[@]}"; do
    if under "$1" "$l" && ((${#l} > ${#best})); then best=$l; fi
  done
  printf '%s' "$best"
}

# Whether PATH (repo-relative) is something of thaw's: inside a top-level source folder.
thaws() {
  local top=${1%%/*}
  [[ $1 == */* && -d $root/$top && $top != .* && $top != build* ]]
}

# Whether LAYER may use PATH; if not, prints why.
may_use() {
  local layer=$1 path=$2 a
  for a in ${allowed[$layer]}; do
    if under "$path" "$a"; then return 0; fi
  done
  printf '%s/ may use only %s — %s' "$layer" "$(sed -E 's#([^ ]+)#\1/#g; s# #, #g' <<<"${allowed[$layer]}")" "${why[$layer]}"
  return 1
}

# Collapses "." and ".." in a relative path; fails if it leaves the tree.
normalize() {
  local -a out=()
  local part
  IFS=/ read -ra parts <<<"$1"
  for part in "${parts[@]}"; do
    case $part in
      "" | .) ;;
      ..)
        ((${#out[@]})) || return 1
        unset 'out[${#out[@]}-1]'
        ;;
      *) out+=("$part") ;;
    esac
  done
  (IFS=/ && printf '%s' "${out[*]}")
}

violations=0
report() {
  echo "$1"
  violations=$((violations + 1))
}

# --- #include ------------------------------------------------------------------------------

# The layers' folders, each once (coordinator/ holds coordinator/policy/).
scan=()
for l in "${layers[@]}"; do
  [[ -d $root/$l ]] || continue
  [[ $l == */* && -n $(layer_of "${l%/*}") ]] && continue # inside another layer's folder
  scan+=("$l")
done
declare -A include_dirs=()
for d in "$root"/*/include; do
  if [[ -d $d ]]; then include_dirs[${d#"$root"/}]=1; fi
done

include_re='^[[:space:]]*#[[:space:]]*include[[:space:]]*([<"])([^">]+)[">]'
includes=0
while IFS= read -r hit; do
  file=${hit%%:*}
  rest=${hit#*:}
  line=${rest%%:*}
  text=${rest#*:}
  [[ $text =~ $include_re ]] || continue
  quote=${BASH_REMATCH[1]} inc=${BASH_REMATCH[2]}
  dir=${file%/*}
  if [[ $dir != "${last_dir:-}" ]]; then
    last_dir=$dir
    layer=$(layer_of "$file")
  fi
  [[ -n $layer ]] || continue
  target=""
  if [[ $quote == '"' && ($inc == ./* || $inc == ../* || -e $root/$dir/$inc) ]]; then
    target=$(normalize "$dir/$inc") || target="(outside the tree)"
  elif thaws "$inc"; then
    target=$(normalize "$inc") || target=""
  elif [[ $quote == '"' ]]; then
    for d in "${!include_dirs[@]}"; do
      if [[ -e $root/$d/$inc ]]; then target="$d/$inc" && break; fi
    done
  fi
  [[ -n $target ]] || continue
  includes=$((includes + 1))
  if [[ $target == "(outside the tree)" ]]; then
    report "$file:$line: includes $quote$inc${quote/\</>} — a path that leaves the source tree"
    continue
  fi
  if ! reason=$(may_use "$layer" "$target"); then
    shown=$quote$inc${quote/\</>}
    [[ $target == "$inc" ]] || shown+=" ($target)"
    report "$file:$line: includes $shown: $reason"
  fi
done < <(cd "$root" && grep -rnE --include='*.c' --include='*.cc' --include='*.cpp' \
  --include='*.cxx' --include='*.h' --include='*.hh' --include='*.hpp' --include='*.hxx' \
  --include='*.inc' --include='*.inl' --include='*.ipp' --include='*.cu' --include='*.cuh' \
  '^[[:space:]]*#[[:space:]]*include[[:space:]]*["<]' "${scan[@]}" | LC_ALL=C sort -t: -k1,1 -k2,2n)

# --- CMake target links --------------------------------------------------------------------

links=0
if ((check_cmake)); then
  # One record per command: FILE TAB LINE TAB COMMAND TAB ARGUMENTS (comments stripped,
  # continuation lines joined until the parentheses close).
  cmake_commands() {
    awk -v file="$1" '
      function flush() { if (cmd != "") { gsub(/[[:space:]]+/, " ", buf); print file "\t" start "\t" cmd "\t" buf } cmd = "" }
      {
        line = $0
        sub(/(^|[[:space:]])#.*$/, "", line)
        if (cmd == "") {
          if (match(line, /^[[:space:]]*(add_library|add_executable|target_link_libraries|target_include_directories)[[:space:]]*\(/)) {
            head = substr(line, RSTART, RLENGTH)
            cmd = head; sub(/^[[:space:]]*/, "", cmd); sub(/[[:space:]]*\($/, "", cmd)
            start = NR; depth = 1; buf = ""
            line = substr(line, RSTART + RLENGTH)
          } else next
        }
        for (i = 1; i <= length(line); i++) {
          c = substr(line, i, 1)
          if (c == "(") depth++
          else if (c == ")") { depth--; if (depth == 0) { buf = buf substr(line, 1, i - 1); flush(); next } }
        }
        buf = buf " " line
      }
      END { flush() }' "$root/$1"
  }
  mapfile -t cmake_files < <(cd "$root" && find . -name CMakeLists.txt -not -path './build*' \
    -not -path './.*' | sed 's#^\./##' | LC_ALL=C sort)
  records=$(for f in "${cmake_files[@]}"; do cmake_commands "$f"; done)

  # Where each target lives: the deepest folder holding all its literal sources (a library
  # of coordinator/policy/*.cpp defined in coordinator/CMakeLists.txt is coordinator/policy),
  # an INTERFACE target's include directory, or else its CMakeLists.txt's folder.
  declare -A where=()
  while IFS=$'\t' read -r file line cmd args; do
    [[ $cmd == add_library || $cmd == add_executable ]] || continue
    read -ra words <<<"$args"
    name=${words[0]:-}
    [[ -n $name && $name != *'$'* && " ${words[*]} " != *" IMPORTED "* && " ${words[*]} " != *" ALIAS "* ]] || continue
    cmdir=$(dirname "$file")
    [[ $cmdir == . ]] && cmdir=""
    common=""
    for w in "${words[@]:1}"; do
      case $w in
        STATIC | SHARED | MODULE | OBJECT | INTERFACE | EXCLUDE_FROM_ALL | GLOBAL | WIN32 | MACOSX_BUNDLE) continue ;;
        *'$'* | *'"'* | /*) continue ;;
      esac
      d=$(dirname "$w")
      d=$(normalize "${cmdir:+$cmdir/}$([[ $d == . ]] || echo "$d")") || continue
      if [[ -z $common ]]; then
        common=$d
      else
        while ! under "$d" "$common" && [[ $common == */* ]]; do common=${common%/*}; done
        under "$d" "$common" || common=""
      fi
    done
    where[$name]=${common:-$cmdir}
  done <<<"$records"
  # shellcheck disable=SC2016 # CMake's variable, literally
  here='${CMAKE_CURRENT_SOURCE_DIR}/'
  while IFS=$'\t' read -r file line cmd args; do
    [[ $cmd == target_include_directories ]] || continue
    read -ra words <<<"$args"
    name=${words[0]:-}
    [[ -n ${where[$name]:-} && ${words[1]:-} == INTERFACE && ${words[2]:-} == "$here"* ]] || continue
    d=${words[2]#"$here"}
    cmdir=$(dirname "$file")
    [[ $cmdir == . ]] && cmdir=""
    d=$(normalize "${cmdir:+$cmdir/}${d%\"}") && where[$name]=$d
  done <<<"$records"

  while IFS=$'\t' read -r file line cmd args; do
    [[ $cmd == target_link_libraries ]] || continue
    read -ra words <<<"$args"
    name=${words[0]:-}
    from=${where[$name]:-}
    [[ -n $from ]] || continue
    layer=$(layer_of "$from")
    [[ -n $layer ]] || continue
    for w in "${words[@]:1}"; do
      case $w in
        PUBLIC | PRIVATE | INTERFACE | LINK_PUBLIC | LINK_PRIVATE | LINK_INTERFACE_LIBRARIES | debug | optimized | general) continue ;;
      esac
      to=${where[$w]:-}
      if [[ -z $to && $w == *_shim ]]; then to=${where[${w%_shim}]:-}; fi # thaw_shim_variant()
      [[ -n $to ]] || continue
      links=$((links + 1))
      if ! reason=$(may_use "$layer" "$to"); then
        report "$file:$line: $name ($from) links $w ($to): $reason"
      fi
    done
  done <<<"$records"
fi

if ((violations)); then
  echo "$violations dependencies point the wrong way (the rules are the table in" \
    "${BASH_SOURCE[0]##*/}; the architecture: common ← vmm ← daemon, common ← preload," \
    "common ← coordinator/policy ← coordinator, emu on nothing of thaw's)"
  exit 1
fi
checked="$includes includes of thaw's headers"
((check_cmake)) && checked+=" and $links links to thaw's targets"
echo "dependency directions: $checked in ${scan[*]}: all point the allowed way"
