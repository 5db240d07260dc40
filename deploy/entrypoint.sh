#!/usr/bin/env bash
# Container entrypoint: prefixd listening on all interfaces of the container: gRPC on 50051,
# the OpenAI-compatible HTTP API on 8000, metrics on 9464.
#   prefixd-entrypoint [--demo] [prefixd flags...]
# --demo writes a small random GPT-2 (real tokenizer, random weights) to /tmp and serves it,
# for trying the image without a model directory.
set -euo pipefail
args=()
demo=0
for a in "$@"; do
  if [[ $a == --demo ]]; then demo=1; else args+=("$a"); fi
done
if ((demo)); then
  prefixd-model random --out /tmp/demo-model --preset tiny --seed 1 >/dev/null
  args=(--model /tmp/demo-model "${args[@]}")
fi
exec prefixd --listen 0.0.0.0:50051 --http-listen 0.0.0.0:8000 --metrics-listen 0.0.0.0:9464 \
  "${args[@]}"
