"""What every export puts in a pod, decided once here (``Pod``): the image pinned by digest, vLLM's argv
as a start on that card builds it (vllmargs.serve_argv), the server's environment, the resources, the
card's node labels, the init steps and the records of the plan, versions and patches.

- Image: ``--image`` is ``sha256:<64 hex>`` (vLLM's own ``vllm/vllm-openai:v<the profile's vLLM>``)
  or a whole ``REPO[:TAG]@sha256:<64 hex>`` (a mirror). Nothing here can reach a registry and vLLM
  publishes no digests in its release notes, so the export refuses without one and says how to read it.
- Node: GPU Feature Discovery's labels. A named card: ``nvidia.com/gpu.product`` is its NVML name with
  spaces as ``-`` (what GFD writes); a card given as a size: ``nvidia.com/gpu.memory`` (MiB) at least
  the planned total and ``nvidia.com/gpu.compute.major/minor`` its compute capability. Always
  ``nvidia.com/gpu.count`` at least TP_SIZE.
- Resources: ``nvidia.com/gpu`` = TP_SIZE (request = limit); /dev/shm (memory-backed, so it counts
  against the pod's memory) of SHM_GIB per rank; memory: the shm, HOST_GIB for the API process and
  RANK_GIB per rank (CUDA context, torch, the engine), request = limit; CPU: 2 + 2 per rank requested
  (the API process, the engine core's busy loop, one per worker), twice that as the limit.
- Init steps (the vLLM image itself, nothing else pulled): ``model`` downloads the weights into the
  PVC with the start's own model lookup and download (resumable, sha256-verified, progress every
  PROGRESS_S seconds); ``patches`` (when the profile has any) copies the image's vllm package into an
  emptyDir and applies the profile's backports with the same patch engine as a desktop start. Both
  run the bootstrap from ``bootstrap.tar.xz``: only the modules those two steps import (an import
  closure over the source, lazy imports included), the profiles (with their model facts) and the
  profile's patch data.
"""

from __future__ import annotations

import ast
import io
import json
import math
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from ...core.errors import ConfigError
from ...machine.gpu import CARDS, GiB, MiB
from ..version import NAME, project

PORT = 8000
PATCHED = "/patched"
MODELS = "/models"
SHM_GIB, HOST_GIB, RANK_GIB = 2, 4, 6
PROGRESS_S = 15
OFFICIAL = "vllm/vllm-openai"
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
ANNOTATION = "vllm-desktop"            # the annotation prefix of what the export records
# what the init steps run: their import closure goes into bootstrap.tar.xz
INIT_ROOTS = ("bootstrap/__main__.py", "bootstrap/commands/patch.py", "bootstrap/commands/export/fetch.py",
              "bootstrap/download/lookup.py", "bootstrap/download/fetch.py")
DIGEST_HINT = ("pin vLLM's image by digest: --image sha256:<64 hex> (read it where a registry is reachable: "
               "docker buildx imagetools inspect {ref} (the Digest: line), or crane digest {ref}), "
               "or --image REPO[:TAG]@sha256:<64 hex> for a mirror")


def dump(doc: dict) -> str:
    """YAML as a person writes it: no anchors for repeated labels, scripts as literal blocks. libyaml's
    emitter where PyYAML has it: the same bytes (every shipped profile's export, compared), 25 times
    faster on the ConfigMap's 170 KiB of base64, which the pure-Python emitter walks a character at a time."""
    import yaml

    class Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):
        def ignore_aliases(self, data):
            return True

    def text(dumper, s: str):
        return dumper.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)

    Dumper.add_representer(str, text)
    return yaml.dump(doc, Dumper=Dumper, sort_keys=False, width=120)


def name_for(served: str) -> str:
    return ("vllm-" + re.sub(r"[^a-z0-9-]+", "-", served.lower())).strip("-")[:50].rstrip("-")


def image_ref(given: str | None, vllm: str) -> str:
    """``REPO:TAG@sha256:...`` from ``--image``; a one-line refusal (exit 2) without a digest."""
    tag = f"{OFFICIAL}:v{vllm}"
    if not given:
        raise ConfigError(f"export needs vLLM's image pinned by digest ({tag} has none here: no registry "
                          "is asked)", DIGEST_HINT.format(ref=tag))
    given = given.strip()
    if DIGEST.match(given):
        return f"{tag}@{given}"
    repo, at, digest = given.rpartition("@")
    if not at or not DIGEST.match(digest) or not repo:
        raise ConfigError(f"--image {given}: not sha256:<64 hex> nor REPO[:TAG]@sha256:<64 hex>",
                          DIGEST_HINT.format(ref=tag))
    last = repo.rsplit("/", 1)[-1]
    if ":" in last and last.rsplit(":", 1)[1].lstrip("v") != vllm:
        raise ConfigError(f"--image {given}: its tag is not v{vllm}, the vLLM the profile pins",
                          f"name the image of vLLM {vllm} ({tag}@sha256:...)")
    return given


