# The two front-door commands. Both create/reuse .venv from envs/requirements.lock first.
.PHONY: run test setup

setup:
	@bash scripts/setup.sh

run: setup
	@bash scripts/run.sh $(ARGS)

test: setup
	@bash scripts/test.sh $(ARGS)
