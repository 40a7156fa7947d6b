"""Level 3 at first use: validate the policy's config for a key nobody swept, and keep the verdict.

At level 3 a key with a ``stack_compensated`` table entry runs what the entry says.
A key without one asks ``tuning.policy.decide``; where the policy names a config,
the first eager call validates it here, by the sweep's contract (docs/contract.md §3,
§5): forward and backward (``u0`` and ``alpha``) on several seeded edge counts that
include partial tiles, every output finite and within 2e-6 relative error of the
float64 reference.  The verdict, the config or ``None`` (failed: level 2 runs), is
written to the user's table as a ``stack_compensated`` entry with ``source:
"policy"`` and the usual validity stamp (device, Triton version, kernel-source
hash), so it is kept, looked up and voided like any entry; a sweep still measures
the key (``registry.covered`` ignores such entries).  Where the policy is not sure,
nothing is written and level 3 runs level 2 (``dispatch_log``: ``level3:level2``).

Nothing here runs while a compiler traces (a traced call uses the verdict a
previous eager call left, or level 2), and a call inside the validation never
validates again (the config is registered while it runs).
"""

from __future__ import annotations

import logging
import math
import threading

import torch

from ..dispatch import levels
from ..dispatch.log import unlogged, warn_once
from ..tuning import families, policy, registry, store, validity
from ..tuning.keys import ShapeKey, as_key, shape_key
from . import reference

log = logging.getLogger(__name__)

FAMILY = "stack_compensated"
VALIDATION_EDGES = (4099, 129, 1)        # partial tiles for every block size, and single rows
INTERPRETER_EDGES = (37, 1)              # under TRITON_INTERPRET (CPU): small
N_LAYERS = 3                             # two gated layers and the identity layer: every kernel runs

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


def validation_edges(device) -> tuple[int, ...]:
    """The edge counts ``validate`` checks on ``device`` (small ones under the interpreter)."""
    return VALIDATION_EDGES if torch.device(device).type == "cuda" else INTERPRETER_EDGES


def validate(key, cfg: dict, device, edges=None) -> dict:
    """Run ``cfg`` at level 3 on ``key`` against float64 (see the module doc):
    ``{"ok": bool, "why": str | None, "edges": [...]}``."""
    from . import ops as stack  # noqa: F401  (registers the mixstack:: operators; needs Triton)
    device = torch.device(device)

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
            ref = _fwd_bwd(reference.mixing_stack, key, u0.double(), alpha.double(), w0.double(), w1.double(),
                           gw.double(), grad.double())
            why = families.contract_difference(ref, got)
            if why is not None:
                why = f"{n} edges: {why}"
                break
    return {"ok": why is None, "why": why, "edges": list(edges)}


def unswept_decision(key, device: str) -> policy.Decision | None:
    """The policy's decision for ``key`` on ``device`` (a device name) where the key has no
    ``stack_compensated`` entry; ``None`` where it has one (the entry decides)."""
    key = as_key(key)
    if registry.find(FAMILY, key, device_name=device) is not None:
        return None
    return policy.decide(key, device)


def pending(key, device: str) -> policy.Decision | None:
    """The policy's decision that the next level-3 call on ``key`` would validate (``device``: a
    device name), or ``None`` where it validates nothing (an entry exists, or no config)."""
    decision = unswept_decision(key, device)
    return decision if decision is not None and decision.config is not None else None


def prepare(u0, *, focus_dim: int, lmax: int, apply_alpha: bool) -> None:
    """Before a level-3 call on CUDA (or the interpreter): where the key has no
    ``stack_compensated`` entry and the policy names a config, validate it and record the
    verdict (once per key and table).  A no-op under a compiler's trace and inside a
    validation."""
    if torch.compiler.is_compiling() or getattr(_busy, "on", False):
        return
    key = shape_key(focus_dim=focus_dim, lmax=lmax, n_focus=int(u0.shape[0]), apply_alpha=apply_alpha)
    device = validity.device_name(u0.device)
    decision = pending(key, device)
    if decision is None:
        return
    _busy.on = True
    try:
        verdict = validate(key, decision.config, u0.device)
    finally:
        _busy.on = False
    cfg = decision.config if verdict["ok"] else None
    if not verdict["ok"]:
        warn_once(f"level3:{key}", f"mixstack: level 3 runs level 2 for {key.short()}: the policy's config "
                                   f"{families.label(decision.config)} failed the float64 check ({verdict['why']})")
    entry = {"config": cfg, **validity.stamp(device, FAMILY), "source": "policy", "policy": decision.source,
             "reason": decision.reason, "winner": families.label(cfg), "validation": verdict}
    try:
        store.write_entry(device, FAMILY, key, entry)
        registry.reload()
    except OSError as exc:                    # a read-only cache: keep the verdict for this process
        warn_once("level3:cache", f"mixstack: cannot write the level-3 verdicts to the user's table ({exc}); "
                                  "they hold for this process only")
        registry.register(FAMILY, key, cfg)
    log.info("level 3 at first use, %s: %s (%s)", key.short(), families.label(cfg), decision.reason)
