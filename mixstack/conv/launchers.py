"""Launchers of the convolution's kernels: allocate the outputs, launch, hand back.

Plain Python over tensor metadata (like ``launchers``), so it runs eagerly and inside a
``triton_op`` body being traced.  Inputs arrive float32; ``x``, ``wigner`` and the gradients
contiguous; ``radial``, ``scalar_weight``, ``y`` and the saved focus sum are read through their
strides (unit stride along the channels).  Launch configs: ``configs.conv_config``.
"""

from __future__ import annotations

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


def _scalar_args(edge_scalar, scalar_weight, fill):
    """``(h, sw, sw strides)`` as the rotate-in kernels take them (``fill`` where absent)."""
    if edge_scalar is None:
        return fill, fill, (0, 0, 0)
    if scalar_weight is None:                  # a linear radial layer makes the scalar weights
        return edge_scalar, fill, (0, 0, 0)
    return edge_scalar, scalar_weight, tuple(scalar_weight.stride()[:3])


def _radial_args(radial, linear, cfg: dict, fill):
    """``(radial pointer, its three strides, (hid, lw, lb), edges per program, launch keywords)``
    for the rotate-in kernels: ``radial`` read through its strides, or, with ``linear =
    (hidden (E, H), weight (F, R, C, H), bias (F, R, C))`` contiguous, the radial weights made per
    tile (``LINEAR``; its ``tl.dot`` needs 16 edges and 16 channels at least: ``conv_config``'s
    linear launch).  ``fill`` stands for the unused pointers."""
    if linear is None:
        launch = {"LINEAR": False, "H": 1, "HP": 16, "CP": cfg["CP"], "num_warps": cfg["num_warps"]}
        return radial, tuple(radial.stride()[:3]), (fill, fill, fill), cfg["edge_block"], launch
    hidden_dim = linear[0].shape[1]
    launch = {"LINEAR": True, "H": hidden_dim, "HP": max(16, next_power_of_2(hidden_dim)),
              "CP": max(16, cfg["CP"]), "num_warps": cfg["linear_warps"]}
    return fill, (0, 0, 0), tuple(linear), cfg["linear_block"], launch


def rotate_in_forward(x, wigner, radial, src, edge_scalar, scalar_weight, edge_weight, layout: StackLayout,
                      n_focus: int, linear=None):
    """``u (F, E, ROW)`` (``kernels.rotate_in.rotate_in_kernel``): the radial weights ``radial``
    (read through its strides), or made from ``linear = (hidden, weight, bias)`` (then ``radial``
    and ``scalar_weight`` are ``None``: the weight's rows hold both)."""
    n_edges = wigner.shape[0]
    u = x.new_empty((n_focus, n_edges, layout.row))
    if n_edges == 0:
        return u
    cfg = conv_config(layout)
    h, sw, sw_strides = _scalar_args(edge_scalar, scalar_weight, x)
    rad, rad_strides, factors, block, launch = _radial_args(radial, linear, cfg, x)
    wrap_triton(rotate_in_kernel)[_grid(n_edges, block)](
        x, wigner, rad, src, h, sw, x if edge_weight is None else edge_weight, u, *factors,
        n_edges, n_focus, *rad_strides, *sw_strides,
        LMAX=layout.lmax, C=layout.focus_dim, HAS_SCALAR=edge_scalar is not None,
        HAS_EW=edge_weight is not None, BLOCK_E=block, **launch)
    return u


def rotate_in_backward(grad_u, x, wigner, radial, src, edge_scalar, scalar_weight, edge_weight,
                       layout: StackLayout, needs, linear=None):
    """Gradients ``(x, wigner, radial, edge_scalar, scalar_weight, edge_weight)`` of ``rotate_in``;
    ``needs`` says which (six bools); the others come back empty.  ``grad_u (F, E, ROW)``
    contiguous.  The two edge-scalar gradients come together (one flag in the kernel).  With
    ``linear = (hidden, weight, bias)`` (``radial``, ``scalar_weight`` ``None``) the third
    gradient is the hidden layer's ``(E, H)``: the kernel writes the gradient of the layer's
    whole output ``(E, F, R, C)``, and one product with its weight (``torch.mm``) carries it
    into the hidden layer; the fifth gradient is empty."""
    need_x, need_w, need_rad, need_h, need_sw, need_ew = needs
    need_ew = need_ew and edge_weight is not None
    need_scalar = (need_h or (need_sw and linear is None)) and edge_scalar is not None
    n_edges, n_focus = grad_u.shape[1], grad_u.shape[0]
    lay, cfg = layout, conv_config(layout)
    def empty(shape, need):        # an unused gradient: a distinct empty tensor (outputs must not alias)
        return x.new_empty(shape if need else (0,))
    g_rad = empty(radial.shape if linear is None else (n_edges,) + tuple(linear[2].shape), need_rad)
    g_h = empty(edge_scalar.shape if need_scalar else (0,), need_scalar)
    g_sw = empty(scalar_weight.shape if need_scalar and linear is None else (0,), need_scalar and linear is None)
    g_ew = empty((n_edges,), need_ew)
    g_w = empty(wigner.shape, need_w)
    g_x = torch.zeros_like(x) if need_x and n_edges == 0 else empty(x.shape, need_x)
    if n_edges == 0:
        return g_x, g_w, g_rad if linear is None else empty(linear[0].shape, need_rad), g_h, g_sw, g_ew
    grot = empty((n_edges, lay.row), need_x)
    h, sw, sw_strides = _scalar_args(edge_scalar, scalar_weight, x)
    rad, rad_strides, factors, block, launch = _radial_args(radial, linear, cfg, x)
    wrap_triton(rotate_in_grad_kernel)[_grid(n_edges, block)](
        grad_u, x, wigner, rad, src, h, sw, x if edge_weight is None else edge_weight,
        g_rad if need_rad else x, g_h if need_scalar else x, g_sw if need_scalar and linear is None else x,
        g_ew if need_ew else x, g_w if need_w else x, grot if need_x else x, *factors,
        n_edges, n_focus, *rad_strides, *sw_strides,
        LMAX=lay.lmax, C=lay.focus_dim, HAS_SCALAR=edge_scalar is not None,
        HAS_EW=edge_weight is not None, GRAD_RAD=need_rad, GRAD_SCALAR=need_scalar, GRAD_EW=need_ew,
        GRAD_W=need_w, GRAD_X=need_x, BLOCK_E=block, **launch)
    if linear is not None and need_rad:
        weight = linear[1]
        g_rad = torch.mm(g_rad.view(n_edges, -1), weight.view(-1, weight.shape[-1]))
    if need_x:
        order, ptr = source_order(src, x.shape[0])
        segment_sum(grot, 1, grot.stride(0), 0, wigner, None, ptr, lay, g_x, order=order)
    return g_x, g_w, g_rad, g_h, g_sw, g_ew


