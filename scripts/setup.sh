#!/usr/bin/env bash
# Create or reuse the project virtual environment (.venv) from envs/requirements.lock.
# Fast when nothing changed: the lock's checksum is stamped into the venv after a good install.
# uv installs the lock (under a minute here, bytecode compiled, where pip takes about 2 min), from the indexes and wheel folders pip is
# configured with, every one weighed alike as pip does; where uv cannot be installed, pip does it all.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
UV_VERSION=0.13.9
stamp="$VENV/.ralp-pipe-lock.sha256"
want=$(sha256sum envs/requirements.lock pyproject.toml | sha256sum | cut -d' ' -f1)
# --peers (make test): also the `peers` extra of pyproject.toml (TensorFlow, for benchmarks/peers), where missing;
# `make run` never installs it
peers() {
  [ "${1:-}" = "--peers" ] || return 0
  "$VENV/bin/python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('tensorflow') is None)" && return 0
  echo "setup: installing the peers extra (TensorFlow) into $VENV" >&2
  mapfile -t wanted < <("$VENV/bin/python" -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['peers'], sep='\n')")
  "$VENV/bin/python" -m pip install --quiet "${wanted[@]}"  # pip: it reads the indexes pip is configured with
}
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$VENV/bin/ralp-pipe" ]; then
  peers "$@"
  exit 0
fi
echo "setup: installing the pinned environment into $VENV (first time takes a minute or more)" >&2
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip)
if "${pip[@]}" install --quiet "uv==$UV_VERSION" 2>/dev/null; then
  install=("$VENV/bin/uv" pip install --quiet --compile-bytecode --python "$VENV/bin/python" --index-strategy unsafe-best-match)
  for key in index-url extra-index-url find-links; do
    for value in $("${pip[@]}" config get "global.$key" 2>/dev/null || true); do
      install+=("--$key" "$value")
    done
  done
else
  echo "setup: uv could not be installed; pip installs the environment instead" >&2
  "${pip[@]}" install --quiet --upgrade pip
  install=("${pip[@]}" install --quiet)
fi
"${install[@]}" -r envs/requirements.lock
"${install[@]}" --no-deps --no-build-isolation -e .
echo "$want" > "$stamp"
peers "$@"
