#!/usr/bin/env bash
# Writes the synthetic models the reference engine's suites run on, once per build tree:
#   gpt2-small-f32    124 M parameters, fp32, 3 shards (the sharded loader, the trace test)
#   gpt2-medium-bf16  355 M parameters, bf16, 3 shards
#   gpt2-mini-f16     4 layers x 256, fp16, several shards (the ASan+UBSan build runs this one)
# thaw-genmodel is deterministic, so an existing model with a matching stamp is reused.
set -euo pipefail
genmodel=$1
out=$2
mkdir -p "$out"
make_model() {
  local name=$1; shift
  local stamp="$*"
  if [[ -f "$out/$name/.stamp" && "$(cat "$out/$name/.stamp")" == "$stamp" ]]; then
    echo "$name: up to date"
    return
  fi
  rm -rf "$out/$name"
  "$genmodel" "$@" --out "$out/$name" --quiet
  echo "$stamp" > "$out/$name/.stamp"
  echo "$name: written"
}
make_model gpt2-small-f32 --size small --dtype f32 --shard-size 200MB
make_model gpt2-medium-bf16 --size medium --dtype bf16 --shard-size 300MB
# The sanitizer build's stand-in for the two above (same code paths, a fraction of the work).
make_model gpt2-mini-f16 --size custom --layers 4 --embd 256 --heads 4 --vocab 5000 \
  --dtype f16 --shard-size 3MB
