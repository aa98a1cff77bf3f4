#!/usr/bin/env bash
# Fresh Debian machine -> built kvrun -> the main job: a greedy completion with a small
# real model from ../shared (or any GGUF given as $MODEL).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh "$@"
MODEL=${MODEL:-../shared/models/stories260K.gguf}
if [ -f "$MODEL" ]; then
  ./build/kvrun info -m "$MODEL"
  if ./build/kvrun run --help >/dev/null 2>&1; then
    echo
    echo "$ kvrun run -m $MODEL -p 'Once upon a time' -n 48 --temp 0"
    ./build/kvrun run -m "$MODEL" -p "Once upon a time" -n 48 --temp 0
    echo
  fi
else
  echo "built build/kvrun; no model at $MODEL (set MODEL=path/to/model.gguf)"
fi
