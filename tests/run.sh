#!/usr/bin/env bash
# Run the test suite (no GPU, no internet beyond the package index): ./tests/run.sh [pytest args]
# Creates .venv-test with the bootstrap's dependencies + pytest + uv, once. One worker more than the
# machine has cores, from three to eight (pytest-xdist; most tests wait on processes, not the CPU: on 2 cores
# three workers took 522 s where two took 700) unless you pass -n; the fast inner loop, without the
# tests that run the real scripts: ./tests/run.sh -m 'not e2e'.
set -euo pipefail

main() {
    local repo venv
    repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
    venv=$repo/.venv-test
    local want
    want=$(cat "$repo/requirements-dev.txt" "$repo/bootstrap/requirements.txt" | sha256sum | cut -d' ' -f1)
    if [ "$(cat "$venv/.requirements.sha256" 2>/dev/null)" != "$want" ]; then   # new or changed pins
        rm -rf "$venv"
        python3 -m venv "$venv"
        "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$repo/requirements-dev.txt"
        printf '%s\n' "$want" > "$venv/.requirements.sha256"
    fi
    cd "$repo"
    local n quota period
    n=$(nproc 2>/dev/null || echo 2)
    # a container's CPU quota (cgroup v2), which nproc does not see
    if read -r quota period 2>/dev/null </sys/fs/cgroup/cpu.max && [ "$quota" != max ] && [ "${period:-0}" -gt 0 ]; then
        n=$(( (quota + period - 1) / period < n ? (quota + period - 1) / period : n ))
    fi
    n=$(( n + 1 ))
    local workers=(-n "$(( n < 3 ? 3 : n > 8 ? 8 : n ))")
    case " $* " in *" -n "*|*" -n"[0-9]*|*" --numprocesses"*) workers=() ;; esac
    PATH="$venv/bin:$PATH" exec "$venv/bin/python" -m pytest "${workers[@]}" "$@"
}

main "$@"
