#!/usr/bin/env bash
# Run the whole test suite in the project environment.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
exec python -m pytest -q "$@"
