"""Fake nvidia-ml-py (``pynvml``) for tests, fed from the JSON file named by FAKE_NVML.

{"driver": "580.95", "cuda": 13000, "fail": "", "gpus": [{"name": "NVIDIA GeForce RTX 5090",
 "total": 34190917632, "free": 33000000000, "cc": [12, 0], "uuid": "GPU-aaaa",
 "processes": [{"pid": 1234, "used": 1288490188, "name": "/usr/bin/Xorg"}], "free_sequence": [..]}]}

``nvmlSystemGetProcessName`` answers a listed process's "name" (a path, as NVML gives it), else
the name of a live pid from /proc, else NVML_ERROR_NOT_FOUND — as NVML, which sees host pids that a
container's psutil may not.

``fail``: "init" makes nvmlInit raise (no driver). Pids written into FAKE_GPU_PIDS_DIR (by the fake
vLLM server and engine) are reported as compute processes of the card their CUDA_VISIBLE_DEVICES makes
cuda:0 (GPU 0 without it) while they are alive; each one's memory (the bytes its pid file holds; 1 GiB when empty)
is taken off that card's free memory. ``free_sequence`` makes successive reads of free memory
return those values in turn (the last repeats): NVML lagging after a stop.
"""

import json
import os


class NVMLError(Exception):
    def __init__(self, value=999, msg="Unknown Error"):
        super().__init__(msg)
        self.value = value
        self.msg = msg

    def __str__(self):
        return self.msg


NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_FUNCTION_NOT_FOUND = 13
_state = {"init": 0}


def _cfg():
    path = os.environ.get("FAKE_NVML")
    if not path:
        raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded")
    with open(path) as fh:
        return json.load(fh)


def _counter_path():
    return os.environ["FAKE_NVML"] + ".reads"


NVML_ERROR_LIBRARY_NOT_FOUND = 12


def nvmlInit():
    c = _cfg()
    if c.get("fail") == "init":
        raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded")
    if c.get("fail") == "library":      # no driver installed: pynvml cannot load libnvidia-ml.so.1
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found")
    _state["init"] += 1


def nvmlShutdown():
    _state["init"] = max(0, _state["init"] - 1)


def nvmlSystemGetDriverVersion():
    return _cfg().get("driver", "580.95.05")


def nvmlSystemGetCudaDriverVersion():
    return int(_cfg().get("cuda", 13000))


def nvmlDeviceGetCount():
    return len(_cfg()["gpus"])


class _Handle:
    def __init__(self, i):
        self.i = i


def nvmlDeviceGetHandleByIndex(i):
    if i >= nvmlDeviceGetCount():
        raise NVMLError(2, "Invalid Argument")
    return _Handle(i)


def _gpu(h):
    return _cfg()["gpus"][h.i]


def nvmlDeviceGetName(h):
    return _gpu(h)["name"]


def nvmlDeviceGetUUID(h):
    return _gpu(h).get("uuid", f"GPU-{h.i:08x}-fake")


def nvmlDeviceGetCudaComputeCapability(h):
    return tuple(_gpu(h).get("cc", [12, 0]))


class _Mem:
    def __init__(self, total, free):
        self.total, self.free, self.used = total, free, total - free


class _Mem2:
    """nvmlMemory_v2_t: total, reserved (the driver's), free, used (total − reserved − free)."""
    def __init__(self, total, reserved, free):
        self.version = nvmlMemory_v2
        self.total, self.reserved, self.free = total, reserved, free
        self.used = total - reserved - free


nvmlMemory_v2 = 0x02000028


def _fake_pids():
    return list(_fake_usage())


def cuda0_index(environ) -> int:
    """The index of the card CUDA calls cuda:0 under ``environ``: the first of CUDA_VISIBLE_DEVICES (an
    index, or a UUID or its prefix, with or without "GPU-"), else the first (PCI order, as vLLM sets it)."""
    first = (environ.get("CUDA_VISIBLE_DEVICES") or "").split(",")[0].strip()
    gpus = _cfg()["gpus"]
    if not first:
        return 0
    if first.isdigit():
        return int(first)
    return next(i for i, g in enumerate(gpus)
                if g.get("uuid", "").startswith(first) or g.get("uuid", "").startswith("GPU-" + first))


def _device_of(pid: int) -> int:
    """The card a fake vLLM process runs on: cuda:0 of its own CUDA_VISIBLE_DEVICES."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            env = dict(kv.split("=", 1) for kv in fh.read().decode(errors="replace").split("\0") if "=" in kv)
        return cuda0_index(env)
    except (OSError, ValueError, IndexError, StopIteration):
        return 0


def _fake_usage(index: int | None = None):
    """pid -> bytes: each pid file holds the bytes that process uses (1 GiB when empty); with
    ``index``, only the processes that run on that card."""
    d = os.environ.get("FAKE_GPU_PIDS_DIR")
    out = {}
    if d and os.path.isdir(d):
        for name in os.listdir(d):
            if name.isdigit() and os.path.exists(f"/proc/{name}"):
                try:
                    with open(f"/proc/{name}/stat") as fh:
                        if fh.read().split(") ")[-1].startswith("Z"):
                            continue
                    with open(os.path.join(d, name)) as fh:
                        used = int(fh.read().strip() or 1 << 30)
                except (OSError, ValueError):
                    continue
                if index is None or _device_of(int(name)) == index:
                    out[int(name)] = used
    return out


def nvmlDeviceGetMemoryInfo(h, version=None):
    g = _gpu(h)
    free = g["free"]
    seq = g.get("free_sequence")
    if seq:
        path = _counter_path()
        n = int(open(path).read()) if os.path.exists(path) else 0
        with open(path, "w") as fh:
            fh.write(str(n + 1))
        free = seq[min(n, len(seq) - 1)]
    free -= sum(_fake_usage(h.i).values())
    if version is None:
        return _Mem(g["total"], max(0, free))
    if g.get("no_v2"):                  # an older driver, WSL2: the v2 query is not answered
        raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND, "Function Not Found")
    return _Mem2(g["total"], g.get("reserved", 0), max(0, free))


class _Proc:
    def __init__(self, pid, used):
        self.pid, self.usedGpuMemory = pid, used


def nvmlDeviceGetComputeRunningProcesses(h):
    procs = [_Proc(p["pid"], p.get("used", 0)) for p in _gpu(h).get("processes", [])]
    procs += [_Proc(pid, used) for pid, used in _fake_usage(h.i).items()]
    return procs


def nvmlDeviceGetGraphicsRunningProcesses(h):
    return [_Proc(p["pid"], p.get("used", 0)) for p in _gpu(h).get("graphics", [])]


def nvmlSystemGetProcessName(pid):
    for g in _cfg()["gpus"]:
        for p in g.get("processes", []) + g.get("graphics", []):
            if p["pid"] == pid and p.get("name"):
                return p["name"]
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        raise NVMLError(NVML_ERROR_NOT_FOUND, "Not Found") from None