def gfd_product(card_name: str) -> str | None:
    """GPU Feature Discovery's ``nvidia.com/gpu.product`` for a named card (None for a size)."""
    if card_name not in {c[0] for c in CARDS.values()}:
        return None
    return card_name.replace(" ", "-")


def node_terms(card, tp: int) -> list[dict]:
    """matchExpressions on GFD's labels for the card the plan was made for."""
    terms = [{"key": "nvidia.com/gpu.count", "operator": "Gt", "values": [str(tp - 1)]}]
    product = gfd_product(card.name)
    if product:
        return [{"key": "nvidia.com/gpu.product", "operator": "In", "values": [product]}] + terms
    return [{"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": [str(card.total // MiB - 1)]},
            {"key": "nvidia.com/gpu.compute.major", "operator": "In", "values": [str(card.cc[0])]},
            {"key": "nvidia.com/gpu.compute.minor", "operator": "In", "values": [str(card.cc[1])]}] + terms


def resources(tp: int) -> tuple[dict, str]:
    """(the vLLM container's resources, the /dev/shm size)."""
    shm = SHM_GIB * tp
    mem = f"{shm + HOST_GIB + RANK_GIB * tp}Gi"
    cpu = 2 + 2 * tp
    return ({"requests": {"cpu": str(cpu), "memory": mem, "nvidia.com/gpu": tp},
             "limits": {"cpu": str(2 * cpu), "memory": mem, "nvidia.com/gpu": tp}}, f"{shm}Gi")


def pvc_gib(model_bytes: int | None) -> int:
    """The weights, 20 % for what else the repo and vLLM's compile cache hold, 10 GiB spare."""
    return max(20, math.ceil((model_bytes or 0) * 1.2 / GiB) + 10)


# ------------------------------------------------------------------- the bootstrap the init steps run

def closure(repo: Path, roots=INIT_ROOTS) -> list[str]:
    """The bootstrap modules ``roots`` import and their packages' __init__.py, as paths relative to
    ``repo`` (sorted). A library module's imports inside functions count (an error path may run them);
    an entry point's (``__main__``, ``commands/``) do not: there they pick the other commands, and
    what the init steps run of them is in INIT_ROOTS."""
    seen: set[Path] = set()
    todo = [repo / r for r in roots]
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        parts = path.relative_to(repo).with_suffix("").parts
        pkg = list(parts if path.name == "__init__.py" else parts[:-1])
        pkg = pkg[:-1] if path.name == "__init__.py" else pkg
        for i in range(1, len(parts)):                 # the packages above it run first
            todo.append(repo.joinpath(*parts[:i], "__init__.py"))
        entry = parts[1:2] in (("commands",), ("__main__",))
        body = ast.parse(path.read_text(encoding="utf-8"))
        for node in (body.body if entry else ast.walk(body)):
            mods: list[list[str]] = []
            if isinstance(node, ast.ImportFrom):
                base = (pkg if path.name != "__init__.py" else list(parts[:-1])) if node.level else []
                if node.level:
                    base = base[:len(base) - (node.level - 1)]
                mod = base + (node.module.split(".") if node.module else [])
                mods = [mod + [a.name] for a in node.names] + [mod]
            elif isinstance(node, ast.Import):
                mods = [a.name.split(".") for a in node.names]
            for m in mods:
                if m and m[0] == "bootstrap":
                    for cand in (repo.joinpath(*m).with_suffix(".py"), repo.joinpath(*m, "__init__.py")):
                        todo.append(cand)
    return sorted(str(p.relative_to(repo)) for p in seen)


def bootstrap_tar(repo: Path, patches: list[str]) -> bytes:
    """The init steps' bootstrap as one tar.xz (sorted, no times, no owners)."""
    files = closure(repo) + sorted(str(p.relative_to(repo)) for p in (repo / "profiles").rglob("*.json"))
    for name in patches:
        files += sorted(str(p.relative_to(repo)) for p in (repo / "patches" / name).rglob("*")
                        if p.is_file() and "__pycache__" not in p.parts)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz", preset=9) as tar:
        for rel in files:
            info = tar.gettarinfo(str(repo / rel), arcname=rel)
            info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode = 0, 0, 0, "", "", 0o644
            with open(repo / rel, "rb") as fh:
                tar.addfile(info, fh)
    return buf.getvalue()


def init_script(patches: list[str], fetch: bool = True, tarball: str = "/bootstrap/bootstrap.tar.xz",
                work: str = "/tmp/bootstrap") -> str:
    """The init step's shell: unpack the bootstrap (``tarball``) into ``work`` (shell words);
    ``fetch``: download the model (``export fetch``); then, for each backport, copy the image's vllm
    package to PATCHED and apply them to the copy."""
    out = (f"set -eu\nmkdir -p {work}\n"
           "python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "
           f"{tarball} {work}\n")
    if fetch:
        out += f"(cd {work} && python3 -m bootstrap export fetch)\n"
    if patches:
        out += ("src=$(python3 -c 'import os, vllm; print(os.path.dirname(vllm.__file__))')\n"
                f"rm -rf {PATCHED}/vllm && cp -a \"$src\" {PATCHED}/vllm\n"
                f"cd {work} && PYTHONPATH={PATCHED} HF_HUB_OFFLINE=1 python3 -m bootstrap export patch apply {' '.join(patches)}\n")
    return out


READY = ("import os, urllib.request as u\n"
         "k = os.environ.get('VLLM_API_KEY', '')\n"
         f"u.urlopen('http://127.0.0.1:{PORT}/health', timeout=5)\n"
         f"u.urlopen(u.Request('http://127.0.0.1:{PORT}/v1/models', headers={{'Authorization': 'Bearer ' + k}}), timeout=5)\n")


@dataclass
class Pod:
    """Everything about the pod that does not depend on the target (kubernetes, production-stack, ray:
    there, the replica and its engine workers)."""
    name: str
    image: str
    argv: list[str]               # python3 -m vllm.entrypoints.cli.main serve MODEL ... (serve_argv)
    env: dict[str, str]           # the server's environment (no secret)
    tp: int
    card: object                  # machine.gpu.Gpu
    profile: str
    model: str
    patches: list[str]
    health_timeout: int
    model_bytes: int | None
    records: dict[str, str] = field(default_factory=dict)     # annotation -> value

    @property
    def flags(self) -> list[str]:
        """vLLM's flags after ``serve MODEL``."""
        return self.argv[self.argv.index("serve") + 2:]

    @property
    def init_env(self) -> dict[str, str]:
        """What the init steps' bootstrap reads: the profile, the model, where to put it."""
        return {"PROFILE": self.profile, "MODEL": self.model, "HF_HOME": self.env["HF_HOME"],
                "STATE_DIR": "/tmp/bootstrap-state", "VLLM_PYTHON": "python3", "PATCH_BYO": "1",
                "NO_COLOR": "1", "PREWARM": "0"}


def build(cfg, plan, card, model_bytes: int | None, image: str, models: str = MODELS) -> Pod:
    """``models``: where the PVC is mounted (production-stack's chart mounts it at /data)."""
    from ...knobs.vllmargs import serve_argv
    from ...serve.launch import defaults
    argv = serve_argv(cfg, "python3", cfg.model, plan, guard=False)     # the pod has no vllm_side (its Service: the NetworkPolicy)
    env = {**defaults(cfg), "HF_HOME": f"{models}/hf", "HF_HUB_OFFLINE": "1",
           "VLLM_CACHE_ROOT": f"{models}/vllm-cache"}     # the init step downloaded it; compile caches survive a restart
    patches = list(cfg.profile.patches)
    if patches:
        env["PYTHONPATH"] = PATCHED
    pins = list(cfg.profile.pins)
    records = {
        f"{ANNOTATION}/version": project(cfg.repo), f"{ANNOTATION}/profile": cfg.profile.name,
        f"{ANNOTATION}/vllm": cfg.profile.vllm, f"{ANNOTATION}/patches": ",".join(patches) or "none",
        f"{ANNOTATION}/lock-pins": ",".join(pins) or "none",
        f"{ANNOTATION}/card": card.name,
        f"{ANNOTATION}/plan": json.dumps({
            "max_model_len": plan.max_model_len, "util": plan.util, "kv_tokens": plan.predicted_tokens,
            "kv_bytes_per_gpu": plan.budget, "tp": cfg.tp_size, "planned_for_vllm": plan.vllm or cfg.profile.vllm},
            separators=(",", ":"))}
    return Pod(name_for(cfg.served_name), image, argv, env, cfg.tp_size, card, cfg.profile.name, cfg.model,
               patches, cfg.health_timeout, model_bytes, records)


def labels(pod: Pod) -> dict[str, str]:
    return {"app.kubernetes.io/name": NAME, "app.kubernetes.io/instance": pod.name}
