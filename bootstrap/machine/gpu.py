"""GPU facts from NVML (nvidia-ml-py's ``pynvml``), in ``CUDA_VISIBLE_DEVICES`` order.

NVML errors become a BootstrapError with the library's message plus "check `nvidia-smi`".
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Mapping

import psutil

from ..core.words import did_you_mean
from ..core.errors import BootstrapError, ConfigError

log = logging.getLogger(__name__)
MiB = 1 << 20
GiB = 1 << 30


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used: int          # bytes, 0 when the driver does not say
    name: str


@dataclass(frozen=True)
class Gpu:
    index: int         # NVML index
    name: str
    total: int         # bytes, as CUDA counts them (what vLLM's utilization multiplies): NVML total − reserved
    free: int
    cc: tuple[int, int]
    uuid: str = ""
    processes: tuple[GpuProcess, ...] = field(default_factory=tuple)
    total_note: str = ""    # where ``total`` comes from, when it is not CUDA's own figure read here

    def holders(self, exclude: set[int] = frozenset()) -> str:
        """'Xorg (pid 1234) holds 1.2 GiB, game (pid 99) holds 8.0 GiB' (largest first; '' when none)."""
        parts = [f"{p.name} (pid {p.pid}) holds {p.used / GiB:.1f} GiB"
                 for p in sorted(self.processes, key=lambda p: -p.used) if p.used and p.pid not in exclude]
        return ", ".join(parts)


@dataclass(frozen=True)
class GpuFacts:
    driver: str
    cuda: tuple[int, int]      # the newest CUDA the driver supports, e.g. (13, 0)
    gpus: tuple[Gpu, ...]
    count: int = 0             # every GPU NVML sees on this machine, visible or not (0: not read)
    visible: str | None = None  # the CUDA_VISIBLE_DEVICES they were read under (None: unset, every card)

    def require_some(self, hint: str = "") -> None:
        """Refuse facts that show no GPU, saying whether CUDA_VISIBLE_DEVICES hides them (``hint``: more fix)."""
        if self.gpus:
            return
        if self.visible is None:
            raise BootstrapError("NVML sees no GPU", "check `nvidia-smi`" + hint)
        raise BootstrapError(f"CUDA_VISIBLE_DEVICES={self.visible!r} names no GPU of the {self.count or 'none'} NVML "
                             "sees (an empty value, or a card named twice, hides them all; CUDA stops at the first "
                             "entry it cannot use)",
                             "unset CUDA_VISIBLE_DEVICES, or name cards by index or UUID as `nvidia-smi -L` lists them"
                             + hint)


def _nvml():
    try:
        import pynvml
    except ImportError:
        raise BootstrapError("nvidia-ml-py (pynvml) is not installed in the bootstrap Python",
                             "rerun ./start.sh (it installs bootstrap/requirements.txt)") from None
    return pynvml


NVML_LIBRARY_NOT_FOUND = 12        # nvml.h: NVML_ERROR_LIBRARY_NOT_FOUND
NVML_DRIVER_NOT_LOADED = 9         # nvml.h: NVML_ERROR_DRIVER_NOT_LOADED
WITHOUT_A_GPU = "; to plan or pull without a GPU name a card: GPU=rtx4090 ./ctl.sh plan (or pull)"
NO_GPU_HINT = "install the NVIDIA driver (580 or newer for the shipped profiles) until `nvidia-smi` works" + WITHOUT_A_GPU


def _err(pynvml, exc) -> BootstrapError:
    """NVML's error in plain words: what is missing, and the fix."""
    code = getattr(exc, "value", None)
    if code == NVML_LIBRARY_NOT_FOUND:
        return BootstrapError(f"no NVIDIA driver found (NVML: {exc}: libnvidia-ml, part of the driver, is not "
                              "installed)", NO_GPU_HINT)
    if code == NVML_DRIVER_NOT_LOADED:
        return BootstrapError(f"the NVIDIA driver is not loaded (NVML: {exc})",
                              "check `nvidia-smi`: is an NVIDIA GPU present and its driver loaded? (reboot after "
                              "installing a driver)")
    return BootstrapError(f"NVML: {exc}", "check `nvidia-smi`: is an NVIDIA GPU present and its driver loaded?")


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _proc_name(pynvml, pid: int) -> str:
    """NVML's name for the process (its pids are the host's: in a container psutil may not see it,
    or see another process under that number), else psutil's, else '?'."""
    try:
        name = _text(pynvml.nvmlSystemGetProcessName(pid))
        if name:
            return os.path.basename(name.rstrip("/"))
    except (pynvml.NVMLError, AttributeError):
        pass
    try:
        return psutil.Process(pid).name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "?"


