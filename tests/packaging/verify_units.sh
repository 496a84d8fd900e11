#!/bin/bash
# `systemd-analyze verify` on the shipped unit files, with ExecStart pointed at the built
# binary. verify exits 0 even for settings it ignores ("Failed to parse ..., ignoring"), so
# any output at all fails the test; a deliberately broken copy must produce some, so the
# check itself is known to work.
# usage: verify_units.sh SOURCE_DIR THAWD_BINARY [COORDINATOR_BINARY [GATEWAY_BINARY]]
set -euo pipefail
src=$1 thawd=$2 coordinator=${3:-} gateway=${4:-}
command -v systemd-analyze >/dev/null || { echo "systemd-analyze not installed (package systemd)"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

sed "s|/usr/bin/thawd|$thawd|" "$src/packaging/thawd.service" >"$work/thawd.service"
if ! out=$(systemd-analyze verify --man=no "$work/thawd.service" 2>&1) || [[ -n $out ]]; then
  echo "thawd.service does not verify cleanly:"
  echo "$out"
  exit 1
fi

sed 's/^DevicePolicy=closed/DevicePolicy=not-a-policy/' "$work/thawd.service" >"$work/broken.service"
out=$(systemd-analyze verify --man=no "$work/broken.service" 2>&1 || true)
if [[ $out != *"not-a-policy"* ]]; then
  echo "a broken unit went unnoticed; the check is not working: '$out'"
  exit 1
fi
echo "thawd.service: verified"

if [[ -n $coordinator ]]; then
  sed "s|/usr/bin/thaw-coordinator|$coordinator|" "$src/packaging/thaw-coordinator.service" \
    >"$work/thaw-coordinator.service"
  if ! out=$(systemd-analyze verify --man=no "$work/thaw-coordinator.service" 2>&1) ||
    [[ -n $out ]]; then
    echo "thaw-coordinator.service does not verify cleanly:"
    echo "$out"
    exit 1
  fi
  echo "thaw-coordinator.service: verified"
fi

if [[ -n $gateway ]]; then
  sed "s|/usr/bin/thaw-gateway|$gateway|" "$src/packaging/thaw-gateway.service" \
    >"$work/thaw-gateway.service"
  if ! out=$(systemd-analyze verify --man=no "$work/thaw-gateway.service" 2>&1) ||
    [[ -n $out ]]; then
    echo "thaw-gateway.service does not verify cleanly:"
    echo "$out"
    exit 1
  fi
  echo "thaw-gateway.service: verified"
fi
