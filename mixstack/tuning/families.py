"""Tuning families: what a config of each holds, its candidates, and the paths a run must take.

| family | config | baseline (entry ``None``) |
|---|---|---|
| ``stack_fwd`` | ``BLOCK_M, BLOCK_N, num_warps, num_stages`` of the forward GEMMs | the level-1 config |
| ``stack_bwd_relay`` | the same, for the relay backward's GEMMs | the level-1 config |
| ``stack_bwd_fused`` | ``BLOCK_M, BLOCK_N, num_warps, num_stages`` of the fused backward | the relay |
| ``stack_compensated`` | ``BLOCK_M, BLOCK_N, num_warps, num_stages`` of the level-3 split-fp16 GEMMs (forward and relay backward) | the exact fp32 stack (level 2) |
| ``stack_compensated_tma`` | the same and ``persistent``, for level 3's GEMMs on TMA loads with specialised warps (``kernels.gemm_tma``) | level 3 on pointer loads (the ``stack_compensated`` entry) |
| ``stack_wgrad`` | ``BLOCK_M, BLOCK_N, num_warps, num_stages`` of the weight reductions (``kernels.wgrad``) | the level-1 config |
| ``stack_wgrad_compensated`` | the same, for the level-3 split-fp16 weight reductions | the exact reductions (level 2) |

Each family names the dispatch-log paths (``mixstack.dispatch_log``) that a
candidate run and a baseline run must show, and the ones they must not: the
sweep refuses to time a run that did not take the path it claims (docs/contract.md §5.1).
It also names how a candidate is accepted: bit for bit against the baseline
(levels 1-2), or, for the compensated family, by the accuracy contract
against float64 (docs/contract.md §3, ``contract_difference``: every element finite; the
relative error of the result and of every gradient at most ``CONTRACT``, but ``grad_alpha``,
a sum over a row that may cancel, element by element within ``CONTRACT`` of the sum of its
terms' absolute values, ``dot_scale``; on several edge counts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..core.layout import next_power_of_2
from .configs import WGRAD_BLOCK_K, default_gemm_config, default_wgrad_config, fused_supported
from .configs import block_k as layout_block_k
from .keys import ShapeKey

GEMM_FIELDS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")
TMA_FIELDS = GEMM_FIELDS + ("persistent", "specialised")   # the TMA kernel's form, and its warps' roles
FLAG_FIELDS = ("persistent", "specialised")                # fields that hold a bool, not a positive int
FUSED_FIELDS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")

# Hand-picked (BLOCK_M, BLOCK_N, num_warps, num_stages) around the winners of a sweep of one
# ieee block GEMM, leaving out the tiles that spilled (BENCHMARKS.md, "One block GEMM: modes,
# launch configs, pipelining"), then filtered per key by ``_gemm_sensible``.  The K tile is not
# tuned: it fixes the order of the K sum, so another K tile would change results
# (``tuning.configs.block_k`` chooses it).
_GEMM = (
    (64, 128, 4, 3), (64, 128, 4, 4), (64, 64, 4, 2), (64, 64, 4, 3), (64, 64, 4, 4),
    (64, 128, 8, 3), (64, 64, 8, 3), (32, 64, 4, 3), (32, 128, 4, 3), (32, 64, 4, 4),
    (128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 2),
)
# The fused backward: rows per program x output columns per GEMM step x warps
# x stages of its GEMM phase (the relay GEMM's knobs; the gate phase's tiles
# are BLOCK_M x Cf).
_FUSED = tuple((bm, bn, w, s) for bm in (32, 64) for bn in (64, 128) for w in (4, 8) for s in (2, 3))
# At Cf = 64 every 32- and 64-row tile with 4 warps spills, 16-row tiles barely (BENCHMARKS.md,
# "What the compiler makes of it").
_FUSED_WIDE = tuple((16, bn, w, 2) for bn in (64, 128) for w in (4, 8))
SMEM_BUDGET = 160 * 1024   # bytes of operand tiles in flight; above it the pipeliner is refused or slow
# Level 3: tensor-core tiles around the fp16x3 winners of the same GEMM sweep, and always
# one-stage variants: the Triton pipeliner has turned some warps/stages combinations of fp16x3
# kernels into silent NaN rows, which the float64 check must be able to fall back from
# (BENCHMARKS.md, "One block GEMM: modes, launch configs, pipelining"; "Lessons from an earlier
# implementation that the code relies on").
_COMPENSATED = (
    (64, 128, 4, 1), (64, 128, 4, 3), (64, 128, 4, 4), (64, 64, 4, 1), (64, 64, 4, 3), (64, 64, 4, 4),
    (128, 64, 8, 1), (128, 64, 8, 3), (128, 128, 8, 1), (128, 128, 8, 2), (32, 64, 4, 1), (32, 64, 4, 3),
)
# Level 3 on TMA loads with a warp-specialised K loop (``kernels.gemm_tma``): the level-3 tiles
# with four warps, which Triton's Hopper warp specialisation needs; a tile the installed Triton
# cannot build is skipped.  The default quick sweep leaves it out (no GPU run has shown it faster);
# named (``mixstack tune --family stack_compensated_tma``), its quick set is M64 N64 w4 in the forms
# the GPU found right (``tma_form_is_right``): s2 in all four, s3 persistent.  128-row tiles are
# left out: Triton does not build them with the kernel's row scales
# (``repro/triton_hopper_ws_partition.py``; BENCHMARKS.md, "Level 3 on TMA loads and specialised
# warps (offline, sm_90)").
_COMPENSATED_TMA = ((64, 64, 4, 2), (64, 64, 4, 3), (64, 64, 4, 4), (64, 128, 4, 2), (64, 128, 4, 3),
                    (64, 128, 4, 4))
CONTRACT = 2e-6            # error against float64: relative, or of grad_alpha's sum's absolute scale
# The weight reductions: output tiles of a (K = edges) x (K = edges) product, K in steps of
# WGRAD_BLOCK_K edges (fixed).  The forward GEMM's tiles, filtered by the same register and
# shared-memory rules; at level 3 the compensated GEMM's tiles.
_WGRAD = (
    (64, 64, 4, 2), (64, 64, 4, 4), (64, 128, 4, 3), (128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 2),
    (32, 64, 4, 3), (64, 32, 4, 3), (32, 32, 4, 3),
)

# The quick sweep (``mixstack tune``'s default; ``--full`` for the sets above): the candidates
# that won or came within about a per cent on the shipped H200 table's keys, where the full sets
# spend most of a key's time compiling (BENCHMARKS.md, "A cheaper sweep").
# - stack_bwd_relay: M64 N64 w4 s2, the only config that beat the level-1 one on the first tables'
#   keys; where a block is at least ``WIDE_RELAY`` wide, also M64 N128 w4 s3, which won by 3-4% at
#   Cf 128 lmax 4-5 (BENCHMARKS.md, "The whole grid in one run").
# - stack_compensated: the level-3 policy's config for the key (``policy.rule_config``), which
#   names the winner of every swept key up to ties.
# - stack_fwd and stack_bwd_fused are left out: the level-1 forward config won at every key it
#   was swept at, and the fused backward lost at every key.
_QUICK_RELAY = ((64, 64, 4, 2),)
_QUICK_RELAY_WIDE = ((64, 128, 4, 3),)
WIDE_RELAY = 768
QUICK_FAMILIES = ("stack_bwd_relay", "stack_compensated")


def block_k(key: ShapeKey) -> int:
    """The K tile the GEMM kernel uses for this key (``tuning.configs.block_k``: one definition)."""
    return layout_block_k(key.layout)


def _gemm_sensible(bm: int, bn: int, warps: int, stages: int, key: ShapeKey) -> bool:
    bk = block_k(key)
    threads = 32 * warps
    if not 16 <= bm * bn // threads <= 64:          # accumulator registers per thread
        return False
    if (bm + bn) * bk // threads >= 64:             # operand registers per thread (64x64x64, 4 warps spilled)
        return False
    if stages * (bm + bn) * bk * 4 > SMEM_BUDGET:
        return False
    widest = max(key.layout.m0, key.layout.m1)
    return bn <= max(64, next_power_of_2(widest))   # no tile much wider than the widest block


def _default_gemm_config(key: ShapeKey) -> dict:
    """The level-1 config the launchers use for this key: the baseline, never a candidate."""
    return {f: default_gemm_config(key.layout)[f] for f in GEMM_FIELDS}


def _gemm_candidates(key: ShapeKey) -> list[dict]:
    default = _default_gemm_config(key)
    out = []
    for bm, bn, w, s in _GEMM:
        cfg = dict(zip(GEMM_FIELDS, (bm, bn, w, s)))
        if cfg != default and _gemm_sensible(bm, bn, w, s, key):   # never time the baseline against itself
            out.append(cfg)
    return out


def _quick_gemm_candidates(key: ShapeKey) -> list[dict]:
    default = _default_gemm_config(key)
    wide = max(key.layout.m0, key.layout.m1) >= WIDE_RELAY
    out = []
    for bm, bn, w, s in _QUICK_RELAY + (_QUICK_RELAY_WIDE if wide else ()):
        cfg = dict(zip(GEMM_FIELDS, (bm, bn, w, s)))
        if cfg != default and _gemm_sensible(bm, bn, w, s, key):
            out.append(cfg)
    return out


# The level-3 policy's configs (``policy``): the winners of the measured H200 keys
# (BENCHMARKS.md, "Level 3 without a sweep: the policy").
M64_N64 = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
M64_N128 = {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 4}
WIDE_BLOCK = 384               # a GEMM block at least this wide takes the 128-wide N tile


def rule_config(key: ShapeKey) -> dict:
    """The level-3 config the policy names for ``key`` (``policy`` says whether it engages): M64
    N128 w4 s4 where a GEMM block is at least ``WIDE_BLOCK`` wide, or Cf >= 64 with blocks wider
    than 128, else M64 N64 w4 s3: the winner, or tied with it, at every H200 key where level 3
    won; where N128 tied at Cf 64 lmax 1, N64 is taken because N128 spills there (BENCHMARKS.md,
    "Level 3 without a sweep: the policy")."""
    lay = key.layout
    widest = max(lay.m0, lay.m1)
    wide = widest >= WIDE_BLOCK or (key.focus_dim >= 64 and widest > 128)
    return dict(M64_N128 if wide else M64_N64)


def _quick_compensated_candidates(key: ShapeKey) -> list[dict]:
    cfg = rule_config(key)
    return [{f: cfg[f] for f in GEMM_FIELDS}]


def _split_tiles(key: ShapeKey, tiles) -> list[dict]:
    """The level-3 GEMM ``tiles`` whose operand tiles in flight fit ``SMEM_BUDGET`` and whose N
    tile is not much wider than the widest block."""
    bk = block_k(key)
    widest = max(key.layout.m0, key.layout.m1)
    out = []
    for bm, bn, w, s in tiles:
        smem = s * (bm * bk * 4 + 2 * bk * bn * 2)      # fp32 A tile, fp16 W head and tail
        if smem <= SMEM_BUDGET and bn <= max(64, next_power_of_2(widest)):
            out.append(dict(zip(GEMM_FIELDS, (bm, bn, w, s))))
    return out


def _compensated_candidates(key: ShapeKey) -> list[dict]:
    return _split_tiles(key, _COMPENSATED)


def tma_form_is_right(cfg: dict) -> bool:
    """Whether the TMA kernel's form ``cfg`` gave the pointer kernel's bits through the stack on the
    GPU (BENCHMARKS.md, "Level 3 on TMA loads: which forms are right"): with more than two stages the
    warp-specialised forms give non-finite rows and the tiled unspecialised form a wrong backward;
    the persistent unspecialised form is right at every depth measured.  The others are never swept."""
    return cfg["num_stages"] <= 2 or (cfg["persistent"] and not cfg["specialised"])


def _tma_forms_of(tiles) -> list[dict]:
    """Each tile of ``tiles`` in the TMA kernel's four forms: tiled or persistent, specialised or not."""
    return [dict(cfg, persistent=p, specialised=w) for cfg in tiles for p in (False, True) for w in (False, True)]


