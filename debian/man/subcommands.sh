#!/bin/sh
# help2man include text: each subcommand's own --help (CLI11 prints it), for PROGRAM's man page.
# usage: subcommands.sh PROGRAM   (PROGRAM found on PATH)
set -e
prog=$1
case $prog in
  thawctl) subs="status gpus slots models artifacts net fetch prewarm activate deactivate evict wait cluster
                 cluster_deploy cluster_cold-start cluster_load cluster_state" ;;
  thaw-fetch) subs="fetch publish status" ;;
  thaw-coordinator) subs="keygen serve" ;;
  *) exit 0 ;;
esac
echo "[COMMANDS]"
for s in $subs; do
  args=$(echo "$s" | tr _ ' ')
  echo ".SS \"$prog $args\""
  echo ".nf"
  # shellcheck disable=SC2086
  "$prog" $args --help 2>&1 | sed -e 's/\\/\\e/g' -e "s/^\\([.']\\)/\\\\\\&\\1/"
  echo ".fi"
done
