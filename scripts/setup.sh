#!/usr/bin/env bash
# Create or reuse the project virtual environment (.venv) from envs/requirements.lock.
# Fast when nothing changed: the lock's checksum is stamped into the venv after a good install.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
stamp="$VENV/.ralp-pipe-lock.sha256"
want=$(sha256sum envs/requirements.lock pyproject.toml | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$VENV/bin/ralp-pipe" ]; then
  exit 0
fi
echo "setup: installing the pinned environment into $VENV (first time takes a few minutes)" >&2
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet -r envs/requirements.lock
"$VENV/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e .
echo "$want" > "$stamp"
