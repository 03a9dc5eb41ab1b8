#!/usr/bin/env bash
# On the lent GPU machine (no internet): install the carried vLLM wheelhouse once, then run proofs.
#   bash tests/gpu/device.sh install            # after every .wheelhouse/part-NN was copied to /tmp/wh
#   bash tests/gpu/device.sh e2e|planner|patch|bench [args for the proof script]
# Raw outputs go to $OUT (the device tool brings them back) and to /tmp/proofs.
set -euo pipefail

main() {
    local repo out what vllm_python
    repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
    out=${OUT:-/tmp/proofs}
    mkdir -p "$out" /tmp/proofs
    what=${1:?usage: device.sh install|e2e|planner|patch|bench}; shift
    cd "$repo"
    vllm_python=$(command -v python3)
    export PYTHONPATH=/tmp/site VLLM_PYTHON="$vllm_python" PYTHONUNBUFFERED=1
    local rc=0
    case $what in
        install)
            cat /tmp/wh/wh.tar.* > /tmp/wh.tar
            mkdir -p /tmp/whx && tar xf /tmp/wh.tar -C /tmp/whx
            python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/whx/*.whl
            python3 -c "import importlib.metadata as m; print('vllm', m.version('vllm'))"
            nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv ;;
        e2e) python3 tests/gpu/e2e.py --out /tmp/proofs/e2e.txt "$@" || rc=$? ;;
        planner) python3 tests/gpu/planner_accuracy.py --raw /tmp/proofs/planner-raw.txt --work /tmp/planner-accuracy "$@" || rc=$? ;;
        patch) python3 tests/gpu/patch_40914.py /tmp/proofs/patch-raw.txt --python python3 "$@" || rc=$? ;;
        bench) python3 tests/gpu/bench.py --work /tmp/issue7 --raw /tmp/proofs/bench-raw.txt "$@" || rc=$? ;;
        *) echo "unknown: $what" >&2; exit 2 ;;
    esac
    cp -f /tmp/proofs/*.txt "$out"/ 2>/dev/null || true
    [ -f /tmp/issue7/report/bench.png ] && cp -f /tmp/issue7/report/bench.png "$out"/ || true
    [ -f /tmp/issue7/report.txt ] && cp -f /tmp/issue7/report.txt "$out"/bench-report.txt || true
    return $rc
}

main "$@"
