#!/usr/bin/env bash
# Run the default pipeline (the `dilated` experiment) end to end in the project environment.
# Extra arguments go to snakemake, e.g. `make run ARGS="--config experiment=smoke"`.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
exec snakemake --cores all "$@"
