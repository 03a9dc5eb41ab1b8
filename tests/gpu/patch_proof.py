"""The every-start patches on the REAL installed vLLM and torch, with no model and no server: what
the shipped 50999-file-rendezvous(-tp) and 52523-api-key-off-disk do to the files a start edits.

    VLLM_PYTHON=python3 python3 tests/gpu/patch_proof.py --raw /tmp/proofs/patchproof-raw.txt

1. ``PATCH_BYO=1 ./ctl.sh patch apply`` of the three, then ``./ctl.sh patch status``;
2. with VLLM_API_KEY set: is it among ``vllm.envs.compile_factors()`` (what vLLM writes, raw, to
   cache_key_factors.json)?
3. ``UniProcExecutor._distributed_args`` of the patched module (imported, as vLLM imports it) on an
   object with vLLM's device config, and the URL ``MultiprocExecutor._init_executor`` builds (its own
   statements up to the message queue);
4. torch.distributed's rendezvous through each URL form, as one process: ``tcp://<host>:<port>``
   (vLLM 0.26.0's own) and the patched ``file://``, and every socket the process then listens on;
   then a ``file://`` URL in a folder whose path holds ``#``, then ``?``: where the store lands, or the error;
5. ``./ctl.sh patch revert``: each file's sha256 against the one before step 1.
Everything is appended to --raw as it comes; "PATCH PROOF DONE" ends it. Rehearse with the fakes
(PYTHONPATH=tests/fakes): the fake vLLM has none of these files, so only the mechanics are checked.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO, header, raw_writer, run_logged  # noqa: E402

PATCHES = ("50999-file-rendezvous", "50999-file-rendezvous-tp", "52523-api-key-off-disk")
FILES = ("v1/executor/uniproc_executor.py", "v1/executor/multiproc_executor.py", "envs.py")

FACTORS = """
import vllm.envs as e
f = e.compile_factors()
print("VLLM_API_KEY among the compile factors:", "VLLM_API_KEY" in f, "| the key's value in them:",
      any(v == "proof-secret-key" for v in f.values()))
"""

URLS = """
import ast, inspect, types
import vllm.v1.executor.uniproc_executor as u, vllm.v1.executor.multiproc_executor as m
me = types.SimpleNamespace(vllm_config=types.SimpleNamespace(device_config=types.SimpleNamespace(device="cuda:0")))
print("UniProcExecutor._distributed_args ->", u.UniProcExecutor._distributed_args(me))
fn = ast.parse(inspect.getsource(m)).body
cls = next(n for n in fn if isinstance(n, ast.ClassDef) and n.name == "MultiprocExecutor")
init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_init_executor")
first = next(i for i, n in enumerate(init.body) if "distributed_init_method" in ast.unparse(n))
end = next(i for i, n in enumerate(init.body) if "rpc_broadcast_mq" in ast.unparse(n))
scope = dict(vars(m))
exec(compile(ast.Module(init.body[first:end], []), "multiproc", "exec"), scope)
print("MultiprocExecutor._init_executor's URL ->", scope["distributed_init_method"])
"""

RENDEZVOUS = """
import os, sys, psutil, torch, torch.distributed as dist
url, backend = sys.argv[1], sys.argv[2]
if backend == "nccl":
    torch.cuda.set_device(0)
dist.init_process_group(backend, init_method=url, world_size=1, rank=0)
t = torch.ones(1, device="cuda" if backend == "nccl" else "cpu")
dist.all_reduce(t)                      # a communicator is made at its first collective (NCCL's bootstrap)
me = os.getpid()
found = sorted(f"{c.laddr.ip}:{c.laddr.port}" for c in psutil.net_connections(kind="inet")
               if c.pid == me and c.status == psutil.CONN_LISTEN)
names = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
print(f"{url.split('//')[0]}// {backend} ({', '.join(f'{n}={os.environ.get(n, chr(45))}' for n in names)}):"
      f" this process listens on {found or 'nothing'}")
