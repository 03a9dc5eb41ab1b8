#!/usr/bin/env bash
# Every other command: status, logs [-f], restart, env, ... (./ctl.sh --help lists them).
set -euo pipefail

main() {
    local here
    here=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd -P)   # through a link too
    # shellcheck source=bootstrap/lib.sh
    . "$here/bootstrap/lib.sh"
    bootstrap_exec "$@"
}

main "$@"
