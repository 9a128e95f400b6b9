# Sourced by .ci/install-*.sh: install Debian packages (with sudo when not root) and stop the
# services their packages may start, which would hold ports the tests want.

apt_install() {
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        sudo="sudo"
    fi
    DEBIAN_FRONTEND=noninteractive $sudo apt-get update -qq
    # --no-install-recommends: clients and docs the tests do not use
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

stop_services() {
    local sudo="" unit
    if [ "$(id -u)" -ne 0 ]; then
        sudo="sudo"
    fi
    command -v systemctl >/dev/null 2>&1 || return 0
    for unit in "$@"; do
        if systemctl is-active --quiet "$unit" 2>/dev/null; then
            $sudo systemctl stop "$unit" || true
        fi
    done
}