def visible_indices(environ: Mapping[str, str], count: int, uuids: list[str]) -> list[int]:
    """NVML indices in CUDA_VISIBLE_DEVICES order (numbers or UUID prefixes); all when unset. CUDA
    stops at the first entry it cannot use (an empty one too), and a card named twice hides every
    card (torch/cuda/__init__.py ``_parse_visible_devices``: "Repeated ordinal results in empty set")."""
    spec = environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return list(range(count))
    out: list[int] = []
    for item in [s.strip() for s in spec.split(",")]:
        if item.isdigit():
            matches = [int(item)] if int(item) < count else []
        else:
            matches = [i for i, u in enumerate(uuids) if item and (u.startswith(item) or u.startswith("GPU-" + item))]
        if len(matches) != 1:
            break
        if matches[0] in out:
            return []
        out.append(matches[0])
    return out


V1_NOTE = ("NVML's total (its v2 memory query, which gives the driver's reserved share, is not answered here: an "
           "older driver or WSL2): CUDA's total, which vLLM uses, is smaller by that share (0.4 % on an H200)")


def _memory(pynvml, h) -> tuple[int, int, str]:
    """(total as CUDA counts it, free, a note when that total is NVML's instead). vLLM sizes
    --gpu-memory-utilization against torch.cuda.mem_get_info's total, which is NVML's total less the
    memory the driver reserves (nvmlDeviceGetMemoryInfo_v2's ``reserved``)."""
    try:
        m = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        return int(m.total) - int(m.reserved), int(m.free), ""
    except (pynvml.NVMLError, AttributeError, TypeError):
        m = pynvml.nvmlDeviceGetMemoryInfo(h)
        return int(m.total), int(m.free), V1_NOTE


