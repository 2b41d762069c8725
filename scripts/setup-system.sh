#!/usr/bin/env bash
# System packages for `ralp-pipe cluster up` (the multi-node SLURM test) and the emulated cluster (Debian, as root).
# Safe to run repeatedly; does nothing (and at once) when everything is already there.
#   --best-effort  (make test) where it cannot install them (not root, no apt-get, apt-get failed), say in one
#                  line what to do and exit 0: the tests that need them then fail naming this script.
set -euo pipefail
best_effort=false
[ "${1:-}" = "--best-effort" ] && best_effort=true
need=()
for cmd in slurmctld:slurmctld slurmd:slurmd sinfo:slurm-client munged:munge ip:iproute2 tc:iproute2 \
  nsenter:util-linux unshare:util-linux setpriv:util-linux; do
  command -v "${cmd%%:*}" >/dev/null 2>&1 || need+=("${cmd##*:}")
done
[ ${#need[@]} -eq 0 ] && exit 0
packages=$(printf '%s\n' "${need[@]}" | sort -u | tr '\n' ' ')
packages=${packages% }
cannot() {  # why it cannot install them: one line, then exit 1 (0 with --best-effort)
  echo "setup-system: missing $packages ($1); the SLURM and emulated-cluster tests need them:" \
    "as root run: apt-get install -y $packages (or: bash scripts/setup-system.sh)" >&2
  $best_effort && exit 0
  exit 1
}
[ "$(id -u)" -eq 0 ] || cannot "not root, so not installed here"
command -v apt-get >/dev/null 2>&1 || cannot "no apt-get on this machine"
echo "setup-system: installing $packages" >&2
export DEBIAN_FRONTEND=noninteractive
{ apt-get update -qq && apt-get install -y -qq --no-install-recommends $packages >/dev/null; } ||
  cannot "apt-get failed"