def tma_forms(key: ShapeKey) -> list[dict]:
    """Every form of the TMA kernel at ``key``'s tiles, those never swept included (what a probe of
    the forms' bits runs)."""
    return _tma_forms_of(_split_tiles(key, _COMPENSATED_TMA))


def _compensated_tma_candidates(key: ShapeKey) -> list[dict]:
    return [cfg for cfg in tma_forms(key) if tma_form_is_right(cfg)]


def _quick_compensated_tma_candidates(key: ShapeKey) -> list[dict]:
    tiles = [dict(M64_N64, num_stages=stages) for stages in (2, 3)]
    return [cfg for cfg in _tma_forms_of(tiles) if tma_form_is_right(cfg)]


def _wgrad_sensible(bm: int, bn: int, warps: int, stages: int, key: ShapeKey, fp16: bool) -> bool:
    threads = 32 * warps
    if not 8 <= bm * bn // threads <= 128:          # accumulator registers per thread (two at level 3)
        return False
    if stages * (bm + bn) * WGRAD_BLOCK_K * (2 if fp16 else 4) > SMEM_BUDGET:
        return False
    widest = max(key.layout.m0, key.layout.m1)
    return max(bm, bn) <= max(64, next_power_of_2(widest))


def _wgrad_candidates(key: ShapeKey) -> list[dict]:
    default = {f: default_wgrad_config(key.layout)[f] for f in GEMM_FIELDS}
    return [dict(zip(GEMM_FIELDS, c)) for c in _WGRAD
            if dict(zip(GEMM_FIELDS, c)) != default and _wgrad_sensible(*c, key, fp16=False)]