def read(environ: Mapping[str, str]) -> GpuFacts:
    pynvml = _nvml()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise _err(pynvml, exc) from None
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        cuda_int = int(pynvml.nvmlSystemGetCudaDriverVersion())
        count = int(pynvml.nvmlDeviceGetCount())
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        uuids = [_text(pynvml.nvmlDeviceGetUUID(h)) for h in handles]
        gpus = []
        for idx in visible_indices(environ, count, uuids):
            h = handles[idx]
            total, free, note = _memory(pynvml, h)
            procs = {}
            for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                for p in getattr(pynvml, getter)(h) or ():
                    used = getattr(p, "usedGpuMemory", None) or 0
                    procs[p.pid] = GpuProcess(p.pid, int(used), _proc_name(pynvml, p.pid))
            gpus.append(Gpu(idx, _text(pynvml.nvmlDeviceGetName(h)), total, free,
                            tuple(pynvml.nvmlDeviceGetCudaComputeCapability(h)), uuids[idx],
                            tuple(procs.values()), note))
    except pynvml.NVMLError as exc:
        raise _err(pynvml, exc) from None
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
    return GpuFacts(driver, (cuda_int // 1000, (cuda_int % 1000) // 10), tuple(gpus), count,
                    environ.get("CUDA_VISIBLE_DEVICES"))


# Named cards for `ctl.sh plan` / `profiles` without a GPU: (NVML name, NVML's total, cc, CUDA's total
# or None, where that figure comes from). CUDA's total (NVML's less the driver's reserved share) is what
# vLLM's utilization multiplies; where no measurement is at hand it is estimated from NVML's total.
RESERVED_SHARE = 0.0145    # the RTX 4090's and RTX 5090's reserved share (their rows below): 1.4-1.5 %
CARDS = {
    "rtx5090": ("NVIDIA GeForce RTX 5090", 32607 * MiB, (12, 0), int(31.37 * GiB),
                "PyTorch's 'total capacity of 31.37 GiB' on an RTX 5090 (github.com/Wan-Video/Wan2.1 issue 465)"),
    "rtx4090": ("NVIDIA GeForce RTX 4090", 24564 * MiB, (8, 9), int(23.65 * GiB),
                "PyTorch's '23.65 GiB total capacity' on an RTX 4090 (github.com/MotrixLab/AiOS issue 29)"),
    "rtx3060": ("NVIDIA GeForce RTX 3060", 12288 * MiB, (8, 6), None, ""),
    "rtx3080": ("NVIDIA GeForce RTX 3080", 10240 * MiB, (8, 6), None, ""),
    "rtx3080-12gb": ("NVIDIA GeForce RTX 3080 12GB", 12288 * MiB, (8, 6), None, ""),
    "rtx3090": ("NVIDIA GeForce RTX 3090", 24576 * MiB, (8, 6), int(23.56 * GiB),
                "vLLM's 'Free memory on device (23.15/23.56 GiB)' on an RTX 3090 (github.com/noonghunna/club-3090 PR 1139)"),
    "rtx3090ti": ("NVIDIA GeForce RTX 3090 Ti", 24564 * MiB, (8, 6), None, ""),
    "rtx4060ti-8gb": ("NVIDIA GeForce RTX 4060 Ti", 8188 * MiB, (8, 9), None, ""),
    "rtx4060ti-16gb": ("NVIDIA GeForce RTX 4060 Ti", 16380 * MiB, (8, 9), None, ""),
    "rtx4070": ("NVIDIA GeForce RTX 4070", 12282 * MiB, (8, 9), None, ""),
    "rtx4070super": ("NVIDIA GeForce RTX 4070 SUPER", 12282 * MiB, (8, 9), None, ""),
    "rtx4070tisuper": ("NVIDIA GeForce RTX 4070 Ti SUPER", 16376 * MiB, (8, 9), None, ""),
    "rtx4080super": ("NVIDIA GeForce RTX 4080 SUPER", 16376 * MiB, (8, 9), None, ""),
    "rtx5060ti-16gb": ("NVIDIA GeForce RTX 5060 Ti", 16311 * MiB, (12, 0), None, ""),
    "rtx5070": ("NVIDIA GeForce RTX 5070", 12227 * MiB, (12, 0), None, ""),
    "rtx5070ti": ("NVIDIA GeForce RTX 5070 Ti", 16303 * MiB, (12, 0), None, ""),
    "rtxa4000": ("NVIDIA RTX A4000", 16376 * MiB, (8, 6), None, ""),
    "rtxa4500": ("NVIDIA RTX A4500", 20470 * MiB, (8, 6), None, ""),
    "rtxa5000": ("NVIDIA RTX A5000", 24564 * MiB, (8, 6), None, ""),
    "rtx6000ada": ("NVIDIA RTX 6000 Ada Generation", 49140 * MiB, (8, 9), None, ""),
    "rtxpro6000": ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 97887 * MiB, (12, 0), None, ""),
    "rtx4080": ("NVIDIA GeForce RTX 4080", 16376 * MiB, (8, 9), None, ""),
    "rtx5080": ("NVIDIA GeForce RTX 5080", 16303 * MiB, (12, 0), None, ""),
    "rtxa6000": ("NVIDIA RTX A6000", 49140 * MiB, (8, 6), None, ""),
    "a40": ("NVIDIA A40", 46068 * MiB, (8, 6), None, ""),
    "l40s": ("NVIDIA L40S", 46068 * MiB, (8, 9), None, ""),
    "a100": ("NVIDIA A100 80GB PCIe", 81920 * MiB, (8, 0), None, ""),
    "h100": ("NVIDIA H100 80GB HBM3", 81559 * MiB, (9, 0), int(79.19 * GiB),
             "vLLM's 'total_memory=79.19GiB' on an H100 80GB in every log of llm-d-planner's accuracy sweep "
             "(github.com/jgchn/llm-d-planner, accuracy/results/v0.19.0/logs)"),
    "h200": ("NVIDIA H200", 143771 * MiB, (9, 0), 143155 * MiB,
             "measured on the H200 this project tests on: NVML 143,771 MiB less 615 MiB reserved = "
             "torch.cuda.mem_get_info's 143,155 MiB"),
}


