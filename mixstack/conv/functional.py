"""``mixstack.rotate_in`` and ``mixstack.rotate_out_sum``: the SO(2) convolution's rotations around
the stack, and ``mixstack.edge_wigner``, the packed Wigner rows they read, at the active level
(docs/contract.md §7).

Level 0, or a tensor the kernels cannot take, runs ``mixstack.reference.rotate_in`` /
``rotate_out_sum`` (plain PyTorch, any float dtype); levels 1-3 run the ``mixstack::`` operators
(``conv.ops``): Triton kernels forward and backward, deterministic (rotate-out sums each atom's
edges in their order; rotate-in's node-feature gradient sums each source atom's edges in theirs;
no atomics), the same bits at levels 1, 2 and 3.  ``edge_wigner`` runs ``mixstack::edge_wigner``
(``conv.wigner_ops``) there: one kernel from the edge vectors to the packed rows, one back.
"""

from __future__ import annotations

import math

import torch

from ..dispatch.guards import conv_level, triton_installed
from ..dispatch.log import record
from . import reference as conv_reference
from .frames import edge_wigner_reference
from .layout import EdgeOrder, LinearRadial, validate_edge_wigner, validate_rotate_in, validate_rotate_out_sum

if triton_installed():
    from . import ops as _ops  # noqa: F401  (registers the mixstack:: operators)
    from . import wigner_ops as _wigner_ops


def kernels_active(t: torch.Tensor, channels: int) -> bool:
    """Whether the convolution operators run their kernels for tensors like ``t`` with
    ``channels`` channels at the active level (a model picks its code path with this)."""
    return conv_level(t, channels) > 0


def _record_backward(name):
    def hook(grad):
        record(name)
        return grad
    return hook


def rotate_in(x, wigner, radial, src, *, edge_scalar=None, scalar_weight=None, edge_weight=None, streams=None,
              degree_mix=None):
    """Gather, rotate into the edge frame and scale: the stack's input ``u (F, E, ROW)``.

    ``x (N, S, C)`` node features (``S = (lmax+1)^2``, degree ``l`` at rows ``l^2 .. l^2+2l``);
    ``wigner (E, 3, S)`` the packed rows ``m = -1, 0, +1`` of each edge's real Wigner matrices;
    ``radial (E, F, 2*lmax+1, C)`` the weights of the m = 0 subtiles (degrees 0..lmax) then of
    the |m| = 1 pairs (degrees 1..lmax, one weight for m = -1 and m = +1), or ``(E, F, lmax+1,
    C)`` one weight per degree (the |m| = 1 pair of degree ``l`` reads row ``l``), or ``None``
    (no radial scaling); ``src (E,)`` the source atom of each edge; ``edge_scalar (E, C)`` and
    ``scalar_weight (E, F, lmax+1, C)`` (optional, together) add ``scalar_weight[e, f, l] *
    edge_scalar[e]`` to the m = 0 subtile of degree ``l`` (an invariant of the edge, such as a
    function of both atoms' scalars); ``edge_weight (E,)`` (optional) scales the row.  ``radial``
    and ``scalar_weight`` are read through their strides (views of one network output cost no
    copy).  Differentiable in every tensor but ``src``, to any order.

    ``streams=F``: ``x (N, S, F*C)`` holds one channel block per focus stream, stream ``f``
    reading ``x[..., f*C:(f+1)*C]`` (by default every stream reads all of ``x``); ``F`` is
    ``radial``'s, or ``streams``, or 1.  ``degree_mix=DegreeMix(kernel (E, K, R), basis (R, F*C) or
    None)``: after the scaling, the degrees of each order block are mixed per edge and channel
    (SeZM's radial degree mixer; ``mixstack.DegreeMix`` says how), in the kernel, before the
    store; it needs ``streams=F`` or one stream.  A backward that wants the basis' gradient
    (training) runs the reference formulas.

    ``radial`` may instead be a ``LinearRadial(hidden, weight, bias)``, the linear layer that
    makes the radial weights (and, with ``edge_scalar``, the scalar weights as its last
    ``lmax + 1`` rows; ``scalar_weight`` is then ``None``): the kernels make each tile where they
    read it, so the ``(E, F, rows, C)`` weights never exist, forward or backward.  A backward
    that wants the layer's own ``weight`` or ``bias``, or builds a graph, runs the reference
    formulas (``conv_in_bwd:reference``).
    """
    validate_rotate_in(x, wigner, radial, src, edge_scalar, scalar_weight, edge_weight, streams, degree_mix)
    level = conv_level(x, x.shape[2])
    if isinstance(radial, LinearRadial) and level > 0:
        return torch.ops.mixstack.rotate_in_linear(x, wigner, *radial, src, edge_scalar, edge_weight, level)
    if level == 0:
        record("conv_in:reference")
        out = conv_reference.rotate_in(x, wigner, radial, src, edge_scalar=edge_scalar,
                                       scalar_weight=scalar_weight, edge_weight=edge_weight, streams=streams,
                                       degree_mix=degree_mix)
        if out.requires_grad and not torch.compiler.is_compiling():
            out.register_hook(_record_backward("conv_in_bwd:reference"))
        return out
    if streams in (None, 1) and degree_mix is None and radial is not None:
        return torch.ops.mixstack.rotate_in(x, wigner, radial, src, edge_scalar, scalar_weight, edge_weight, level)
    kernel, basis = (None, None) if degree_mix is None else degree_mix
    return torch.ops.mixstack.rotate_in(x, wigner, radial, src, edge_scalar, scalar_weight, edge_weight, level,
                                        streams or 0, kernel, basis)


