#!/usr/bin/env bash
# End-to-end GPU smoke run: cache, train, summarize (from the cache and streamed from the
# model), index and text search of SmolLM2-135M on cuda, then the same steps on cpu, with
# wall-clock seconds per step side by side.
#
#   bench/gpu_smoke.sh [TOKENS] [WORKDIR]      (defaults: 65536 tokens, a fresh temp dir)
#
# Needs a CUDA GPU visible to torch (it stops with the resolver's error otherwise) and the
# project's venv (.venv/bin/sae-atlas, or sae-atlas on PATH).
set -euo pipefail
TOKENS=${1:-65536}
WORK=${2:-$(mktemp -d)}
mkdir -p "$WORK"
CLI=${SAE_ATLAS:-$(dirname "$0")/../.venv/bin/sae-atlas}
[ -x "$CLI" ] || CLI=sae-atlas
declare -A SECONDS_OF

step() {  # step DEVICE NAME COMMAND...
  local device=$1 name=$2; shift 2
  local start end
  start=$(date +%s.%N)
  "$@" > "$WORK/$device-$name.log" 2>&1 || { echo "FAILED: $device $name (log: $WORK/$device-$name.log)"; tail -20 "$WORK/$device-$name.log"; exit 1; }
  end=$(date +%s.%N)
  SECONDS_OF[$device-$name]=$(echo "$end - $start" | bc)
}

for device in cuda cpu; do
  atlas="$WORK/atlas-$device"
  step "$device" cache "$CLI" cache --atlas "$atlas" --tokens "$TOKENS" --layers 2 --device "$device"
  step "$device" train "$CLI" train --atlas "$atlas" --tokens "$TOKENS" --expansion 8 --device "$device"
  step "$device" summarize "$CLI" summarize --atlas "$atlas" --device "$device"
  step "$device" summarize-stream "$CLI" summarize --atlas "$atlas" --from-model --tokens "$TOKENS" --force \
    --device "$device"
  step "$device" index "$CLI" index --atlas "$atlas"
  step "$device" search-text "$CLI" search text "$atlas" "The cat sat on the mat on Monday." --device "$device"
done

printf '%-18s %10s %10s %8s\n' step "cuda (s)" "cpu (s)" "cpu/cuda"
for name in cache train summarize summarize-stream index search-text; do
  gpu=${SECONDS_OF[cuda-$name]}; cpu=${SECONDS_OF[cpu-$name]}
  printf '%-18s %10.1f %10.1f %8.1f\n' "$name" "$gpu" "$cpu" "$(echo "$cpu / $gpu" | bc -l)"
done
echo "tokens per step: $TOKENS; logs and atlases in $WORK"
