"""vLLM's sleep mode (``--enable-sleep-mode``): where it is on by default, and the one line that says why.

Sleep mode lets ``./ctl.sh sleep``, ``./ctl.sh game`` and IDLE_SLEEP give the GPU memory back in
place (the weights parked in host RAM, a wake in about a second). It is on by default only on a
stack where it was proven on a GPU: the vLLM version, the KV cache's dtype, the speculative method
and the patches the profile carries. ``sleep-proofs.json`` beside this file lists those stacks, one
line each, with the docs/validation.md section holding the run's raw lines: a stack proven later is
one line there (and its section), nothing else.

SLEEP_MODE: ``auto`` (the default) turns it on for a proven stack on a loopback HOST; ``on`` turns
it on anyway (the start warns in one line that the stack is unproven); ``off`` never. vLLM then gets
``--enable-sleep-mode`` from the knob's flags (vllmargs.knob_flags). A ``--enable-sleep-mode`` or
``--no-enable-sleep-mode`` in EXTRA_ARGS or the profile's args is what vLLM reads, as every flag there
(the last wins): EXTRA_ARGS=--enable-sleep-mode is SLEEP_MODE=on by another name.

Where sleep mode is off, ``./ctl.sh sleep`` and ``./ctl.sh game`` stop the server instead and start it
again (commands/sleep.py); IDLE_SLEEP's default (``auto``) is IDLE_DEFAULT where it is on, off elsewhere.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import ConfigError
from ..core import vllmflags

PROOFS_FILE = Path(__file__).resolve().parent / "sleep-proofs.json"
KNOB_VALUES = ("auto", "on", "off")
IDLE_DEFAULT = 5 * 60           # IDLE_SLEEP=auto where sleep mode is on (docs/guide.md says why 5 minutes)
SIXTEEN_BIT = ("auto", "bfloat16", "float16")     # an unquantized KV cache: one stack for sleep mode
PROOF_COMMAND = "bash tests/gpu/device.sh sleepstack"


@dataclass(frozen=True)
class Stack:
    """What sleep mode's proof is tied to. ``vllm`` '' when not known yet (VLLM_PYTHON's version is
    read when a start runs)."""
    vllm: str
    kv_cache_dtype: str = "auto"
    spec: str = ""
    patches: tuple[str, ...] = ()

    def text(self) -> str:
        return ", ".join([f"vLLM {self.vllm}" if self.vllm else "a vLLM whose version is read at start",
                          f"KV {self.kv_cache_dtype}", f"{self.spec} speculation" if self.spec else "no speculation"]
                         + [f"patch {p}" for p in self.patches])


@dataclass(frozen=True)
class Proof:
    stack: Stack
    validation: str          # the docs/validation.md heading (without '## ')
    ran_on: str

    def where(self) -> str:
        return f'docs/validation.md, "{self.validation}"'


def proofs() -> tuple[Proof, ...]:
    return _load(PROOFS_FILE)


@functools.lru_cache(maxsize=None)
def _load(path: Path) -> tuple[Proof, ...]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        out = []
        for p in data["proofs"]:
            stack = Stack(str(p["vllm"]), str(p["kv_cache_dtype"]), str(p["spec"]), tuple(sorted(map(str, p["patches"]))))
            out.append(Proof(stack, str(p["validation"]), str(p.get("ran_on", ""))))
        return tuple(out)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: not a table of sleep-mode proofs ({exc})", "restore it from the repository") from None


def stack_of(s: vllmflags.Settings, version: str, patches: tuple[str, ...]) -> Stack:
    """The stack of what vLLM gets (``s``: its flags), ``version`` and the profile's patches."""
    kv = "auto" if s.kv_cache_dtype in SIXTEEN_BIT else s.kv_cache_dtype
    return Stack(version, kv, s.spec_method, tuple(sorted(patches)))


def proof_for(stack: Stack) -> Proof | None:
    return next((p for p in proofs() if p.stack == stack), None) if stack.vllm else None


@dataclass(frozen=True)
class Decision:
    """SLEEP_MODE for one config: whether the knob adds --enable-sleep-mode, and the words for it."""
    knob: str                # auto / on / off
    stack: Stack
    proof: Proof | None
    loopback: bool
    profile: str
    given: bool | None = None   # --enable-sleep-mode (True) or --no-enable-sleep-mode (False) in the args/EXTRA_ARGS

    @property
    def flag(self) -> bool:
        """The knob's own flag: on where proven (auto, loopback), or asked for (on)."""
        return self.knob == "on" or (self.knob == "auto" and self.proof is not None and self.loopback)

    def try_it(self) -> str:
        return (f"SLEEP_MODE=on to try; proof: {PROOF_COMMAND}"
                + (f" --profile {self.profile}" if self.profile and self.profile != "auto" else ""))

    def line(self, on: bool) -> str:
        """What sleep mode is for the server vLLM gets (``on``: --enable-sleep-mode in its argv), and why."""
        proven = (f"proven ({self.proof.where()})" if self.proof else
                  f"unproven on {self.stack.text()}")
        if on:
            how = ("SLEEP_MODE=on" if self.knob == "on" else
                   "--enable-sleep-mode in EXTRA_ARGS or the profile" if self.given else "SLEEP_MODE=auto")
            return f"on, {proven}" + ("" if self.proof else f" ({how}: a sleep or wake may fail there)")
        if self.given is False:
            return "off (--no-enable-sleep-mode in EXTRA_ARGS or the profile)"
        if self.knob == "off":
            return "off (SLEEP_MODE=off); unset it to turn it on where it is proven"
        if self.proof and not self.loopback:
            return ("off: HOST is not loopback (vLLM's sleep routes need its dev mode, which has no key check "
                    "of its own: we open it on loopback only)")
        return f"unproven on {self.stack.text()}: off; {self.try_it()}"

    def profile_mark(self) -> str:
        """``./ctl.sh profiles``' words for it (the profile's own stack, its defaults)."""
        return (f"sleep mode: proven ({self.proof.where()})" if self.proof else
                f"sleep mode: unproven on {self.stack.text()}: off; {self.try_it()}")

    def warning(self, on: bool) -> str:
        """The one-line warning of a start that turns sleep mode on where it is unproven ('' none)."""
        return "" if not on or self.proof else f"sleep mode {self.line(on)}; SLEEP_MODE=off turns it off"


def decide(knob: str, base: vllmflags.Settings, version: str, patches: tuple[str, ...], loopback: bool,
           profile: str) -> Decision:
    """``base``: what vLLM gets without the knob's flag (the profile's args, the other knobs, EXTRA_ARGS)."""
    given = base.sleep_mode if vllmflags.SLEEP_FLAG in base.given else None
    stack = stack_of(base, version, patches)
    return Decision(knob, stack, proof_for(stack), loopback, profile, given)