def segment_sum(v, n_focus, v_se, v_sf, wigner, edge_weight, ptr, layout: StackLayout, out,
                order=None, vsum=None):
    """``kernels.segment_sum.segment_rotate_back_kernel`` over the ``out.shape[0]`` atoms of ``ptr``."""
    cfg = conv_config(layout)
    n_atoms = out.shape[0]
    if n_atoms == 0:
        return out
    wrap_triton(segment_rotate_back_kernel)[(n_atoms,)](
        v, wigner, v if edge_weight is None else edge_weight, ptr if order is None else order, ptr, out,
        v if vsum is None else vsum, n_focus, v_se, v_sf,
        LMAX=layout.lmax, C=layout.focus_dim, CP=cfg["CP"], NP=cfg["NP"], INDIRECT=order is not None,
        HAS_EW=edge_weight is not None, STORE_VSUM=vsum is not None, BLOCK_E=cfg["segment_block"],
        num_warps=cfg["num_warps"])
    return out


def rotate_out_forward(y, wigner, dst, edge_weight, n_atoms: int, layout: StackLayout, save_sum: bool):
    """``(out (n_atoms, S, C), ys)``: ``ys`` the focus sum ``(E, ROW)`` when ``save_sum``, else empty."""
    n_edges, n_focus = y.shape[0], y.shape[1]
    s = (layout.lmax + 1) ** 2
    out = y.new_zeros((n_atoms, s, layout.focus_dim)) if n_edges == 0 else y.new_empty((n_atoms, s, layout.focus_dim))
    ys = y.new_empty((n_edges, layout.row) if save_sum else (0,))
    if n_edges == 0:
        return out, ys
    ptr = segment_offsets(dst, n_atoms)
    segment_sum(y, n_focus, y.stride(0), y.stride(1), wigner, edge_weight, ptr, layout, out,
                vsum=ys if save_sum else None)
    return out, ys


def rotate_out_backward(grad_out, ys, wigner, dst, edge_weight, layout: StackLayout, needs):
    """``(grad_ys (E, ROW), grad_wigner, grad_edge_weight)`` of ``rotate_out_sum``; ``ys (E, Fs, ROW)``
    is the focus sum (``Fs = 1``) or the stack's result; ``needs``: three bools."""
    need_y, need_w, need_ew = needs
    need_ew = need_ew and edge_weight is not None
    n_edges = wigner.shape[0]
    cfg = conv_config(layout)
    g_y = grad_out.new_empty((n_edges, layout.row) if need_y else (0,))
    g_w = grad_out.new_empty(wigner.shape if need_w else (0,))
    g_ew = grad_out.new_empty((n_edges,) if need_ew else (0,))
    if n_edges == 0:
        return g_y, g_w, g_ew
    wrap_triton(rotate_out_grad_kernel)[_grid(n_edges, cfg["edge_block"])](
        grad_out, wigner, dst, grad_out if edge_weight is None else edge_weight, ys,
        grad_out if not need_y else g_y, grad_out if not need_w else g_w, grad_out if not need_ew else g_ew,
        n_edges, ys.shape[1], ys.stride(0), ys.stride(1),
        LMAX=layout.lmax, C=layout.focus_dim, CP=cfg["CP"], HAS_EW=edge_weight is not None,
        GRAD_YS=need_y, GRAD_W=need_w, GRAD_EW=need_ew, BLOCK_E=cfg["edge_block"], num_warps=cfg["num_warps"])
    return g_y, g_w, g_ew
