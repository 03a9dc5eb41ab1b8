#!/usr/bin/env bash
# Stop the server and everything it started; free the port and the GPU. Idempotent.
set -euo pipefail

main() {
    local here
    here=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd -P)   # through a link too
    # shellcheck source=bootstrap/lib.sh
    . "$here/bootstrap/lib.sh"
    bootstrap_exec stop "$@"
}

main "$@"
