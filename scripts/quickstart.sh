#!/usr/bin/env bash
# Set up, then run the whole chain on the built-in corpus: pretrain (tiny) -> embed -> index -> search.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PIPELINE_WORKSPACE=${PIPELINE_WORKSPACE:-workspace}
.venv/bin/pipeline pretrain --preset tiny
.venv/bin/pipeline embed
.venv/bin/pipeline index
.venv/bin/pipeline search "read and write files in a zip archive" -k 5