def _wgrad_compensated_candidates(key: ShapeKey) -> list[dict]:
    return [dict(zip(GEMM_FIELDS, c)) for c in ((64, 64, 4, 1),) + _WGRAD if _wgrad_sensible(*c, key, fp16=True)]


# The quick sweep of the training families, which no measurement has pruned: the level-1 tile
# with 2 and 4 stages, and at level 3 the same tile, so that a key gets a validated level-3 entry
# (or a measured ``None``) from one candidate (BENCHMARKS.md, "The training kernels' launch
# configs").
_QUICK_WGRAD = ((64, 64, 4, 2), (64, 64, 4, 4))
_QUICK_WGRAD_COMPENSATED = ((64, 64, 4, 3),)


def _quick_wgrad_candidates(key: ShapeKey) -> list[dict]:
    return [dict(zip(GEMM_FIELDS, c)) for c in _QUICK_WGRAD if _wgrad_sensible(*c, key, fp16=False)]


def _quick_wgrad_compensated_candidates(key: ShapeKey) -> list[dict]:
    return [dict(zip(GEMM_FIELDS, c)) for c in _QUICK_WGRAD_COMPENSATED if _wgrad_sensible(*c, key, fp16=True)]


def _fused_candidates(key: ShapeKey) -> list[dict]:
    if not fused_supported(key.layout):              # outside the fused regime: the relay always runs
        return []
    extra = _FUSED_WIDE if key.layout.focus_dim >= 64 else ()
    return [dict(zip(FUSED_FIELDS, c)) for c in extra + _FUSED]


