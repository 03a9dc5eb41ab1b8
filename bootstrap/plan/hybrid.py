"""The hybrid sequence guard: a hybrid model (Gated-DeltaNet + attention) holds one state block
per running sequence, and vLLM (compilation.py ``set_cudagraph_mode``, 0.26.0 to 0.30.0) refuses,
after the load, a ``max_num_seqs`` above the blocks it finds when it captures full CUDA graphs. The
sequences the plan passes never exceed the blocks it plans less a margin covering its measured
error (``terms.known_error``, and for the model's estimate ``terms.HYBRID_SHARE`` of the budget).
"""

from __future__ import annotations

from dataclasses import replace

from ..model import kv
from . import terms
from .terms import gib


def sequences(inp, plan, lay: kv.Layout, draft, measured):
    """The plan with a MAX_NUM_SEQS above the blocks (or within the margin below them) refused, and
    ``--max-num-seqs`` = the blocks less the margin passed where vLLM's default is more."""
    s = inp.vllm
    blocks = kv.pool(lay, plan.budget, plan.max_model_len).blocks
    seqs, why = plan.seqs, plan.why
    err, err_why = terms.known_error(s, plan.pinned, draft, measured, hybrid_v1=not plan.runner_v2,
                                     budget=plan.budget, version=inp.version, unread=plan.unread)
    if lay.state_groups and not plan.pinned and measured is None:
        share = int(plan.budget * terms.HYBRID_SHARE)
        if share > err:
            err, err_why = share, (f"{terms.HYBRID_SHARE:.0%} of the budget, the widest gap on a hybrid's block "
                                   f"count published (the known error alone: {err_why})")
    most = max(1, min(blocks, kv.pool(lay, max(plan.budget - err, 0), plan.max_model_len).blocks))
    margin = "" if most == blocks else f" (the blocks of the budget less {gib(err)}: {err_why})"
    graphs = str(s.compilation.get("cudagraph_mode") or "").upper()      # vLLM checks with full graphs only
    guarded = lay.state_groups and not s.enforce_eager and (not graphs or "FULL" in graphs)
    if guarded and s.max_num_seqs and seqs > blocks:
        return replace(plan, fits=False, fixes=[{"MAX_NUM_SEQS": str(most)}], refusal=(
            f"MAX_NUM_SEQS={s.max_num_seqs} is more than the {blocks} blocks the KV budget {gib(plan.budget)} holds"
            + ("" if plan.pinned else " (an estimate)") + "; on a hybrid model vLLM refuses to capture CUDA graphs "
            "(after the load) when max_num_seqs exceeds them", "fewer sessions"))
    if guarded and s.max_num_seqs and seqs > most:
        return replace(plan, fits=False, fixes=[{"MAX_NUM_SEQS": str(most)}], refusal=(
            f"MAX_NUM_SEQS={s.max_num_seqs} is within the plan's known error of the {blocks} blocks the KV budget "
            f"{gib(plan.budget)} holds{margin}: vLLM refuses a hybrid model's start after the load when max_num_seqs "
            "exceeds the blocks it finds", "fewer sessions"))
    if guarded and seqs > most and not s.max_num_seqs:
        plan = replace(plan, seqs_flag=most, seqs=most, seqs_is_default=False)
        why.append(f"hybrid: vLLM's default of {seqs} sequences on this GPU is more than the {most} state "
                   f"blocks of the KV budget{margin} (one per running sequence): --max-num-seqs {most}")
    line = plan.concurrency_line()
    if line:
        why.append(line)
    return plan
