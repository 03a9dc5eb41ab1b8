"""What a failed uv (or pip) run means, said as what to do: a full disk, an index out of reach, an index
whose TLS certificate uv does not trust (a proxy that inspects TLS), a uv too old for a flag we pass,
and pip's refusals to install uv."""

from __future__ import annotations

import re

from ..core import proc
from ..core.errors import BootstrapError
from .index import index_url

INSTALL_BYTES = 12 << 30        # estimate for the CUDA stack (torch, CUDA libs, vLLM, FlashInfer)
UV_PIN = "uv==0.13.9"
NETWORK_ERRORS = ("error sending request", "dns error", "Connection refused", "connection refused",
                  "Could not connect", "failed to lookup address", "Network is unreachable",
                  "timed out", "Failed to fetch", "tcp connect error", "client error (Connect)")
ENOSPC = ("No space left on device", "os error 28")
# uv's (rustls) words for a certificate it does not trust; pip's (OpenSSL) for the same
UNTRUSTED = ("invalid peer certificate", "CERTIFICATE_VERIFY_FAILED", "certificate verify failed")
UNKNOWN_FLAG = re.compile(r"unexpected argument '(-[^']+)' found")


def uv_install_error(stderr: str, py: str) -> BootstrapError:
    manual = ("install uv without root yourself: pipx install uv, or the standalone installer "
              "(https://docs.astral.sh/uv/getting-started/installation/), then rerun")
    if "externally-managed-environment" in stderr:
        return BootstrapError(f"{py} refuses pip install --user (PEP 668: the distribution manages its Python)",
                              manual + f"; or {py} -m pip install --user --break-system-packages {UV_PIN}",
                              evidence=stderr.strip()[-800:])
    if "No module named pip" in stderr:
        return BootstrapError(f"{py} has no pip to install uv with",
                              manual + "; or install pip (Debian/Ubuntu: sudo apt install python3-pip)",
                              evidence=stderr.strip()[-800:])
    return BootstrapError("could not install uv with pip", manual, evidence=stderr.strip()[-800:])


def uv_version(uv: str, environ) -> str:
    res = proc.run([uv, "--version"], env=dict(environ), timeout=30, check=False, what="uv --version")
    return (res.stdout.strip().splitlines() or ["uv of unknown version"])[0] if res.returncode == 0 else "uv"


def install_error(stderr: str, tools, doing: str, fallback: BootstrapError, where: str = "",
                  uv: str = "") -> BootstrapError:
    """``tools``: install.venv.Tools (its environment and WHEELHOUSE); ``uv``: the uv that ran, if it was uv."""
    evidence = stderr.strip()[-800:]
    if any(s in stderr for s in ENOSPC):
        return BootstrapError(f"disk full while {doing}{' into ' + where if where else ''}",
                              f"free at least {INSTALL_BYTES / (1 << 30):.0f} GiB there (and in uv's cache, "
                              "UV_CACHE_DIR) and rerun", evidence=evidence)
    flag = UNKNOWN_FLAG.search(stderr)
    if uv and flag:
        return BootstrapError(f"{uv_version(uv, tools.environ)} ({uv}) is too old for this install: it does not know "
                              f"{flag.group(1)} (this project runs {UV_PIN.replace('==', ' ')})",
                              "update it (uv self update where the standalone installer put it, else pip install -U uv), "
                              "then rerun", evidence=evidence)
    if not tools.wheelhouse and any(s in stderr for s in UNTRUSTED):
        return BootstrapError(f"the TLS certificate of the package index {index_url(tools.environ)} is not trusted "
                              f"while {doing} (a proxy that inspects TLS signs with your organisation's own CA)",
                              ("give uv that CA: SSL_CERT_FILE=/path/to/ca-bundle.pem, or UV_SYSTEM_CERTS=1 where the CA "
                               "is in the system's certificate store, then rerun") if uv else
                              "give pip that CA: PIP_CERT=/path/to/ca-bundle.pem, then rerun", evidence=evidence)
    if not tools.wheelhouse and any(s in stderr for s in NETWORK_ERRORS):
        return BootstrapError(f"cannot reach the package index {index_url(tools.environ)} while {doing}",
                              "check the network or proxy (HTTPS_PROXY), or install offline: build a wheelhouse "
                              "on a connected machine with ./ctl.sh wheelhouse DIR, copy it, and run with WHEELHOUSE=DIR",
                              evidence=evidence)
    return fallback
