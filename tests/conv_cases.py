"""Inputs and runs of the convolution operators' later features: per-stream channel blocks,
per-degree or no radial weights and the degree mix in ``rotate_in``; streams kept apart, edge
weights per stream and head, the destination order and the per-row scale in ``rotate_out_sum``.
Shared by the interpreter's tests (the kernels) and the CPU tests (the reference, the API)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

import mixstack


@dataclass(frozen=True)
class InCase:
    """A ``rotate_in`` call: ``radial`` ``"full"`` / ``"degree"`` / ``None``; ``mix`` ``None``,
    ``"shared"`` (R = 1), ``"channel"`` (R = F*C) or ``"basisR"`` (a rank-R basis); ``streams``:
    ``x`` holds a channel block per stream."""

    N: int
    E: int
    F: int
    C: int
    lmax: int
    radial: str | None = "degree"
    mix: str | None = "basis1"
    streams: bool = True
    weight: bool = True

    def __str__(self) -> str:
        return (f"N{self.N}-E{self.E}-F{self.F}-C{self.C}-l{self.lmax}-rad_{self.radial}-mix_{self.mix}"
                f"{'-streams' if self.streams else ''}{'-ew' if self.weight else ''}")


@dataclass(frozen=True)
class OutCase:
    """A ``rotate_out_sum`` call: ``weight`` ``None``, ``"edge"`` (E,), ``"heads1"`` (E, F) or
    ``"headsH"`` (E, F, H); ``blocks``: streams kept apart; ``order``: ``dst`` unsorted with an
    ``EdgeOrder`` (else sorted); ``scale``: a ``degree_scale``."""

    N: int
    E: int
    F: int
    C: int
    lmax: int
    weight: str | None = "heads2"
    blocks: bool = True
    order: bool = True
    scale: bool = True

    def __str__(self) -> str:
        return (f"N{self.N}-E{self.E}-F{self.F}-C{self.C}-l{self.lmax}-w_{self.weight}"
                f"{'-blocks' if self.blocks else '-sum'}{'-order' if self.order else ''}{'-scale' if self.scale else ''}")


def _indices(n: int, e: int, g) -> tuple[torch.Tensor, torch.Tensor]:
    """``(src, dst)``: half of the edges leave atom 1 and half arrive at atom 0 (runs longer
    than a segment block), the last atom receives none, both in random order."""
    src = torch.randint(0, n, (e,), generator=g)
    src[: e // 2] = 1
    dst = torch.randint(0, max(n - 1, 1), (e,), generator=g)
    dst[: e // 2] = 0
    return src[torch.randperm(e, generator=g)], dst[torch.randperm(e, generator=g)]


def in_inputs(case: InCase, seed: int = 0, *, dtype=torch.float32, device="cpu") -> dict:
    """Seeded inputs of ``case`` (float64 on the CPU, then cast and moved)."""
    g = torch.Generator().manual_seed(seed)
    f64, s = torch.float64, (case.lmax + 1) ** 2
    wide = case.F * case.C if case.streams else case.C
    k = (case.lmax + 1) ** 2 + case.lmax ** 2
    rows = {"full": 2 * case.lmax + 1, "degree": case.lmax + 1}.get(case.radial)
    out = {"x": torch.randn(case.N, s, wide, generator=g, dtype=f64),
           "wigner": torch.randn(case.E, 3, s, generator=g, dtype=f64),
           "radial": None if rows is None else torch.randn(case.E, case.F, rows, case.C, generator=g, dtype=f64),
           "edge_weight": torch.rand(case.E, generator=g, dtype=f64) + 0.1 if case.weight else None,
           "kernel": None, "basis": None}
    if case.mix is not None:
        rank = {"shared": 1, "channel": case.F * case.C}.get(case.mix) or int(case.mix[5:])
        out["kernel"] = torch.randn(case.E, k, rank, generator=g, dtype=f64) / (case.lmax + 1) ** 0.5
        if case.mix.startswith("basis"):
            out["basis"] = torch.randn(rank, case.F * case.C, generator=g, dtype=f64)
    out = {key: None if v is None else v.to(dtype=dtype, device=device) for key, v in out.items()}
    src, _ = _indices(case.N, case.E, g)
    out["src"] = src.to(device)
    return out


IN_FLOATS = ("x", "wigner", "radial", "edge_weight", "kernel", "basis")


def run_in(case: InCase, inp: dict, *, grad_seed: int = 1, basis_grad: bool = False, create_graph: bool = False):
    """``mixstack.rotate_in`` at the active level and the gradients of a seeded weighted sum:
    ``(u, {name: grad}, leaves)`` over the float inputs present (the basis only with
    ``basis_grad``: a basis that needs no gradient leaves the backward on the kernels)."""
    names = [k for k in IN_FLOATS if inp[k] is not None and (k != "basis" or basis_grad)]
    leaves = {k: inp[k].detach().clone().requires_grad_(k in names) if inp[k] is not None else None
              for k in IN_FLOATS}
    mix = None if inp["kernel"] is None else mixstack.DegreeMix(leaves["kernel"], leaves["basis"])
    u = mixstack.rotate_in(leaves["x"], leaves["wigner"], leaves["radial"], inp["src"],
                           edge_weight=leaves["edge_weight"], streams=case.F if case.streams else None, degree_mix=mix)
    gu = torch.randn(u.shape, generator=torch.Generator().manual_seed(grad_seed), dtype=torch.float64).to(u)
    grads = torch.autograd.grad(u, [leaves[k] for k in names], gu, create_graph=create_graph)
    return u, dict(zip(names, grads)), leaves


def out_inputs(case: OutCase, seed: int = 0, *, dtype=torch.float32, device="cpu") -> dict:
    g = torch.Generator().manual_seed(seed)
    f64, s = torch.float64, (case.lmax + 1) ** 2
    row = (3 * case.lmax + 1) * case.C
    heads = () if case.weight in (None, "edge") else (case.F,) if case.weight == "heads1" else (case.F, int(case.weight[5:]))
    out = {"y": torch.randn(case.E, case.F, row, generator=g, dtype=f64),
           "wigner": torch.randn(case.E, 3, s, generator=g, dtype=f64),
           "edge_weight": None if case.weight is None else torch.rand(case.E, *heads, generator=g, dtype=f64) + 0.1,
           "degree_scale": torch.rand(s, generator=g, dtype=f64) + 0.5 if case.scale else None}
    out = {key: None if v is None else v.to(dtype=dtype, device=device) for key, v in out.items()}
    _, dst = _indices(case.N, case.E, g)
    out["dst"] = (dst if case.order else dst.sort().values).to(device)
    return out


def run_out(case: OutCase, inp: dict, *, grad_seed: int = 2, create_graph: bool = False):
    """``mixstack.rotate_out_sum`` at the active level and its backward: ``(out, {name: grad}, leaves)``."""
    names = [k for k in ("y", "wigner", "edge_weight") if inp[k] is not None]
    leaves = {k: inp[k].detach().clone().requires_grad_() for k in names}
    order = mixstack.edge_order(inp["dst"], case.N) if case.order else None
    out = mixstack.rotate_out_sum(leaves["y"], leaves["wigner"], inp["dst"], case.N,
                                  edge_weight=leaves.get("edge_weight"), streams="blocks" if case.blocks else "sum",
                                  order=order, degree_scale=inp["degree_scale"])
    go = torch.randn(out.shape, generator=torch.Generator().manual_seed(grad_seed), dtype=torch.float64).to(out)
    grads = torch.autograd.grad(out, [leaves[k] for k in names], go, create_graph=create_graph)
    return out, dict(zip(names, grads)), leaves