@dataclass(frozen=True)
class Family:
    """One tuning family.

    ``candidate_paths`` / ``baseline_paths``: dispatch-log paths the run must
    show; ``candidate_forbidden`` / ``baseline_forbidden``: paths it must not.
    ``disable``: families registered ``None`` while probing this one (tuning
    the relay must not let a fused entry take its place).  ``candidate_level``:
    the level candidates run at (the baseline runs at level 2).  ``accept``:
    ``"bitwise"`` (equal bits to the baseline) or ``"float64"`` (the accuracy
    contract against a float64 reference).  ``baseline_level``: the level the baseline runs
    at.  ``builds_may_fail``: a candidate that the installed Triton cannot compile is skipped
    like a resource refusal (kernels outside what every Triton and GPU builds; docs/contract.md
    §4).  ``needs_config_of``: a family whose baseline runs that family's config, so a key is
    swept only where that family's entry is a config.  ``timed``: ``"fwd"``, ``"bwd"``,
    ``"both"`` (forward and backward together) or ``"wgrad"`` (the backward with the weight
    gradients; its runs check those gradients too).  ``kernels``: the kernel modules
    (``mixstack/kernels/<name>.py``) that candidate and baseline runs launch; the
    entries' validity hash covers them and what they import (``validity``).
    """

    name: str
    fields: tuple[str, ...]
    timed: str
    make_candidates: Callable[[ShapeKey], list[dict]]
    candidate_paths: tuple[str, ...] = ()
    candidate_forbidden: tuple[str, ...] = ()
    baseline_paths: tuple[str, ...] = ()
    baseline_forbidden: tuple[str, ...] = ()
    disable: tuple[str, ...] = ()
    baseline_name: str = "baseline"
    candidate_level: int = 2
    baseline_level: int = 2
    builds_may_fail: bool = False
    needs_config_of: str | None = None
    accept: str = "bitwise"
    kernels: tuple[str, ...] = ()
    make_quick: Callable[[ShapeKey], list[dict]] | None = None


