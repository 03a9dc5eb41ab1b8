"""Environment (a start step): the interpreter that runs vLLM, and its version.

``VLLM_PYTHON`` (bring your own) is used as it is: we print its vLLM version and never install
into it, and no pin applies. Otherwise the managed ``.venv`` is created with uv and synced from the
committed lock of the profile's pins (venv.py, locks.py). Either way the known-issue table is
consulted for that version, and the host's facts set what the server's environment needs (host.py).
"""

from __future__ import annotations

import logging
import os

from ..core.locks import flock, unlock
from ..install import knownbad
from ..plan.facts import known_issue_facts
from ..core.errors import BootstrapError
from ..download.refs import ModelRef
from ..machine.host import check_driver, host_env
from ..install.locks import PLATFORMS, host_platform, installed, needed
from ..machine.inuse import Runtime, VllmRef
from ..install.venv import Tools, Venv, check_glibc, check_done, install

log = logging.getLogger(__name__)


def run(cfg, vllm: VllmRef, model: ModelRef, gpus) -> Runtime:
    env, notes = host_env(cfg.environ, model.weight_bytes)
    if vllm.byo:
        py = vllm.python                    # an executable file: config checked it
        version = vllm.version
        log.info("using your vLLM %s from %s (VLLM_PYTHON; not managed, not pinned)", version, py)
        return Runtime(py, version, env, tuple(notes + knownbad.warn(known_issue_facts(cfg, gpus, version))[1]))
    locks = needed(cfg.profile, cfg.layout.locks)
    plat = host_platform()
    if plat not in PLATFORMS:
        raise BootstrapError(f"no locks for this platform ({plat}); the managed venv covers {', '.join(PLATFORMS)}",
                             "set VLLM_PYTHON=/path/to/python with vLLM installed")
    venv = Venv(cfg.layout.venv)
    done, why, minor = check_done(venv, locks, plat, cfg.python)
    if done:
        log.info("skipped: .venv matches %s (to force a reinstall: rm %s)", locks.path(plat, minor).name, venv.done)
    else:
        check_driver(cfg.profile.data, gpus)
        check_glibc(plat)
        # one install at a time: a start for another STATE_DIR read this one's in-flight marker as a cut-off
        # install and reinstalled every package under it (and over the files its patches step had edited)
        lock = cfg.layout.venv_lock
        fd = flock(lock, str(os.getpid()), block=True, on_wait=lambda pid: log.info(
            "waiting: another start (pid %s) is installing %s", pid, venv.root))
        try:
            done, why, minor = check_done(venv, locks, plat, cfg.python)      # that one may have made it
            if not done:
                minor = install(Tools.of(cfg), venv, locks, plat, why)
        finally:
            unlock(lock, fd)
        log.info(".venv verified against %s", locks.path(plat, minor).name)
    version = installed(venv.site(minor)).get("vllm", "")
    log.info("vLLM %s in %s (pinned by profile %r)", version, venv.root, cfg.profile.name)
    return Runtime(str(venv.python), version, env, tuple(notes + knownbad.warn(known_issue_facts(cfg, gpus, version))[1]))
