#!/usr/bin/env bash
# Static checks of the code and the workflow (run by scripts/test.sh before the tests).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
ruff check src tests benchmarks docs
ruff format --check src tests benchmarks docs
snakefmt --check workflow
mypy  # [tool.mypy] in pyproject.toml: src, check_untyped_defs
snakemake --lint --snakefile workflow/Snakefile >/dev/null || { snakemake --lint --snakefile workflow/Snakefile; exit 1; }
# generated figures and reference tables: every cog block of docs/generated.txt as its record or the code gives it
cog --check -I docs --verbosity=1 --check-fail-msg='run make docs to write them from their records' @docs/generated.txt
# the documentation site: every page, link and generated reference builds (into a temporary folder, not kept)
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
NO_MKDOCS_2_WARNING=1 mkdocs build --strict --quiet --site-dir "$site" || { echo "lint: mkdocs build --strict failed (see above)"; exit 1; }
echo "lint: ruff, ruff format, snakefmt, mypy, snakemake --lint, cog --check and mkdocs build --strict are clean"
