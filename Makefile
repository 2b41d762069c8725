# The front-door commands. Each creates/reuses .venv from envs/requirements.lock first.
.PHONY: run test test-fast lint setup docs

setup:
	@bash scripts/setup.sh

run: setup
	@bash scripts/run.sh $(ARGS)

# The whole suite; first the peers extra (TensorFlow, for tests/test_peers.py) and the system packages its SLURM and network tests need (installed as root, else named).
test: setup
	@bash scripts/setup.sh --peers
	@bash scripts/setup-system.sh --best-effort
	@bash scripts/lint.sh
	@bash scripts/test.sh $(ARGS)

# Static checks: ruff (lint and format), snakefmt, mypy and snakemake --lint.
lint: setup
	@bash scripts/lint.sh

# The unit tests only: no training/profile subprocess, snakemake workflow, SLURM or network namespace.
test-fast: setup
	@bash scripts/test.sh -m "not slow and not slurm and not netns" $(ARGS)

# Write every generated block of README.md and docs/ again from its record (docs/records/) or the code.
docs: setup
	@.venv/bin/cog -r -I docs --verbosity=1 @docs/generated.txt
