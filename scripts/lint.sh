#!/usr/bin/env bash
# Static checks of the code and the workflow (run by scripts/test.sh before the tests).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
ruff check src tests benchmarks
ruff format --check src tests benchmarks
snakefmt --check workflow
mypy  # [tool.mypy] in pyproject.toml: src, check_untyped_defs
snakemake --lint --snakefile workflow/Snakefile >/dev/null || { snakemake --lint --snakefile workflow/Snakefile; exit 1; }
echo "lint: ruff, ruff format, snakefmt, mypy and snakemake --lint are clean"
