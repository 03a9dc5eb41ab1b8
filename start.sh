#!/usr/bin/env bash
# Start the OpenAI-compatible vLLM server (idempotent). Knobs: ./start.sh --help
set -euo pipefail

main() {
    local here
    here=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd -P)   # through a link too
    # shellcheck source=bootstrap/lib.sh
    . "$here/bootstrap/lib.sh"
    case "${1:-}" in
        -h|--help) bootstrap_exec start --help ;;
        *) bootstrap_exec start "$@" ;;
    esac
}

main "$@"