def edge_order(dst, n_atoms: int) -> EdgeOrder:
    """The edges grouped by destination atom, for ``rotate_out_sum(order=...)``: ``perm`` a stable
    argsort of ``dst (E,)`` and the CSR ``offsets (n_atoms+1,)`` of each atom's run.  No device
    synchronisation (a sort and a search); build it once per frame and share it between calls."""
    if not isinstance(dst, torch.Tensor) or dst.dtype not in (torch.int64, torch.int32) or dst.dim() != 1:
        raise TypeError(f"dst must be a 1-d int64 or int32 tensor, got {type(dst).__name__}"
                        + (f" {dst.dtype} of shape {tuple(dst.shape)}" if isinstance(dst, torch.Tensor) else ""))
    if isinstance(n_atoms, bool) or not isinstance(n_atoms, (int, torch.SymInt)) or n_atoms < 0:
        raise ValueError(f"n_atoms must be an int >= 0, got {n_atoms!r}")
    sorted_dst, perm = torch.sort(dst, stable=True)
    offsets = torch.searchsorted(sorted_dst, torch.arange(n_atoms + 1, device=dst.device, dtype=dst.dtype))
    return EdgeOrder(perm, offsets)


def rotate_out_sum(y, wigner, dst, n_atoms: int, *, edge_weight=None, keep_input: bool = True, streams: str = "sum",
                   order=None, degree_scale=None):
    """Rotate the stack's result back, sum the focus streams and sum at the destination atoms:
    ``(n_atoms, S, C)``.

    ``y (E, F, ROW)`` the stack's result; ``wigner (E, 3, S)`` as for ``rotate_in``; ``dst (E,)``
    the destination atom of each edge, **non-decreasing** (edges sorted by destination: the
    kernels sum each atom's edges as one contiguous run, in order) unless ``order`` is given;
    ``edge_weight (E,)`` (optional) scales each edge's message.  ``keep_input=False`` (inference)
    keeps only the focus sum ``(E, ROW)`` for the backward instead of ``y``; a double backward
    then raises.

    ``streams="blocks"``: the streams kept apart, ``(n_atoms, S, F*C)`` with stream ``f`` in
    channels ``[f*C, (f+1)*C)``; ``edge_weight`` may then be ``(E, F)`` per stream or ``(E, F, H)``
    per stream and head (head ``h`` scales its stream's channels ``[h*C/H, (h+1)*C/H)``; ``H``
    divides ``C``): one launch for every stream and head.  ``order=edge_order(dst, n_atoms)``:
    ``dst`` in any order, each atom's edges walked through ``order.perm`` in a fixed order (no
    argsort or gather for the caller).  ``degree_scale (S,)`` multiplies output row ``s`` (a
    constant: no gradient).
    """
    validate_rotate_out_sum(y, wigner, dst, n_atoms, edge_weight, streams, order, degree_scale)
    blocks = streams == "blocks"
    if edge_weight is not None and edge_weight.dim() == 2:
        edge_weight = edge_weight.unsqueeze(2)
    channels = y.shape[2] // (3 * (math.isqrt(wigner.shape[2]) - 1) + 1) * (y.shape[1] if blocks else 1)
    level = conv_level(y, channels)
    if level == 0:
        record("conv_out:reference")
        out = conv_reference.rotate_out_sum(y, wigner, dst, n_atoms, edge_weight=edge_weight, streams=streams,
                                            order=order, degree_scale=degree_scale)
        if out.requires_grad and not torch.compiler.is_compiling():
            out.register_hook(_record_backward("conv_out_bwd:reference"))
        return out
    save_sum = not keep_input
    if not blocks and order is None and degree_scale is None:
        out, _ = torch.ops.mixstack.rotate_out_sum(y, wigner, dst, edge_weight, n_atoms, save_sum, level)
        return out
    perm, offsets = (None, None) if order is None else order
    out, _ = torch.ops.mixstack.rotate_out_sum(y, wigner, dst, edge_weight, n_atoms, save_sum, level, blocks, perm,
                                               offsets, degree_scale)
    return out


