#!/usr/bin/env bash
# Install Slurm (Debian's slurm-wlm: slurmctld, slurmd, the client commands) and munge, for the
# Slurm end-to-end tests (tests/slurm/); idempotent.
#
# Nothing is started or configured here: tests/support/slurm_cluster.py writes its own
# slurm.conf and munge key in a temporary directory and starts munged, slurmctld and two
# slurmd (each in a network namespace of its own) for the session, then stops them.
# iproute2 gives `ip netns`; the packages' own services, if an init system starts them, are
# stopped so that they hold no port the tests' cluster wants.
set -euo pipefail

if command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 \
    && command -v munged >/dev/null 2>&1 && command -v ip >/dev/null 2>&1; then
    echo "slurm already installed: $(slurmctld -V)"
    exit 0
fi

# shellcheck source=.ci/apt.sh
source "$(dirname "$0")/apt.sh"
apt_install slurm-wlm slurmctld slurmd slurm-client munge iproute2
stop_services slurmctld slurmd munge
echo "slurm installed: $(slurmctld -V)"
