#!/usr/bin/env bash
# Set up, then run the whole chain on the built-in corpus: pretrain (sized to a 3-minute budget, then
# adapted to retrieval) -> embed -> index (which chooses the default search mode) -> search.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PIPELINE_WORKSPACE=${PIPELINE_WORKSPACE:-workspace}
.venv/bin/pipeline pretrain --time-budget 3m
.venv/bin/pipeline embed
.venv/bin/pipeline index
.venv/bin/pipeline search "read and write files in a zip archive" -k 5