# The kernels each family's runs launch (``"module.function"`` of mixstack/kernels): its entries'
# validity hash covers them and every helper they call (``kernel_hash``).
STACK_KERNELS = ("gemm.block_gemm_kernel", "gate.gate_kernel", "gate.gate_backward_kernel", "reduce.alpha_grad_kernel")
FUSED_KERNELS = STACK_KERNELS + ("fused.fused_backward_kernel",)
COMPENSATED_KERNELS = STACK_KERNELS + ("compensated.split_weights_kernel",)
TMA_KERNELS = COMPENSATED_KERNELS + ("gemm_tma.tma_block_gemm_kernel", "gemm_tma.fold_tile_amax_kernel")
WGRAD_KERNELS = STACK_KERNELS + ("wgrad.wgrad_kernel", "wgrad.chunk_sum_kernel", "wgrad.gate_wgrad_kernel",
                                 "wgrad.layer_input_kernel")
WGRAD_COMPENSATED_KERNELS = WGRAD_KERNELS + ("compensated.split_weights_kernel",)

FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("stack_fwd", GEMM_FIELDS, "fwd", _gemm_candidates,
           candidate_paths=("fwd:triton", "cfg:stack_fwd"),
           baseline_paths=("fwd:triton",), baseline_forbidden=("cfg:stack_fwd",),
           baseline_name="level-1 config", kernels=STACK_KERNELS),
    Family("stack_bwd_relay", GEMM_FIELDS, "bwd", _gemm_candidates,
           candidate_paths=("bwd:relay", "cfg:stack_bwd_relay"), candidate_forbidden=("bwd:fused",),
           baseline_paths=("bwd:relay",), baseline_forbidden=("cfg:stack_bwd_relay", "bwd:fused"),
           disable=("stack_bwd_fused",), baseline_name="level-1 config", kernels=STACK_KERNELS,
           make_quick=_quick_gemm_candidates),
    Family("stack_bwd_fused", FUSED_FIELDS, "bwd", _fused_candidates,
           candidate_paths=("bwd:fused",), candidate_forbidden=("bwd:relay",),
           baseline_paths=("bwd:relay",), baseline_forbidden=("bwd:fused",),
           baseline_name="relay", kernels=FUSED_KERNELS),
    Family("stack_compensated", GEMM_FIELDS, "both", _compensated_candidates,
           candidate_paths=("fwd:compensated", "bwd:compensated"),
           candidate_forbidden=("fwd:triton", "bwd:relay", "bwd:fused"),
           baseline_paths=("fwd:triton",), baseline_forbidden=("fwd:compensated", "bwd:compensated"),
           baseline_name="level 2", candidate_level=3, accept="float64",
           kernels=COMPENSATED_KERNELS, make_quick=_quick_compensated_candidates),
    Family("stack_compensated_tma", TMA_FIELDS, "both", _compensated_tma_candidates,
           candidate_paths=("fwd:compensated", "bwd:compensated", "level3:tma"),
           candidate_forbidden=("fwd:triton", "bwd:relay", "bwd:fused"),
           baseline_paths=("fwd:compensated", "bwd:compensated"), baseline_forbidden=("level3:tma",),
           baseline_name="level 3 (pointer loads)", candidate_level=3, baseline_level=3, accept="float64",
           kernels=TMA_KERNELS, builds_may_fail=True,
           needs_config_of="stack_compensated", make_quick=_quick_compensated_tma_candidates),
    Family("stack_wgrad", GEMM_FIELDS, "wgrad", _wgrad_candidates,
           candidate_paths=("wgrad:triton", "cfg:stack_wgrad"), candidate_forbidden=("wgrad:compensated",),
           baseline_paths=("wgrad:triton",), baseline_forbidden=("cfg:stack_wgrad", "wgrad:compensated"),
           disable=("stack_wgrad_compensated",), baseline_name="level-1 config",
           kernels=WGRAD_KERNELS, make_quick=_quick_wgrad_candidates),
    Family("stack_wgrad_compensated", GEMM_FIELDS, "wgrad", _wgrad_compensated_candidates,
           candidate_paths=("wgrad:compensated",), candidate_forbidden=("wgrad:triton",),
           baseline_paths=("wgrad:triton",), baseline_forbidden=("wgrad:compensated",),
           baseline_name="level 2", candidate_level=3, accept="float64",
           kernels=WGRAD_COMPENSATED_KERNELS,
           make_quick=_quick_wgrad_compensated_candidates),
)}

