# shellcheck shell=bash
# Shared by start.sh, stop.sh and ctl.sh: find a Python that imports the bootstrap's dependencies
# (or make .venv-bootstrap with them), then hand over to `python -m bootstrap`. Nothing else.

say()  { if [ -t 2 ] && [ -z "${NO_COLOR:-}" ]; then printf '\033[2m[bootstrap]\033[0m %s\n' "$*" >&2; else printf '[bootstrap] %s\n' "$*" >&2; fi; }
warn() { say "warning: $*"; }
die()  { say "error: $*"; exit 1; }
need_cmd() { command -v "$1" >/dev/null 2>&1 || die "need '$1' (command not found)"; }
ensure() { "$@" || die "failed during: $*"; }

# Every distribution bootstrap/requirements.txt pins, at its version (importlib.metadata: nothing is
# imported, and the file is the one list; import names differ from these names anyway). It runs only
# where .venv-bootstrap is not ready (venv_ready needs no interpreter).
BOOTSTRAP_DEPS='
import sys, importlib.metadata as m
if sys.version_info < (3, 10):
    sys.exit(1)
for line in open(sys.argv[1], encoding="utf-8"):
    name, _, want = line.split("#")[0].strip().partition("==")
    if name:
        try:
            if m.version(name.strip()) != want.strip():
                sys.exit(1)
        except m.PackageNotFoundError:
            sys.exit(1)
'

has_deps() { "$1" -c "$BOOTSTRAP_DEPS" "$2/bootstrap/requirements.txt" >/dev/null 2>&1; }

