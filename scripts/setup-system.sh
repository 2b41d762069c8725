#!/usr/bin/env bash
# System packages for `ralp-pipe cluster up` (the multi-node SLURM test) and the emulated cluster (Debian, as root).
# Safe to run repeatedly; does nothing when everything is already there.
set -euo pipefail
need=()
for cmd in slurmctld:slurmctld slurmd:slurmd sinfo:slurm-client munged:munge ip:iproute2 tc:iproute2 \
  nsenter:util-linux unshare:util-linux setpriv:util-linux; do
  command -v "${cmd%%:*}" >/dev/null 2>&1 || need+=("${cmd##*:}")
done
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "setup-system: missing ${need[*]}; install them as root: apt-get install -y ${need[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends $(printf '%s\n' "${need[@]}" | sort -u) >/dev/null