# The order a full sweep runs in: the fused backward is measured against the
# relay as tuned, so the relay's GEMMs are tuned first.  The training families (weight
# reductions) are swept only on request (``mixstack tune --family stack_wgrad``): inference
# and freezing never run them.
SWEEP_ORDER = ("stack_fwd", "stack_bwd_relay", "stack_bwd_fused", "stack_compensated", "stack_compensated_tma")
TRAINING_FAMILIES = ("stack_wgrad", "stack_wgrad_compensated")


def family(name: str) -> Family:
    """The family called ``name``; ``ValueError`` naming the known ones otherwise."""
    try:
        return FAMILIES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown tuning family {name!r}; known: {', '.join(FAMILIES)}") from None


def candidates(name: str, key: ShapeKey, quick: bool = False) -> list[dict]:
    """The launch configs the sweep tries for ``key`` (fresh dicts; the baseline is not among
    them); ``quick``: the pruned set of the quick sweep (none for a family it leaves out)."""
    from .keys import as_key
    fam = family(name)
    make = fam.make_candidates if not quick else (fam.make_quick or (lambda _key: []))
    return [dict(c) for c in make(as_key(key))]


def dot_scale(grad_out, y):
    """The scale ``contract_difference`` judges ``grad_alpha`` by: for each (edge, focus) pair,
    ``sum_c |grad_out[e, f, c] * y[e, f, c]|`` in float64, the sum of the absolute values of
    the terms whose sum is that element (``y`` the unscaled result, edge-major)."""
    return (grad_out.double() * y.double()).abs().sum(-1)


