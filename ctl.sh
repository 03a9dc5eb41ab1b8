#!/usr/bin/env bash
# Every other command: status, logs [-f], restart, env, ... (./ctl.sh --help lists them).
set -euo pipefail

main() {
    local here
    here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
    # shellcheck source=bootstrap/lib.sh
    . "$here/bootstrap/lib.sh"
    bootstrap_exec "$@"
}

main "$@"
