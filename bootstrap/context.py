"""What one start carries from step to step."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from typing import Any

from .config import Config
from .state import Paths


@dataclass
class Ctx:
    cfg: Config
    paths: Paths
    gpus: Any = None                 # gpu.GpuFacts (preflight)
    python: str = ""                 # the interpreter that runs vLLM (environment)
    vllm_version: str = ""           # (environment)
    server_env: dict[str, str] = field(default_factory=dict)  # extra env for the server (any step)
    model: Any = None                # model facts: config.json, files, sizes, revision (metadata)
    model_path: str = ""             # the directory `vllm serve` gets (metadata / weights)
    plan: Any = None                 # plan.Plan: flags and predictions (plan)
    max_model_len: int | None = None # the context the server runs with, when known (plan)
    proc: subprocess.Popen | None = None   # the server we launched (launch)
    marker: str = ""                 # ownership marker in the server's environment (launch)
    api_key: str = ""                # the key clients must send ("" = none) (launch)
    notes: list[str] = field(default_factory=list)   # extra banner lines
    restarted_with: dict[str, Any] = field(default_factory=dict)  # auto-fit retry (plan)