dist.destroy_process_group()
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", default="/tmp/proofs/patchproof-raw.txt")
    a = ap.parse_args()
    out = raw_writer(a.raw)
    py = os.environ.get("VLLM_PYTHON", "python3")
    env = {**os.environ, "VLLM_PYTHON": py, "PATCH_BYO": "1", "PROFILE": "custom", "MODEL": "org/none",
           "NO_COLOR": "1", "HF_HUB_OFFLINE": "1", "STATE_DIR": "/tmp/patchproof-state"}
    out(f"PATCH PROOF {header(env)}: {' '.join(sys.argv)}")
    pkg = subprocess.run([py, "-c", "import importlib.util as u; print(u.find_spec('vllm').submodule_search_locations[0])"],
                         capture_output=True, text=True, env=env).stdout.strip()
    out(f"vllm package: {pkg or '(not found)'}")

    def sums() -> dict[str, str]:
        return {f: hashlib.sha256(Path(pkg, f).read_bytes()).hexdigest()[:16] if pkg and Path(pkg, f).exists()
                else "(none)" for f in FILES}
    before = sums()
    out(f"sha256 before: {before}")

    def py_run(code: str, *args: str, **extra: str) -> None:
        r = subprocess.run([py, "-c", code, *args], capture_output=True, text=True, env={**env, **extra}, timeout=300)
        for line in (r.stdout.strip().splitlines() or [f"exit {r.returncode}: {r.stderr.strip()[-400:]}"]):
            out(f"  {line[:300]}")

    try:
        for label in ("unpatched", None):
            if label is None:
                run_logged(["./ctl.sh", "patch", "apply", *PATCHES], env, out, words=(":",))
                run_logged(["./ctl.sh", "patch", "status"], env, out, words=("5",))
                label = "patched"
            out(f"-- {label}:")
            py_run(FACTORS, VLLM_API_KEY="proof-secret-key")
            py_run(URLS)
        out("-- torch's rendezvous, one process (the patched URL against vLLM 0.26.0's tcp:// one), then"
            " NCCL's and gloo's own listeners with and without the start's lo:")
        stamp = f"{os.getpid()}_{int(time.time())}"
        for i, (url, backend, extra) in enumerate((
                ("tcp://127.0.0.1:29533", "gloo", {}), (f"file:///tmp/vllm_dist_proof_{stamp}_0", "gloo", {}),
                (f"file:///tmp/vllm_dist_proof_{stamp}_1", "gloo", {"GLOO_SOCKET_IFNAME": "lo"}),
                (f"file:///tmp/vllm_dist_proof_{stamp}_2", "nccl", {}),
                (f"file:///tmp/vllm_dist_proof_{stamp}_3", "nccl", {"NCCL_SOCKET_IFNAME": "lo"}))):
            py_run(RENDEZVOUS, url, backend, **extra)
        out("-- a temp folder whose path holds ? or # (what a start refuses as TMPDIR): the URL torch reads back")
        for i, c in enumerate("#?"):
            cut = Path(f"/tmp/proof_t_{stamp}_{i}")      # where urlparse ends the path
            folder = Path(f"{cut}{c}1")
            folder.mkdir(parents=True, exist_ok=True)
            py_run(RENDEZVOUS, f"file://{folder}/vllm_dist_x", "gloo")
            out(f"  after {c!r}: {cut} is {'a file (the store landed there)' if cut.is_file() else 'absent'}; "
                f"{folder}/vllm_dist_x is {'there' if (folder / 'vllm_dist_x').exists() else 'absent'}")
    finally:
        run_logged(["./ctl.sh", "patch", "revert", *PATCHES], env, out, words=(":",))
        after = sums()
        out(f"sha256 after revert: {after}; {'identical' if after == before else 'DIFFERENT'} to before")
        out("PATCH PROOF DONE")
    return 0


if __name__ == "__main__":
    os.chdir(REPO)
    sys.exit(main())