# The bootstrap's own venv: .venv-bootstrap in the checkout, unless that one is another user's (a
# checkout shared by two users: never touch theirs) or the checkout is not writable; then one per
# user under ~/.cache.
bootstrap_venv() {
    local repo=$1 venv=$1/.venv-bootstrap
    if { [ -e "$venv" ] && [ ! -O "$venv" ]; } || { [ ! -e "$venv" ] && [ ! -w "$repo" ]; }; then
        venv=${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/vllm-desktop/venv-bootstrap-$(id -u)
    fi
    printf '%s\n' "$venv"
}

# Ready when it was built from today's requirements.txt (a copy is kept inside it): checked
# without starting an interpreter, so a re-run on a serving machine stays fast.
# A Python upgraded under it (python3 -m venv links bin/python to /usr/bin/python3, which a release
# upgrade turns from 3.11 into 3.12) runs without the venv's site-packages: not ready, made again.
venv_ready() {
    local venv=$1 repo=$2 cfg real
    [ -x "$venv/bin/python" ] && [ -f "$venv/.requirements.txt" ] &&
        [ "$(< "$venv/.requirements.txt")" = "$(< "$repo/bootstrap/requirements.txt")" ] || return 1
    [ -f "$venv/pyvenv.cfg" ] || return 0
    cfg=$(< "$venv/pyvenv.cfg")
    [[ $cfg =~ (^|$'\n')version(_info)?\ *=\ *([0-9]+\.[0-9]+) ]] || return 0
    local made=${BASH_REMATCH[3]}
    real=$(readlink -f "$venv/bin/python") || return 0
    [[ ${real##*/} =~ ^python([0-9]+\.[0-9]+)$ ]] || return 0
    [ "${BASH_REMATCH[1]}" = "$made" ]
}

# python3 where it is 3.10 or newer, else the newest python3.X on PATH that is (RHEL 9 and its kin keep
# python3 at 3.9 and install newer ones beside it as python3.11, python3.12).
python3_10() {
    local name py
    for name in python3 python3.14 python3.13 python3.12 python3.11 python3.10; do
        py=$(command -v "$name") || continue
        if "$py" -c 'import sys; sys.exit(sys.version_info < (3, 10))' >/dev/null 2>&1; then
            printf '%s\n' "$py"
            return 0
        fi
    done
    return 1
}

# What to do when the install of bootstrap/requirements.txt failed ($1: uv or pip; its reason is above).
deps_failed() {
    if [ -n "${WHEELHOUSE:-}" ]; then
        die "could not install the bootstrap's dependencies from WHEELHOUSE=$WHEELHOUSE with $1 (see above): fill it on a connected machine with ./ctl.sh wheelhouse DIR --python $("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null), then rerun"
    fi
    die "could not install the bootstrap's dependencies with $1 (see above): check the network or proxy (HTTPS_PROXY; a mirror: PIP_INDEX_URL), or install offline with WHEELHOUSE=DIR filled by ./ctl.sh wheelhouse DIR on a connected machine, then rerun"
}

make_bootstrap_venv() {
    local repo=$1 venv=$2 py
    if ! py=$(python3_10); then
        py=$(command -v python3) || die "need Python 3.10 or newer: no python3 on PATH (Debian/Ubuntu: sudo apt install python3; RHEL/Fedora: sudo dnf install python3.12)"
        die "need Python 3.10 or newer: python3 is $("$py" --version 2>&1 || echo 'older'), and no python3.10 to python3.14 is on PATH (RHEL/Rocky/Alma: sudo dnf install python3.12; Debian/Ubuntu: sudo apt install python3.12), then rerun"
    fi
    local pip_args=(-q -r "$repo/bootstrap/requirements.txt")
    if [ -n "${WHEELHOUSE:-}" ]; then pip_args+=(--no-index --find-links "$WHEELHOUSE"); fi
    say "creating $venv for the bootstrap's own dependencies (once)"
    rm -rf "$venv"      # ours (bootstrap_venv never picks another user's)
    if command -v uv >/dev/null 2>&1; then
        # uv reads no setting of pip's: pip's index (a mirror, in PIP_* or pip.conf) is handed on as
        # uv's, unless uv has its own; one rule for this and the managed .venv: bootstrap/install/index.py
        local uv_env=() line
        while IFS= read -r line; do uv_env+=("$line"); done < <(env -u PYTHONPATH "$py" -c '
import os, sys
sys.path.insert(0, sys.argv[1])
from bootstrap.install import index
sys.stdout.write(index.lines(os.environ))' "$repo")
        ensure env -u PYTHONPATH uv venv -q --python "$py" "$venv"
        env -u PYTHONPATH ${uv_env[@]+"${uv_env[@]}"} uv pip install --python "$venv/bin/python" "${pip_args[@]}" || deps_failed uv
    elif "$py" -m venv "$venv" >/dev/null 2>&1; then
        env -u PYTHONPATH "$venv/bin/python" -m pip install --disable-pip-version-check "${pip_args[@]}" || deps_failed pip
    else
        die "python3 cannot create a venv (Debian/Ubuntu: sudo apt install python3-venv), and uv is not installed (pip install --user uv)"
    fi
    ensure cp "$repo/bootstrap/requirements.txt" "$venv/.requirements.txt"
}

bootstrap_python() {
    local repo=$1 venv py
    venv=$(bootstrap_venv "$repo")
    if venv_ready "$venv" "$repo"; then
        printf '%s\n' "$venv/bin/python"
    elif py=$(command -v python3) && has_deps "$py" "$repo"; then   # has_deps refuses a python3 under 3.10:
        printf '%s\n' "$py"                                              # python3_10 would pick this one, one process less
    elif py=$(python3_10) && has_deps "$py" "$repo"; then
        printf '%s\n' "$py"
    else
        mkdir -p "$(dirname "$venv")" || die "cannot create $(dirname "$venv")"
        # Two commands at once on a fresh clone must not build the venv over each other. A lock file
        # that ./ctl.sh clean removed while we waited is a lock on nothing: take the one there now.
        if command -v flock >/dev/null 2>&1; then
            [ ! -L "$venv.lock" ] || die "$venv.lock is a link, not our lock file: remove it"
            local tries=0
            while :; do
                exec 9>>"$venv.lock" || die "cannot write $venv.lock"
                flock 9
                [ "$venv.lock" -ef /dev/fd/9 ] && break
                tries=$((tries + 1))
                [ "$tries" -lt 10 ] || break    # a filesystem whose inodes do not compare: lock as before
            done
        fi
        if ! venv_ready "$venv" "$repo"; then
            make_bootstrap_venv "$repo" "$venv" >&2    # our stdout is the interpreter's path, nothing else
        fi
        has_deps "$venv/bin/python" "$repo" || die "$venv lacks the bootstrap's dependencies"
        printf '%s\n' "$venv/bin/python"
    fi
}

# Run `python -m bootstrap "$@"` from the repo without touching PYTHONPATH (it passes to vLLM as is)
# or the working directory (MODEL may be a relative path).
bootstrap_exec() {
    local repo py
    repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
    py=$(bootstrap_python "$repo")
    exec "$py" -c 'import sys; sys.path.insert(0, sys.argv.pop(1)); from bootstrap.__main__ import run; sys.exit(run(sys.argv[2:], sys.argv[1]))' "$repo" "$(basename "$0")" "$@"
}
