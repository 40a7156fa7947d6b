"""Benchmark shapes and their random inputs.

``STANDARD`` holds the shapes of docs/contract.md §8 (n_layers = 4, alpha on), which need a
GPU; ``SMALL`` holds shapes that run in seconds on a CPU, so that
``mixstack bench`` finishes anywhere.  ``make_inputs`` draws random non-zero
inputs whose activations stay O(1) through the layers: the weights come from
``MixingStack``'s own initialisation (one definition of it), the activations
and upstream gradient are standard normal, and ``alpha`` is positive and
sums to 1 over the focus streams, like the softmax that produces it in a model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from ..core.layout import LMAX_RANGE, StackLayout
from ..stack.nn import MixingStack


@dataclass(frozen=True)
class BenchShape:
    """One problem size: ``edges`` E, ``focus`` F, ``focus_dim`` Cf, ``lmax``, ``layers``."""

    name: str
    edges: int
    focus: int
    focus_dim: int
    lmax: int
    layers: int = 4
    apply_alpha: bool = True

    def __post_init__(self):
        for name in ("edges", "focus", "focus_dim", "layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"shape {self.name}: {name} must be a positive int, got {value!r}")
        if self.lmax not in LMAX_RANGE:
            raise ValueError(f"shape {self.name}: lmax must be in 1..6, got {self.lmax!r}")

    @property
    def layout(self) -> StackLayout:
        return StackLayout(self.lmax, self.focus_dim)

    @property
    def n_gated(self) -> int:
        return self.layers - 1

    def tuning_key(self):
        """The ``tuning.ShapeKey`` of this shape (its tables' key)."""
        from ..tuning.keys import shape_key
        return shape_key(focus_dim=self.focus_dim, lmax=self.lmax, n_focus=self.focus,
                         apply_alpha=self.apply_alpha)

    def describe(self) -> str:
        alpha = "" if self.apply_alpha else " no-alpha"
        return (f"{self.name} E={self.edges} F={self.focus} Cf={self.focus_dim} "
                f"lmax={self.lmax} layers={self.layers}{alpha}")

    def to_dict(self) -> dict:
        return asdict(self)


STANDARD: dict[str, BenchShape] = {
    s.name: s for s in (
        BenchShape("S1", 300003, 2, 32, 3),     # operator microbenchmark
        BenchShape("S2", 300003, 2, 32, 6),     # where a naive fused kernel loses
        BenchShape("S3", 646000, 2, 32, 3),     # ~4096-atom frame
        BenchShape("S4", 300003, 1, 64, 3),     # wide channels
    )
}

# CPU-sized: the S1 and S4 channel shapes at 3001 edges (odd, so no block size divides it),
# small enough that the default CPU bench takes well under a minute (BENCHMARKS.md, "The
# reference implementations at S1-S4").
SMALL: dict[str, BenchShape] = {
    s.name: s for s in (
        BenchShape("C1", 3001, 2, 32, 3),
        BenchShape("C4", 3001, 1, 64, 3),
    )
}


def shape_by_name(name: str) -> BenchShape:
    """A shape of ``STANDARD`` or ``SMALL`` by its id (case-insensitive)."""
    key = name.strip().upper()
    for table in (STANDARD, SMALL):
        if key in table:
            return table[key]
    known = ", ".join(list(STANDARD) + list(SMALL))
    raise ValueError(f"unknown shape {name!r}; known shapes: {known}")


@dataclass
class StackInputs:
    """Inputs of one benchmark shape, and the upstream gradient of its result."""

    u0: torch.Tensor            # (F, E, ROW)
    alpha: torch.Tensor         # (E, F)
    w0: torch.Tensor
    w1: torch.Tensor
    gw: torch.Tensor
    grad_out: torch.Tensor      # (E, F, ROW)


def make_inputs(shape: BenchShape, device, *, seed: int = 0, dtype=torch.float32) -> StackInputs:
    """Random non-zero inputs for ``shape`` on ``device``, reproducible from ``seed``.

    Weights are drawn by ``MixingStack.reset_parameters`` under a forked RNG
    (the caller's RNG state is left alone); nothing requires grad.
    """
    device = torch.device(device)
    lay = shape.layout
    fork = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=fork):
        torch.manual_seed(seed)
        mod = MixingStack(shape.focus, shape.focus_dim, shape.lmax, shape.layers,
                          shape.apply_alpha, device=device, dtype=dtype)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed + 1)
    kw = dict(generator=gen, device=device, dtype=dtype)
    u0 = torch.randn(shape.focus, shape.edges, lay.row, **kw)
    alpha = torch.rand(shape.edges, shape.focus, **kw) + 0.1
    alpha = alpha / alpha.sum(-1, keepdim=True)
    grad_out = torch.randn(shape.edges, shape.focus, lay.row, **kw)
    return StackInputs(u0, alpha, mod.w0.detach(), mod.w1.detach(), mod.gw.detach(), grad_out)