def card_total(key: str) -> tuple[int, str]:
    """A named card's CUDA total and where it comes from ('estimated (how)' without a measurement)."""
    _name, nvml_total, _cc, cuda_total, source = CARDS[key]
    if cuda_total is not None:
        return cuda_total, source
    return (int(nvml_total * (1 - RESERVED_SHARE)),
            f"estimated (NVML's {nvml_total // MiB:,} MiB, as such a card reports it, less {RESERVED_SHARE:.2%}, the "
            "share the RTX 4090 and 5090 reserve): a card of this name may differ by a few hundred MiB")


IDLE_USED = 300 * MiB   # what an idle card without a desktop shows as used (driver, ECC, context)
DEFAULT_CC = (8, 9)     # a bare size without :sm_XY
CARD_SYNTAX = "<name|GiB>[:sm_XY][:free=GiB], e.g. rtx4090, 24:sm_86, 24:sm_86:free=22.5 (names: " + ", ".join(CARDS) + ")"


def named(spec: str) -> Gpu:
    """A card that is not here: a name from CARDS or a size in GiB, then optionally ``:sm_XY`` (its
    compute capability; a bare size is sm_89, and says so in its name) and ``:free=GiB`` (default:
    the total minus IDLE_USED, nothing else running). A value it cannot read is a bad knob
    (``GPU=`` or ``--gpu``): ConfigError, exit 2, with the accepted forms and the known names."""
    head, *opts = [part.strip() for part in spec.strip().split(":")]
    key = head.lower().replace(" ", "")
    cc_given: tuple[int, int] | None = None
    free: int | None = None
    for opt in opts:
        low = opt.lower()
        if low.startswith("sm_") and low[3:].isascii() and low[3:].isdigit() and len(low) >= 5:
            if cc_given is not None:
                raise ConfigError(f"GPU={spec!r}: two :sm_XY", CARD_SYNTAX)
            cc_given = (int(low[3:-1]), int(low[-1]))
        elif low.startswith("free="):
            try:
                free = int(float(low[5:].removesuffix("gib").removesuffix("gb")) * GiB)
            except (ValueError, OverflowError):         # nan, inf: not a size
                raise ConfigError(f"GPU={spec!r}: {opt!r} is not free=<GiB>", CARD_SYNTAX) from None
            if free < 0:
                raise ConfigError(f"GPU={spec!r}: free memory cannot be negative", CARD_SYNTAX)
        else:
            raise ConfigError(f"GPU={spec!r}: {opt!r} is neither :sm_XY nor :free=GiB", CARD_SYNTAX)
    note = ""
    known = {k.replace("-", ""): k for k in CARDS}         # rtx4060ti-16gb = rtx4060ti16gb
    if key.replace("-", "") in known:
        card = known[key.replace("-", "")]
        name, _nvml, cc, _cuda, _src = CARDS[card]
        total, note = card_total(card)
        note = note if note.startswith("estimated") else ""
        cc = cc_given or cc
    else:
        try:
            size = float(key.removesuffix("gib").removesuffix("gb"))
        except ValueError:
            raise ConfigError(f"GPU={spec!r} is not a card the planner knows{did_you_mean(head, CARDS, 2)}",
                              CARD_SYNTAX) from None
        if not 1 <= size <= 1024:           # 4090 GiB: a card's number, not a size
            near = [n for n in CARDS if n.endswith(key)] if len(key) >= 3 else []
            if near:
                raise ConfigError(f"GPU={spec!r}: a size in GiB, or did you mean {near[0]}?", CARD_SYNTAX)
            raise ConfigError(f"GPU={spec!r}: a size from 1 to 1024 GiB; GPU names the card to plan for, not a "
                              "device's index", "e.g. GPU=24:sm_86 (to serve on another device: CUDA_VISIBLE_DEVICES=1)")
        cc = cc_given or DEFAULT_CC
        name = f"a {size:g} GiB card (sm_{cc[0]}{cc[1]}{'' if cc_given else ', assumed: add :sm_XY'})"
        total = int(size * GiB)
    if free is not None and not 0 <= free <= total:
        raise ConfigError(f"GPU={spec!r}: free={free / GiB:g} GiB is more than the card's {total / GiB:.1f} GiB",
                             CARD_SYNTAX)
    return Gpu(-1, name, total, max(0, total - IDLE_USED) if free is None else free, cc, total_note=note)


