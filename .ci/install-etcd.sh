#!/usr/bin/env bash
# Install an etcd server (Debian's etcd-server) for the etcd rendezvous tests; idempotent.
#
# tests/test_rendezvous_backends.py starts its own etcd on free loopback ports with the v2 API
# enabled (torch's etcd backend speaks v2 through python-etcd). Nothing is started here.
set -euo pipefail

if command -v etcd >/dev/null 2>&1; then
    echo "etcd already installed: $(etcd --version | head -n 1)"
    exit 0
fi

# shellcheck source=.ci/apt.sh
source "$(dirname "$0")/apt.sh"
apt_install etcd-server  # not etcd-client: the tests do not use it
# The package may start a system etcd on the default ports (2379/2380); the tests use their
# own ports, so a running service does no harm, but stop it when there is an init system.
stop_services etcd
echo "etcd installed: $(etcd --version | head -n 1)"
