"""Launchers of the convolution's kernels: allocate the outputs, launch, hand back.

Plain Python over tensor metadata (like ``stack.launchers``), so it runs eagerly and inside a
``triton_op`` body being traced.  Inputs arrive float32; ``x``, ``wigner``, the degree mix's
tensors and the gradients contiguous; ``radial``, ``scalar_weight``, ``y`` and the saved focus
sum are read through their strides (unit stride along the channels).  Launch configs:
``configs.conv_config``, of the layout whose channels are a tile's lanes (``CW``: every channel
of ``x`` or of the output, all streams' where they are kept in channel blocks).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch.library import wrap_triton

from ..core.layout import StackLayout
from ..kernels.rotate_in import rotate_in_grad_kernel, rotate_in_kernel
from ..kernels.rotate_out import rotate_out_grad_kernel
from ..kernels.segment_sum import segment_rotate_back_kernel
from ..tuning.configs import conv_config, next_power_of_2


def _grid(n: int, block: int) -> tuple:
    return ((n + block - 1) // block,)


def segment_offsets(sorted_index, n: int):
    """CSR offsets ``ptr (n + 1,)`` of a non-decreasing index: segment ``a`` is
    ``ptr[a] .. ptr[a+1] - 1``."""
    return torch.searchsorted(sorted_index, torch.arange(n + 1, device=sorted_index.device,
                                                         dtype=sorted_index.dtype))


def source_order(src, n: int):
    """``(order, ptr)``: the edges grouped by source atom (a stable sort, so each atom's edges keep
    their order) and the CSR offsets of the groups."""
    sorted_src, order = torch.sort(src, stable=True)
    return order, segment_offsets(sorted_src, n)


def _lane_config(layout: StackLayout, wide: int) -> dict:
    """``conv_config`` of the tile whose lanes are ``wide`` channels."""
    return conv_config(StackLayout(layout.lmax, wide))


def _scalar_args(edge_scalar, scalar_weight, fill):
    """``(h, sw, sw strides)`` as the rotate-in kernels take them (``fill`` where absent)."""
    if edge_scalar is None:
        return fill, fill, (0, 0, 0)
    if scalar_weight is None:                  # a linear radial layer makes the scalar weights
        return edge_scalar, fill, (0, 0, 0)
    return edge_scalar, scalar_weight, tuple(scalar_weight.stride()[:3])


class _Mix(NamedTuple):
    """The degree mix as the rotate-in kernels take it: pointers and launch keywords."""

    kernel: torch.Tensor
    basis: torch.Tensor
    launch: dict


def _mix_args(mix, cfg: dict, fill) -> _Mix:
    """``mix = (kernel (E, K, R), basis (R, CW) or None)`` or ``None``: ``MIX`` 0 (none), 1 (one
    kernel for every channel), 2 (one per channel), 3 (a channel basis of rank ``R``)."""
    if mix is None:
        return _Mix(fill, fill, {"MIX": 0, "MIX_R": 1, "NB0": 2, "NB1": 2})
    kernel, basis = mix
    mode = 3 if basis is not None else (1 if kernel.shape[2] == 1 else 2)
    return _Mix(kernel, fill if basis is None else basis,
                {"MIX": mode, "MIX_R": kernel.shape[2] if mode == 3 else 1, "NB0": cfg["NB0"], "NB1": cfg["NB1"]})


def _radial_args(radial, linear, cfg: dict, mixed: bool, fill):
    """``(radial pointer, its three strides, (hid, lw, lb), edges per program, launch keywords)``
    for the rotate-in kernels: ``radial`` read through its strides (``None``: no radial weights),
    or, with ``linear = (hidden (E, H), weight (F, R, C, H), bias (F, R, C))`` contiguous, the
    radial weights made per tile (``LINEAR``; its ``tl.dot`` needs 16 edges and 16 channels at
    least: ``conv_config``'s linear launch).  ``fill`` stands for the unused pointers."""
    if linear is None:
        block = cfg["mix_block"] if mixed else cfg["edge_block"]
        launch = {"LINEAR": False, "H": 1, "HP": 16, "CP": cfg["CP"], "num_warps": cfg["num_warps"]}
        strides = (0, 0, 0) if radial is None else tuple(radial.stride()[:3])
        return fill if radial is None else radial, strides, (fill, fill, fill), block, launch
    hidden_dim = linear[0].shape[1]
    launch = {"LINEAR": True, "H": hidden_dim, "HP": max(16, next_power_of_2(hidden_dim)),
              "CP": max(16, cfg["CP"]), "num_warps": cfg["linear_warps"]}
    return fill, (0, 0, 0), tuple(linear), cfg["linear_block"], launch


def _rotate_in_flags(x, radial, layout: StackLayout, n_focus: int, linear) -> tuple[int, dict]:
    """``(NF, keywords)``: the streams a tile loops over (all of them where every stream reads
    all of ``x``; one where ``x`` holds a channel block per stream and the lanes carry them) and
    the radial weights' flags."""
    wide = x.shape[2]
    per_degree = radial is not None and radial.shape[2] == layout.lmax + 1
    flags = {"LMAX": layout.lmax, "C": layout.focus_dim, "CW": wide, "HAS_RAD": radial is not None or linear is not None,
             "RAD_DEG": per_degree}
    return (1 if wide != layout.focus_dim else n_focus), flags


def rotate_in_forward(x, wigner, radial, src, edge_scalar, scalar_weight, edge_weight, layout: StackLayout,
                      n_focus: int, linear=None, *, mix=None):
    """``u (F, E, ROW)`` (``kernels.rotate_in.rotate_in_kernel``): the radial weights ``radial``
    (read through its strides; ``(E, F, 2*lmax+1, C)``, per degree ``(E, F, lmax+1, C)``, or
    ``None``), or made from ``linear = (hidden, weight, bias)`` (then ``radial`` and
    ``scalar_weight`` are ``None``: the weight's rows hold both); ``x (N, S, F*C)`` with a channel
    block per stream where its channels are not ``layout.focus_dim``; ``mix = (kernel, basis)``."""
    n_edges = wigner.shape[0]
    u = x.new_empty((n_focus, n_edges, layout.row))
    if n_edges == 0:
        return u
    cfg = _lane_config(layout, x.shape[2])
    n_loop, flags = _rotate_in_flags(x, radial, layout, n_focus, linear)
    h, sw, sw_strides = _scalar_args(edge_scalar, scalar_weight, x)
    rad, rad_strides, factors, block, launch = _radial_args(radial, linear, cfg, mix is not None, x)
    mixing = _mix_args(mix, cfg, x)
    wrap_triton(rotate_in_kernel)[_grid(n_edges, block)](
        x, wigner, rad, src, h, sw, x if edge_weight is None else edge_weight, u, *factors,
        mixing.kernel, mixing.basis, n_edges, n_loop, *rad_strides, *sw_strides,
        HAS_SCALAR=edge_scalar is not None, HAS_EW=edge_weight is not None, BLOCK_E=block, **flags,
        **launch, **mixing.launch)
    return u


def rotate_in_backward(grad_u, x, wigner, radial, src, edge_scalar, scalar_weight, edge_weight,
                       layout: StackLayout, needs, linear=None, *, mix=None):
    """Gradients ``(x, wigner, radial, edge_scalar, scalar_weight, edge_weight, mix kernel)`` of
    ``rotate_in``; ``needs`` says which (six or seven bools); the others come back empty.
    ``grad_u (F, E, ROW)`` contiguous.  The two edge-scalar gradients come together (one flag in
    the kernel).  With ``linear = (hidden, weight, bias)`` (``radial``, ``scalar_weight``
    ``None``) the third gradient is the hidden layer's ``(E, H)``: the kernel writes the
    gradient of the layer's whole output ``(E, F, R, C)``, and one product with its weight
    (``torch.mm``) carries it into the hidden layer; the fifth gradient is empty.  The mix's
    basis gets no gradient here (``conv.ops`` runs the reference formulas for it)."""
    need_x, need_w, need_rad, need_h, need_sw, need_ew, need_mix = (tuple(needs) + (False,))[:7]
    need_ew = need_ew and edge_weight is not None
    need_rad = need_rad and (radial is not None or linear is not None)
    need_mix = need_mix and mix is not None
    need_scalar = (need_h or (need_sw and linear is None)) and edge_scalar is not None
    n_edges, n_focus = grad_u.shape[1], grad_u.shape[0]

    def empty(shape, need):        # an unused gradient: a distinct empty tensor (outputs must not alias)
        return x.new_empty(shape if need else (0,))
    g_rad = empty((0,) if not need_rad else radial.shape if linear is None else (n_edges,) + tuple(linear[2].shape),
                  need_rad)
    g_h = empty(edge_scalar.shape if need_scalar else (0,), need_scalar)
    g_sw = empty(scalar_weight.shape if need_scalar and linear is None else (0,), need_scalar and linear is None)
    g_ew = empty((n_edges,), need_ew)
    g_w = empty(wigner.shape, need_w)
    g_mix = empty(mix[0].shape if need_mix else (0,), need_mix)
    g_x = torch.zeros_like(x) if need_x and n_edges == 0 else empty(x.shape, need_x)
    if n_edges == 0:
        if need_mix:
            g_mix.zero_()
        return g_x, g_w, g_rad if linear is None else empty(linear[0].shape, need_rad), g_h, g_sw, g_ew, g_mix
    wide = x.shape[2]
    cfg = _lane_config(layout, wide)
    grot = empty((n_edges, (3 * layout.lmax + 1) * wide), need_x)
    n_loop, flags = _rotate_in_flags(x, radial, layout, n_focus, linear)
    h, sw, sw_strides = _scalar_args(edge_scalar, scalar_weight, x)
    rad, rad_strides, factors, block, launch = _radial_args(radial, linear, cfg, mix is not None, x)
    mixing = _mix_args(mix, cfg, x)
    wrap_triton(rotate_in_grad_kernel)[_grid(n_edges, block)](
        grad_u, x, wigner, rad, src, h, sw, x if edge_weight is None else edge_weight,
        g_rad if need_rad else x, g_h if need_scalar else x, g_sw if need_scalar and linear is None else x,
        g_ew if need_ew else x, g_w if need_w else x, grot if need_x else x, *factors,
        mixing.kernel, mixing.basis, g_mix if need_mix else x,
        n_edges, n_loop, *rad_strides, *sw_strides,
        HAS_SCALAR=edge_scalar is not None, HAS_EW=edge_weight is not None, GRAD_RAD=need_rad,
        GRAD_SCALAR=need_scalar, GRAD_EW=need_ew, GRAD_W=need_w, GRAD_X=need_x, BLOCK_E=block,
        GRAD_MIX=need_mix, **flags, **launch, **mixing.launch)
    if linear is not None and need_rad:
        weight = linear[1]
        g_rad = torch.mm(g_rad.view(n_edges, -1), weight.view(-1, weight.shape[-1]))
    if need_x:
        order, ptr = source_order(src, x.shape[0])
        segment_sum(grot, 1, grot.stride(0), 0, wigner, None, ptr, StackLayout(layout.lmax, wide), g_x, order=order)
    return g_x, g_w, g_rad, g_h, g_sw, g_ew, g_mix


def _edge_weight_args(edge_weight, fill) -> tuple:
    """``(pointer, keywords)`` of the edge weights: none, ``(E,)``, or ``(E, F, H)`` per stream and head."""
    if edge_weight is None:
        return fill, {"EW": 0, "HEADS": 1, "NG": 1}
    if edge_weight.dim() == 1:
        return edge_weight, {"EW": 1, "HEADS": 1, "NG": 1}
    return edge_weight, {"EW": 2, "HEADS": edge_weight.shape[2], "NG": edge_weight.shape[1] * edge_weight.shape[2]}


def segment_sum(v, n_focus, v_se, v_sf, wigner, edge_weight, ptr, layout: StackLayout, out,
                order=None, vsum=None, degree_scale=None):
    """``kernels.segment_sum.segment_rotate_back_kernel`` over the ``out.shape[0]`` atoms of
    ``ptr``; ``out (N, S, CW)``: ``CW`` lanes, the streams' channel blocks where it is not
    ``layout.focus_dim`` (then ``n_focus`` is 1)."""
    cfg = _lane_config(layout, out.shape[2])
    n_atoms = out.shape[0]
    if n_atoms == 0:
        return out
    ew, ew_flags = _edge_weight_args(edge_weight, v)
    wrap_triton(segment_rotate_back_kernel)[(n_atoms,)](
        v, wigner, ew, v if degree_scale is None else degree_scale, ptr if order is None else order, ptr, out,
        v if vsum is None else vsum, n_focus, v_se, v_sf,
        LMAX=layout.lmax, C=layout.focus_dim, CW=out.shape[2], CP=cfg["CP"], NP=cfg["NP"],
        INDIRECT=order is not None, HAS_DS=degree_scale is not None, STORE_VSUM=vsum is not None,
        BLOCK_E=cfg["segment_block"], num_warps=cfg["num_warps"], **ew_flags)
    return out


def rotate_out_forward(y, wigner, dst, edge_weight, n_atoms: int, layout: StackLayout, save_sum: bool, *,
                       blocks: bool = False, order=None, degree_scale=None):
    """``(out (n_atoms, S, C), ys)``: ``ys`` the focus sum ``(E, ROW)`` when ``save_sum``, else
    empty.  ``blocks``: the streams kept apart, ``out (n_atoms, S, F*C)`` (no focus sum).
    ``order = (perm, offsets)``: each atom's edges at ``perm[offsets[a]:offsets[a+1]]``; else
    ``dst`` is non-decreasing.  ``degree_scale (S,)`` multiplies each output row."""
    n_edges, n_focus = y.shape[0], y.shape[1]
    s = (layout.lmax + 1) ** 2
    wide = layout.focus_dim * (n_focus if blocks else 1)
    out = (y.new_zeros if n_edges == 0 else y.new_empty)((n_atoms, s, wide))
    save_sum = save_sum and not blocks
    ys = y.new_empty((n_edges, layout.row) if save_sum else (0,))
    if n_edges == 0:
        return out, ys
    if order is None:
        perm, ptr = None, segment_offsets(dst, n_atoms)
    else:
        perm, ptr = order
    segment_sum(y, 1 if blocks else n_focus, y.stride(0), y.stride(1), wigner, edge_weight, ptr, layout, out,
                order=perm, vsum=ys if save_sum else None, degree_scale=degree_scale)
    return out, ys


def rotate_out_backward(grad_out, ys, wigner, dst, edge_weight, layout: StackLayout, needs, *,
                        blocks: bool = False, degree_scale=None):
    """``(grad_ys, grad_wigner, grad_edge_weight)`` of ``rotate_out_sum``; ``ys (E, Fs, ROW)``
    is the focus sum (``Fs = 1``) or the stack's result; ``needs``: three bools.  ``grad_ys``
    is ``(E, ROW)`` (every stream's), or ``(E, F, ROW)`` with ``blocks``.  ``degree_scale``
    is folded into ``grad_out`` first (a pass over the atoms' rows)."""
    need_y, need_w, need_ew = needs
    need_ew = need_ew and edge_weight is not None
    n_edges, n_focus = wigner.shape[0], ys.shape[1]
    wide = grad_out.shape[2]
    cfg = _lane_config(layout, wide)
    g_y = grad_out.new_empty(((n_edges, n_focus, layout.row) if blocks else (n_edges, layout.row)) if need_y
                             else (0,))
    g_w = grad_out.new_empty(wigner.shape if need_w else (0,))
    g_ew = grad_out.new_empty(edge_weight.shape if need_ew else (0,))
    if n_edges == 0:
        return g_y, g_w, g_ew
    if degree_scale is not None:
        grad_out = (grad_out * degree_scale[None, :, None]).contiguous()
    ew, ew_flags = _edge_weight_args(edge_weight, grad_out)
    gy_strides = (g_y.stride(0), g_y.stride(1) if blocks else 0) if need_y else (0, 0)
    wrap_triton(rotate_out_grad_kernel)[_grid(n_edges, cfg["edge_block"])](
        grad_out, wigner, dst, ew, ys,
        grad_out if not need_y else g_y, grad_out if not need_w else g_w, grad_out if not need_ew else g_ew,
        n_edges, 1 if blocks else n_focus, ys.stride(0), ys.stride(1), *gy_strides,
        LMAX=layout.lmax, C=layout.focus_dim, CW=wide, CP=cfg["CP"], GRAD_YS=need_y, GRAD_W=need_w,
        GRAD_EW=need_ew, BLOCK_E=cfg["edge_block"], num_warps=cfg["num_warps"], **ew_flags)
    return g_y, g_w, g_ew
