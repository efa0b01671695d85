#!/usr/bin/env bash
# End-to-end GPU smoke run: cache, train, summarize (from the cache and streamed from the
# model), index and text search of SmolLM2-135M on cuda, then the same steps on cpu, with
# wall-clock seconds per step side by side.
#
#   bench/gpu_smoke.sh [TOKENS] [WORKDIR]      (defaults: 65536 tokens, a fresh temp dir)
#
# Needs a CUDA GPU visible to torch (it stops with the resolver's error otherwise) and the
# project's venv (.venv/bin/sae-atlas, or sae-atlas on PATH).
#
#   bench/gpu_smoke.sh train36 [DEVICE] [OUTDIR] [SIZE]   (defaults: cuda, $OUT or a temp dir, issue)
#
# Issue 36's issue-size measurements of training from the model (no cache), one after the
# other, each writing its log and JSON under OUTDIR (about 8 minutes on one H100 at SIZE=issue):
#   1. bench/train_stream.py: streamed throughput of the demo's three SAEs (layers 8/15/22,
#      4608 latents, k 32) against the bare stopped forward and the cached trainer, all in one
#      process (a cache of the three hooks is written first);
#   2. bench/train_stream.py --rss-only: peak RSS of `train --from-model` at 100k and at 1M
#      tokens (a corpus of the Python standard library's sources, the builtin text being short);
#   3. bench/transcoder_set.py: the 30-layer skip-transcoder set from one streamed pass, its
#      per-layer FVU, CE/KL with all MLPs replaced and the graphs of its three prompts.
# SIZE=tiny with DEVICE=cpu runs the same steps at a few thousand tokens: a dry run on any machine.
set -euo pipefail
if [ "${1:-}" = train36 ]; then
  DEVICE=${2:-cuda}
  OUTDIR=${3:-${OUT:-$(mktemp -d)}}
  SIZE=${4:-issue}
  ROOT=$(cd "$(dirname "$0")/.." && pwd)
  PY=${PYTHON:-$ROOT/.venv/bin/python}
  [ -x "$PY" ] || PY=python
  mkdir -p "$OUTDIR"
  WORK36=$(mktemp -d)
  if [ "$SIZE" = tiny ]; then  # the dry run's sizes
    STREAM=4096; TRAIN=4096; FORWARD=512; BUFFER=8704; RSS_LOW=4096; RSS_HIGH=8192; RSS_BUFFER=8704
    SET_TOKENS=1024; SET_BATCH=256; SET_DSAE=32; SET_BUFFER=1280; SET_PROMPTS=0; CE_BLOCKS=1
  else
    STREAM=262144; TRAIN=262144; FORWARD=65536; BUFFER=262144; RSS_LOW=102400; RSS_HIGH=1024000; RSS_BUFFER=65536
    SET_TOKENS=1048576; SET_BATCH=4096; SET_DSAE=2304; SET_BUFFER=131072; SET_PROMPTS=3; CE_BLOCKS=64
  fi
  run36() {  # run36 NAME COMMAND...: its output in OUTDIR/NAME.log, the time it took in OUTDIR/seconds.txt
    local name=$1 start; shift
    start=$(date +%s)
    echo "== $name: $*"
    if ! "$@" > "$OUTDIR/$name.log" 2>&1; then echo "FAILED: $name (log: $OUTDIR/$name.log)"; tail -20 "$OUTDIR/$name.log"; fi
    echo "$name $(( $(date +%s) - start ))" >> "$OUTDIR/seconds.txt"
    tail -4 "$OUTDIR/$name.log"
  }
  cd "$ROOT"
  export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
  "$PY" -c "import json, pathlib; out = open('$WORK36/corpus.jsonl', 'w'); total = 0
for p in sorted(pathlib.Path(__import__('sysconfig').get_paths()['stdlib']).rglob('*.py')):
    t = p.read_text(errors='ignore')[:40000]
    if len(t) > 200 and total < 14_000_000: out.write(json.dumps({'text': t}) + '\\n'); total += len(t)"
  run36 cache "$PY" -m sae_atlas cache "$WORK36/atlas" --hook blocks.8.hook_resid_post --hook blocks.15.hook_resid_post \
    --hook blocks.22.hook_resid_post --tokens $((TRAIN * 5 / 4)) --context 128 --device "$DEVICE" --json
  run36 stream_rates "$PY" bench/train_stream.py --atlas "$WORK36/atlas" --work "$WORK36/stream" --device "$DEVICE" \
    --stream-tokens "$STREAM" --train-tokens "$TRAIN" --forward-tokens "$FORWARD" --buffer-tokens "$BUFFER"
  run36 stream_rss "$PY" bench/train_stream.py --atlas "$WORK36/atlas" --work "$WORK36/rss" --device "$DEVICE" \
    --rss-only --rss-tokens "$RSS_LOW" --rss-tokens "$RSS_HIGH" --buffer-tokens "$RSS_BUFFER" \
    --corpus "$WORK36/corpus.jsonl"
  run36 transcoder_set "$PY" bench/transcoder_set.py --atlas "$WORK36/tc-atlas" --residual-atlas "$WORK36/rss/stream-$RSS_HIGH" \
    --device "$DEVICE" --tokens "$SET_TOKENS" --batch-size "$SET_BATCH" --d-sae "$SET_DSAE" \
    --buffer-tokens "$SET_BUFFER" --ce-blocks "$CE_BLOCKS" --prompts "$SET_PROMPTS" --out "$OUTDIR/transcoder_set.json"
  grep -h '^{' "$OUTDIR/stream_rates.log" > "$OUTDIR/stream_rates.json" || true
  grep -h '^{' "$OUTDIR/stream_rss.log" > "$OUTDIR/stream_rss.json" || true
  echo "issue 36 results ($DEVICE, $SIZE) in $OUTDIR:"; cat "$OUTDIR/seconds.txt"
  exit 0
fi
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
  step "$device" train "$CLI" train "$atlas" --tokens "$TOKENS" --expansion 8 --device "$device"
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