def contract_difference(reference, got, bound: float = CONTRACT, *, scales=None, names=None) -> str | None:
    """Why ``got`` breaks the accuracy contract against the float64 ``reference`` (tuples of
    tensors), or ``None``: a non-finite element, or an error above ``bound``.

    An output's error is its relative Frobenius error, unless ``scales`` (a tuple beside
    ``reference``) holds a tensor for it: then every element's error must be at most ``bound``
    times that element's scale (``dot_scale`` for ``grad_alpha``: a sum whose terms cancel has a
    relative error that measures its cancellation, not the kernel; docs/contract.md §3).
    ``names`` (beside ``reference``) name the outputs in the message; else their indices."""
    import torch
    if len(reference) != len(got):
        return f"{len(got)} outputs, the reference has {len(reference)}"
    if scales is not None and len(scales) != len(reference):
        raise ValueError(f"{len(scales)} scales for {len(reference)} outputs")
    for i, (ref, b) in enumerate(zip(reference, got)):
        who = f"output {i}" + (f" ({names[i]})" if names else "")
        scale = scales[i] if scales else None
        if ref.shape != b.shape:
            return f"{who}: shape {tuple(b.shape)}, the reference's is {tuple(ref.shape)}"
        if not bool(torch.isfinite(b).all()):
            return f"{who}: {int((~torch.isfinite(b)).sum())} of {b.numel()} values are not finite"
        why = _relative_difference(ref, b, bound) if scale is None else _scaled_difference(ref, b, scale, bound)
        if why is not None:
            return f"{who}: {why}"
    return None


def _relative_difference(ref, b, bound: float) -> str | None:
    """The relative Frobenius error of ``b`` against ``ref`` where it is above ``bound``."""
    ref = ref.double()
    den = ref.norm().item()
    err = (b.double() - ref).norm().item() / den if den > 0 else b.double().norm().item()
    if err <= bound:
        return None
    return f"relative error {err:.3g} against float64, above the contract {bound:g}"


def _scaled_difference(ref, b, scale, bound: float) -> str | None:
    """The worst element of ``|b - ref| / scale`` where it is above ``bound`` (an error where the
    scale is 0 counts as infinitely far: a sum of zero terms is exact)."""
    import torch
    diff = (b.double() - ref.double()).abs()
    scale = scale.double().to(diff.device).expand_as(diff)
    ratio = torch.where(diff > 0, diff / scale, torch.zeros_like(diff))
    if ratio.numel() == 0 or ratio.max().item() <= bound:
        return None
    at = int(ratio.argmax())
    index = tuple(int(j) for j in torch.unravel_index(torch.tensor(at), ratio.shape))
    return (f"error {diff.flatten()[at].item():.3g} at element {index} is {ratio.flatten()[at].item():.3g} "
            f"of the sum of its terms' absolute values ({scale.flatten()[at].item():.3g}) against float64, "
            f"above the contract {bound:g}")


def check_config(name: str, cfg) -> dict | None:
    """``cfg`` validated for family ``name``: ``None``, or a dict of exactly its fields (positive
    ints; ``FLAG_FIELDS`` bools)."""
    fam = family(name)
    if cfg is None:
        return None
    if not isinstance(cfg, dict):
        raise TypeError(f"a {name} config must be a dict or None, got {type(cfg).__name__}")
    if set(cfg) != set(fam.fields):
        raise ValueError(f"a {name} config needs exactly the fields {', '.join(fam.fields)}, "
                         f"got {', '.join(map(str, cfg)) or 'none'}")
    for f in fam.fields:
        v = cfg[f]
        if f in FLAG_FIELDS:
            if not isinstance(v, bool):
                raise ValueError(f"{name} config field {f} must be true or false, got {v!r}")
        elif isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} config field {f} must be a positive int, got {v!r}")
    return {f: cfg[f] for f in fam.fields}


_ABBREV = {"BLOCK_M": "M", "BLOCK_N": "N", "num_warps": "w", "num_stages": "s"}


def label(cfg: dict | None) -> str:
    """A short name of a config for logs and tables: ``M64 N128 w4 s3`` (a flag field: its name
    where it is set, ``M64 N64 w4 s3 persistent``)."""
    if cfg is None:
        return "baseline"
    return " ".join(k if v is True else f"{_ABBREV.get(k, k)}{v}" for k, v in cfg.items() if v is not False)