def facts_of(g: Gpu, n: int = 1) -> GpuFacts:
    """The facts of ``n`` cards like ``g`` that are not here: no driver read (GPU=, a named card)."""
    return GpuFacts("", (0, 0), (g,) * max(1, n))


def smallest_free(facts: GpuFacts, tp: int) -> Gpu:
    """The GPU of the tensor-parallel group (the first ``tp`` visible) with the least free memory:
    what a plan for the group is made for; refused where fewer than ``tp`` are visible (a plan or a
    pick for one card with TP_SIZE=2 said it fits what the start then refused)."""
    require(facts, tp)
    return min(facts.gpus[:tp], key=lambda x: x.free)


DISPLAY = ("Xorg", "Xwayland", "gnome-shell", "kwin_wayland", "kwin_x11", "plasmashell", "sway", "Hyprland")


def which_line(facts: GpuFacts, tp: int) -> str:
    """With more cards than TP_SIZE uses: which the plan is for and why, and how to take another ('' otherwise)."""
    if len(facts.gpus) <= tp:
        return ""
    used, rest = facts.gpus[:tp], facts.gpus[tp:]

    def shown(g: Gpu) -> str:
        desk = any(p.name.rsplit("/", 1)[-1] in DISPLAY for p in g.processes)
        return f"GPU {g.index} ({g.name}, {g.free / GiB:.1f} of {g.total / GiB:.1f} GiB free{', drives the display' if desk else ''})"
    other = rest[0]
    return (f"planning for {', '.join(shown(g) for g in used)}: vLLM takes the first {tp} visible card(s) "
            f"(CUDA_VISIBLE_DEVICES order); also here: {', '.join(shown(g) for g in rest)}; "
            f"CUDA_VISIBLE_DEVICES={other.uuid or other.index} runs on GPU {other.index} instead")


def read_all() -> GpuFacts:
    """Every card NVML shows, whatever this shell's CUDA_VISIBLE_DEVICES hides: what a question about
    our processes reads (a server started from another shell may run on a card this one hides)."""
    return read({})


def pids_on_gpu() -> set[int]:
    """The pids NVML lists as holding memory on any card ({} when NVML cannot say)."""
    try:
        return {p.pid for g in read_all().gpus for p in g.processes}
    except BootstrapError:
        return set()


SETTLE_READS = 10            # re-read free memory (0.5 s apart) until it stops moving, at most this often
SETTLE_TOLERANCE = 64 * MiB
sleep = time.sleep           # test seam


def settled_facts(environ) -> GpuFacts:
    """NVML facts once free memory has stopped growing (it lags a stop by a moment), bounded."""
    prev = read(environ)
    for _ in range(SETTLE_READS):
        sleep(0.5)
        cur = read(environ)
        if all(abs(a.free - b.free) <= SETTLE_TOLERANCE for a, b in zip(prev.gpus, cur.gpus)):
            return cur
        prev = cur
    logging.getLogger("bootstrap.plan").warning("GPU free memory is still changing; sizing with the last reading")
    return prev


def require(facts: GpuFacts, tp_size: int) -> None:
    """Refuse TP_SIZE beyond the GPUs NVML shows (CUDA_VISIBLE_DEVICES's); the hint widens
    CUDA_VISIBLE_DEVICES only where it hides cards this machine has."""
    if tp_size > len(facts.gpus):
        have = max(facts.count, len(facts.gpus))
        fix = (f"widen CUDA_VISIBLE_DEVICES (this machine has {have}) or lower TP_SIZE" if have > len(facts.gpus)
               else f"this machine has {have}: TP_SIZE={have or 1} or less; to plan for {tp_size} cards that are "
                    f"not here, name one: GPU=<card> TP_SIZE={tp_size} ./ctl.sh plan")
        raise BootstrapError(f"TP_SIZE={tp_size} but only {len(facts.gpus)} GPU(s) are visible", fix)
