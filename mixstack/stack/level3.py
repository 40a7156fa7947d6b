"""Level 3's one decision: what a level-3 call on a key runs, and the policy's first-use check.

``resolve(key, device)`` answers for the operators, the benches and LAMMPS alike: a
``stack_compensated`` table entry decides where there is one (a config, or ``None``: level 2),
with a ``stack_compensated_tma`` entry's config where the TMA-fed GEMMs measured faster; else a
verdict this process reached; else the level-3 policy (``tuning.policy``), whose config must
first pass the sweep's float64 check (docs/contract.md §3, §5): forward and backward (``u0``
and ``alpha``) on seeded edge counts that include partial tiles, every output finite and within
the contract of the float64 reference (``families.contract_difference``: 2e-6 relative error,
``grad_alpha`` element by element against its sum's absolute scale).  ``prepare``, before an
eager level-3 call, runs that check once per key and device and keeps the verdict in this
process (a failed check: level 2 runs, with a warning); nothing is written to any table on the
forward path (``mixstack tune`` measures and records).  Where the policy is not sure, level 3
runs level 2 (``dispatch_log``: ``level3:level2``).

Nothing here validates while a compiler, ``make_fx`` or ``torch.export`` traces (a traced call uses
a verdict an eager call left, or level 2), nor inside a validation (its config is the verdict under
test).
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass

import torch

from ..dispatch import guards, levels
from ..dispatch.log import unlogged, warn_once
from ..tuning import families, policy, registry, validity
from ..tuning.keys import ShapeKey, as_key, shape_key
from . import reference

log = logging.getLogger(__name__)

FAMILY = "stack_compensated"
TMA_FAMILY = "stack_compensated_tma"
VALIDATION_EDGES = (4099, 129, 1)        # partial tiles for every block size, and single rows
INTERPRETER_EDGES = (37, 1)              # under TRITON_INTERPRET (CPU): small
N_LAYERS = 3                             # two gated layers and the identity layer: every kernel runs
OUTPUTS = ("result", "grad_u0", "grad_alpha")   # what ``_fwd_bwd`` returns, named in a failed check

_busy = threading.local()


def _inputs(key: ShapeKey, edges: int, device, seed: int):
    """Seeded inputs of ``key``: activations and upstream gradient standard normal, alpha
    positive and normalised over the focus streams, weights as ``MixingStack`` draws them."""
    lay = key.layout
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    kw = dict(generator=gen, device=device, dtype=torch.float32)
    F = key.n_focus
    w0 = torch.randn(N_LAYERS, F, lay.m0, lay.m0, **kw) / math.sqrt(lay.m0 * N_LAYERS)
    w1 = torch.randn(N_LAYERS, F, lay.m1, lay.m1, **kw) / math.sqrt(lay.m1 * N_LAYERS)
    gw = torch.randn(N_LAYERS - 1, F, key.focus_dim, lay.gate_width, **kw) / math.sqrt(key.focus_dim)
    u0 = torch.randn(F, edges, lay.row, **kw)
    alpha = torch.rand(edges, F, **kw) + 0.1
    alpha = alpha / alpha.sum(-1, keepdim=True)
    grad = torch.randn(edges, F, lay.row, **kw)
    return u0, alpha, w0, w1, gw, grad


def _fwd_bwd(run, key, u0, alpha, w0, w1, gw, grad):
    u0 = u0.detach().requires_grad_(True)
    alpha = alpha.detach().requires_grad_(key.apply_alpha)
    out = run(u0, alpha, w0, w1, gw, lmax=key.lmax, focus_dim=key.focus_dim, apply_alpha=key.apply_alpha)
    wrt = (u0, alpha) if key.apply_alpha else (u0,)
    grads = torch.autograd.grad(out, wrt, grad)
    return (out.detach(),) + tuple(grads)


def _scales(key: ShapeKey, x64, grad) -> tuple:
    """What ``families.contract_difference`` judges each output of ``_fwd_bwd`` by: ``None``
    (relative error) for the result and grad_u0; for grad_alpha, ``families.dot_scale`` of the
    upstream gradient and the float64 reference's unscaled result."""
    if not key.apply_alpha:
        return (None, None)
    y = reference.forward_state(*x64, lmax=key.lmax, focus_dim=key.focus_dim, apply_alpha=False)[2]
    return (None, None, families.dot_scale(grad, y))


def validation_edges(device) -> tuple[int, ...]:
    """The edge counts ``validate`` checks on ``device`` (small ones under the interpreter)."""
    return VALIDATION_EDGES if torch.device(device).type == "cuda" else INTERPRETER_EDGES


