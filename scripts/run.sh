#!/usr/bin/env bash
# Run the default pipeline end to end in the project environment.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
ralp-pipe prepare-shards "$@"
python benchmarks/loaders.py "$@"