def edge_wigner_constants(lmax: int, device=None) -> torch.Tensor:
    """The constants ``edge_wigner``'s kernels read for ``lmax`` (float32, on ``device``): a
    module that calls ``edge_wigner`` may keep them as a buffer and pass them as ``constants``,
    so a traced or exported graph takes them as an input.  Empty where Triton is not installed
    (the kernels never run there)."""
    if not triton_installed():
        return torch.zeros(0, device=device)
    return _wigner_ops.packed_steps(lmax).to(device)


def edge_wigner(vec, lmax: int, *, constants=None, convention: str = "mixstack"):
    """The packed Wigner rows ``(E, 3, (lmax+1)^2)`` of the edges ``vec (E, 3)``: the ``wigner``
    argument of ``rotate_in`` and ``rotate_out_sum``.

    Per edge, the rotation ``R`` with rows ``(x', y', r_hat)`` (``r_hat = vec / |vec|``; ``x'``
    from the coordinate axis least aligned with the edge, the first on a tie) and the rows
    ``m = -1, 0, +1`` of its real Wigner matrices ``D^l(R)``, ``l = 0..lmax``, by the
    Ivanic-Ruedenberg recursion (``mixstack.conv.frames``).  Differentiable in ``vec`` to any order.
    Levels 1-3 (float32, where the kernels run): one kernel forward, one backward; ``constants``
    is ``edge_wigner_constants(lmax, vec.device)`` (built and kept per device when not given).

    ``convention="sezm"``: the rows in the real-harmonic signs of deepmd-kit's SeZM (DPA4),
    ``mixstack.conv.frames.convention_signs(lmax) * `` mixstack's (the kernels fold the signs into
    their stores: no extra pass); features rotated in and out with these rows follow SeZM's
    basis (docs/deepmd.md).
    """
    validate_edge_wigner(vec, lmax, convention)
    level = conv_level(vec, 1)
    if level == 0:
        record("wigner:reference")
        out = edge_wigner_reference(vec, lmax, convention=convention)
        if out.requires_grad and not torch.compiler.is_compiling():
            out.register_hook(_record_backward("wigner_bwd:reference"))
        return out
    if constants is None:
        constants = _wigner_ops.steps_on(lmax, vec.device)
    if convention == "sezm":
        return torch.ops.mixstack.edge_wigner(vec, constants, lmax, level, True)
    return torch.ops.mixstack.edge_wigner(vec, constants, lmax, level)
