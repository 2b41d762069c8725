#!/usr/bin/env bash
# Run the test suite in the project environment; arguments go to pytest (make test-fast passes -m "not slow ...").
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
exec python -m pytest -q "$@"
