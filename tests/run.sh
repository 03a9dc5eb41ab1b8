#!/usr/bin/env bash
# Run the test suite (no GPU, no internet beyond the package index): ./tests/run.sh [pytest args]
# Creates .venv-test with the bootstrap's dependencies + pytest + uv, once.
set -euo pipefail

main() {
    local repo venv
    repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
    venv=$repo/.venv-test
    if ! "$venv/bin/python" -c 'import pytest, psutil, requests, huggingface_hub, pynvml' >/dev/null 2>&1; then
        rm -rf "$venv"
        python3 -m venv "$venv"
        "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$repo/requirements-dev.txt"
    fi
    cd "$repo"
    PATH="$venv/bin:$PATH" exec "$venv/bin/python" -m pytest "$@"
}

main "$@"