def validate(key, cfg: dict, device, edges=None) -> dict:
    """Run ``cfg`` at level 3 on ``key`` against float64 (see the module doc):
    ``{"ok": bool, "why": str | None, "edges": [...]}``."""
    device = torch.device(device)      # the mixstack:: operators are registered by whoever calls at level 3

    def mixing_stack(u0, alpha, w0, w1, gw, *, lmax, focus_dim, apply_alpha):
        return torch.ops.mixstack.stack_forward(u0, alpha, w0, w1, gw, lmax, focus_dim, apply_alpha, 3, True)[0]

    edges = tuple(edges or validation_edges(device))
    why = None
    # the caller may be under no_grad or inference_mode (forces only): the check needs autograd
    with registry.registration(FAMILY, key, cfg), levels.use_level(3), unlogged(), \
            torch.inference_mode(False), torch.enable_grad():
        for i, n in enumerate(edges):
            u0, alpha, w0, w1, gw, grad = _inputs(key, n, device, seed=1000 + i)
            got = _fwd_bwd(mixing_stack, key, u0, alpha, w0, w1, gw, grad)
            x64 = tuple(t.double() for t in (u0, alpha, w0, w1, gw))
            ref = _fwd_bwd(reference.mixing_stack, key, *x64, grad.double())
            why = families.contract_difference(ref, got, scales=_scales(key, x64, grad), names=OUTPUTS)
            if why is not None:
                why = f"{n} edges: {why}"
                break
    return {"ok": why is None, "why": why, "edges": list(edges)}


@dataclass(frozen=True)
class Plan:
    """What a level-3 call on a key runs: ``config`` the compensated GEMMs' launch config
    (``None``: level 2), ``tma`` a ``stack_compensated_tma`` config where the TMA-fed GEMMs
    measured faster, ``source`` ("table", "policy": validated in this process, "unchecked":
    the policy's ``pending`` config awaits its check, "level2"), and ``reason``."""

    config: dict | None
    source: str
    reason: str
    tma: dict | None = None
    pending: dict | None = None


_verdicts: dict[tuple[str, ShapeKey], Plan] = {}
_lock = threading.Lock()


def resolve(key, device: str) -> Plan:
    """The level-3 decision for ``key`` on ``device`` (a device name; see the module doc)."""
    key = as_key(key)
    hit = registry.find(FAMILY, key, device_name=device)
    if hit is not None:
        cfg = hit[1]["config"]
        if cfg is None:
            return Plan(None, "table", f"the {hit[0]} table's entry for {key.short()} is level 2")
        tma = registry.find(TMA_FAMILY, key, device_name=device)
        tma_cfg = None if tma is None or tma[1]["config"] is None else dict(tma[1]["config"])
        return Plan(dict(cfg), "policy" if hit[1].get("source") == "policy" else "table",
                    f"the {hit[0]} table's entry for {key.short()}", tma_cfg)
    with _lock:
        verdict = _verdicts.get((device, key))
    if verdict is not None:
        return verdict
    decision = policy.decide(key, device)
    if decision.config is None:
        return Plan(None, "level2", f"{key.short()}: {decision.reason}")
    return Plan(None, "unchecked", decision.reason, pending=dict(decision.config))


def unswept_decision(key, device: str) -> policy.Decision | None:
    """The policy's decision for ``key`` on ``device`` where no table entry decides (``None``
    where one does)."""
    key = as_key(key)
    if registry.find(FAMILY, key, device_name=device) is not None:
        return None
    return policy.decide(key, device)


def pending(key, device: str) -> dict | None:
    """The policy's config that the next eager level-3 call on ``key`` would check, or ``None``."""
    return resolve(key, device).pending


def prepare(u0, *, focus_dim: int, lmax: int, apply_alpha: bool) -> None:
    """Before an eager level-3 call: where ``resolve`` has the policy's config unchecked, check it
    and keep the verdict for this process.  A no-op under a trace (``guards.tracing``) and inside a check."""
    if getattr(_busy, "on", False) or guards.tracing(u0):
        return
    check(shape_key(focus_dim=focus_dim, lmax=lmax, n_focus=int(u0.shape[0]), apply_alpha=apply_alpha), u0.device)


def check(key, device: torch.device) -> Plan:
    """The level-3 plan for ``key`` on ``device`` (a ``torch.device``), the policy's unchecked
    config checked against float64 first and the verdict kept for this process: what the first
    eager call does, for a freeze, which traces without one."""
    key = as_key(key)
    name = validity.device_name(device)
    cfg = pending(key, name)
    if cfg is None:
        return resolve(key, name)
    _busy.on = True
    try:
        verdict = validate(key, cfg, device)
    finally:
        _busy.on = False
    if verdict["ok"]:
        plan = Plan(cfg, "policy", f"the policy's {families.label(cfg)}, checked against float64 at first use")
    else:
        plan = Plan(None, "level2", f"the policy's {families.label(cfg)} failed the float64 check ({verdict['why']})")
        warn_once(f"level3:{key}", f"mixstack: level 3 runs level 2 for {key.short()}: {plan.reason}")
    with _lock:
        _verdicts[(name, key)] = plan
    log.info("level 3 at first use, %s: %s", key.short(), plan.reason)
    return plan


def forget() -> None:
    """Drop this process's verdicts (tests; a table that changed under it)."""
    with _lock:
        _verdicts.clear()
