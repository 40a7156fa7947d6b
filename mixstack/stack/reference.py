"""The mixing stack in plain PyTorch: level 0 and the oracle of every test.

``mixing_stack`` is the operator of docs/contract.md §1 written with ordinary tensor ops,
for any float dtype and device, differentiable to any order by autograd.
``forward`` also returns the gated pre-activations ``z`` that the accelerated
backward reads, ``backward`` spells out the first-order gradients of
docs/contract.md §1 from those saved values, and ``double_backward`` the derivative of
that backward (docs/contract.md §1, "Double backward").  Both are made of ordinary ops, so
autograd differentiates them again: they are the custom operators' CPU branches and the
differentiable fallbacks of the guards of docs/contract.md §4 ("Training").
"""

from __future__ import annotations

import torch

from ..core.layout import StackLayout, validate_inputs
from .values import Saved, StackSpec, Weights


def _gates(s: torch.Tensor, gw_k: torch.Tensor) -> torch.Tensor:
    """Gate sigmoids ``sigmoid(s @ gw_k)``, batched over focus streams."""
    return torch.sigmoid(torch.matmul(s, gw_k))


def _gated_activation(z: torch.Tensor, sg: torch.Tensor, lay: StackLayout) -> torch.Tensor:
    """``[silu(s) | z0[:, Cf:] * sg | z1 * [sg | sg]]`` for one gated layer."""
    cf, m0 = lay.focus_dim, lay.m0
    s = z[..., :cf]
    return torch.cat((s * torch.sigmoid(s), z[..., cf:m0] * sg, z[..., m0:] * torch.cat((sg, sg), -1)), -1)


def _block_linear(u: torch.Tensor, w0_k: torch.Tensor, w1_k: torch.Tensor, m0: int) -> torch.Tensor:
    """``[u[:, :m0] @ w0_k | u[:, m0:] @ w1_k]``, the block-diagonal SO(2) linear."""
    return torch.cat((torch.matmul(u[..., :m0], w0_k), torch.matmul(u[..., m0:], w1_k)), -1)


def _block_linear_t(g: torch.Tensor, w0_k: torch.Tensor, w1_k: torch.Tensor, m0: int) -> torch.Tensor:
    """The transpose of ``_block_linear``: ``[g0 @ w0_k^T | g1 @ w1_k^T]``."""
    return _block_linear(g, w0_k.transpose(-1, -2), w1_k.transpose(-1, -2), m0)


def forward_state(u0, alpha, w0, w1, gw, *, lmax: int, focus_dim: int, apply_alpha: bool = True):
    """Run the stack; return ``(result, z, y)``.

    ``result (E, F, ROW)``, ``z (n_gated, F, E, ROW)`` the gated pre-activations
    and ``y (E, F, ROW)`` the result before the alpha weight (``result`` itself
    without alpha).  Inputs are assumed valid (see ``layout.validate_inputs``).
    """
    lay = StackLayout(lmax, focus_dim)
    m0, cf = lay.m0, focus_dim
    n_gated = w0.shape[0] - 1
    u = u0
    zs = []
    for k in range(n_gated):
        z = _block_linear(u, w0[k], w1[k], m0)
        sg = _gates(z[..., :cf], gw[k])
        u = u + _gated_activation(z, sg, lay)
        zs.append(z)
    y = u + _block_linear(u, w0[n_gated], w1[n_gated], m0)
    out = y * alpha.transpose(0, 1).unsqueeze(-1) if apply_alpha else y
    z_all = torch.stack(zs) if zs else u0.new_empty((0,) + tuple(u0.shape))
    return out.transpose(0, 1), z_all, y.transpose(0, 1)


def forward(u0, alpha, w0, w1, gw, *, lmax: int, focus_dim: int, apply_alpha: bool = True):
    """Run the stack; return ``(result (E, F, ROW), z (n_gated, F, E, ROW))``."""
    return forward_state(u0, alpha, w0, w1, gw, lmax=lmax, focus_dim=focus_dim,
                         apply_alpha=apply_alpha)[:2]


def mixing_stack(u0, alpha, w0, w1, gw, *, lmax: int, focus_dim: int, apply_alpha: bool = True):
    """The gated SO(2) mixing stack in plain PyTorch (level 0).

    Same signature and result as ``mixstack.mixing_stack``: ``u0 (F, E, ROW)``,
    ``alpha (E, F)``, ``w0 (n_layers, F, m0, m0)``, ``w1 (n_layers, F, m1, m1)``,
    ``gw (n_layers - 1, F, focus_dim, G)``; returns ``(E, F, ROW)``.
    """
    validate_inputs(u0, alpha, w0, w1, gw, lmax=lmax, focus_dim=focus_dim)
    return forward(u0, alpha, w0, w1, gw, lmax=lmax, focus_dim=focus_dim, apply_alpha=apply_alpha)[0]


def _gate_cotangents(g, z, sg, gw_k, lay: StackLayout):
    """One gated layer's first-order cotangents from ``g``, the cotangent of its output:
    ``(gz, gl)``, the cotangent of its pre-activations ``z`` (docs/contract.md §1, with the
    gate-logit contraction folded into the scalar columns) and the gate-logit gradient."""
    cf, m0 = lay.focus_dim, lay.m0
    s = z[..., :cf]
    s0 = torch.sigmoid(s)
    g_s, g_0, g_1 = g[..., :cf], g[..., cf:m0], g[..., m0:]
    gz_s = g_s * s0 * (1 + s * (1 - s0))
    gz_1 = g_1 * torch.cat((sg, sg), -1)
    gl = _gate_sum(g, z, lay) * sg * (1 - sg)
    gz_s = gz_s + torch.matmul(gl, gw_k.transpose(-1, -2))
    return torch.cat((gz_s, g_0 * sg, gz_1), -1), gl


def _gate_sum(g, z, lay: StackLayout):
    """``g[:, Cf:m0] * z[:, Cf:m0]`` plus both |m| = 1 halves of ``g[:, m0:] * z[:, m0:]``: the
    cotangent of the gate sigmoids, for any pair of rows (``z`` or its tangent)."""
    cf, m0, gwid = lay.focus_dim, lay.m0, lay.gate_width
    prod1 = g[..., m0:] * z[..., m0:]
    return g[..., cf:m0] * z[..., cf:m0] + (prod1[..., :gwid] + prod1[..., gwid:])


def _layer_inputs(u0, z_all, sgs, lay: StackLayout):
    """The input ``u_k`` of every layer (the identity layer's last), rebuilt from ``u0`` and ``z``."""
    inputs = [u0]
    for k in range(len(sgs)):
        inputs.append(inputs[-1] + _gated_activation(z_all[k], sgs[k], lay))
    return inputs


def _block_outer(a, b, m0):
    """``(a[:, :m0]^T @ b[:, :m0], a[:, m0:]^T @ b[:, m0:])``: a layer's block-weight gradients
    from its input rows ``a`` and the cotangent rows ``b`` of its output, summed over the edges."""
    return (torch.matmul(a[..., :m0].transpose(-1, -2), b[..., :m0]),
            torch.matmul(a[..., m0:].transpose(-1, -2), b[..., m0:]))


def backward(grad_out, y, z_all, u0, alpha, w0, w1, gw, *, lmax: int, focus_dim: int,
             apply_alpha: bool, weights: bool = False):
    """First-order gradients of docs/contract.md §1 from the saved ``z`` and unscaled result ``y``.

    Returns ``(grad_u0, grad_alpha, grad_w0, grad_w1, grad_gw)``; ``grad_alpha``
    is ``None`` without alpha and the weight gradients are ``None`` unless
    ``weights``.  ``y (E, F, ROW)`` is the result before alpha (read only for
    ``grad_alpha``); ``u0`` is read only for weight gradients (the layer inputs
    are rebuilt from it and ``z``).  ``backward_state`` is the same with the chain, and
    with the cotangents of the saved ``z`` and ``y`` that the double backward hands back.
    """
    return backward_state(grad_out, Saved(z_all, y, alpha, u0), Weights(w0, w1, gw),
                          StackSpec.of(lmax, focus_dim, apply_alpha), weight_grads=weights)[:5]


def backward_state(grad_out, saved: Saved, weights: Weights, spec: StackSpec, *, weight_grads: bool = False,
                   grad_z=None, grad_y=None):
    """``backward`` and the chain: ``(grad_u0, grad_alpha, grad_w0, grad_w1, grad_gw, chain)``,
    where ``chain (n_gated, F, E, ROW)`` holds, at ``k``, the cotangent of layer ``k``'s output
    (``h_{k+1}`` of docs/contract.md §1, double backward), which the double backward reads.
    ``weight_grads``: the weight gradients (``saved.u0`` needed; else ``None``).  ``grad_z``
    ``(n_gated, F, E, ROW)`` and ``grad_y`` ``(E, F, ROW)``: cotangents of the saved ``z`` and
    ``y`` themselves (what the double backward hands back, docs/contract.md §1), added where
    those values enter the chain; ``None``: zero."""
    lay = spec.layout
    m0, cf = lay.m0, lay.focus_dim
    z_all, w0, w1, gw = saved.z, weights.w0, weights.w1, weights.gw
    n_gated = weights.n_gated
    g = grad_out.transpose(0, 1)                      # focus-major (F, E, ROW)
    grad_alpha = None
    if spec.apply_alpha:
        a = saved.alpha.transpose(0, 1).unsqueeze(-1)
        grad_alpha = (grad_out * saved.y).sum(-1)
        g = g * a
    if grad_y is not None:
        g = g + grad_y.transpose(0, 1)

    sgs = [_gates(z_all[k][..., :cf], gw[k]) for k in range(n_gated)]
    inputs = _layer_inputs(saved.u0, z_all, sgs, lay) if weight_grads else None
    dw0 = [None] * (n_gated + 1)
    dw1 = [None] * (n_gated + 1)
    dgw = [None] * n_gated
    chain = [None] * n_gated
    if weight_grads:
        dw0[n_gated], dw1[n_gated] = _block_outer(inputs[n_gated], g, m0)
    g = g + _block_linear_t(g, w0[n_gated], w1[n_gated], m0)
    for k in range(n_gated - 1, -1, -1):
        chain[k] = g
        gz, gl = _gate_cotangents(g, z_all[k], sgs[k], gw[k], lay)
        if grad_z is not None:
            gz = gz + grad_z[k]
        if weight_grads:
            dw0[k], dw1[k] = _block_outer(inputs[k], gz, m0)
            dgw[k] = torch.matmul(z_all[k][..., :cf].transpose(-1, -2), gl)
        g = g + _block_linear_t(gz, w0[k], w1[k], m0)
    chain = torch.stack(chain) if n_gated else g.new_empty((0,) + tuple(g.shape))
    if not weight_grads:
        return g, grad_alpha, None, None, None, chain
    grad_gw = torch.stack(dgw) if n_gated else gw.new_zeros(gw.shape)
    return g, grad_alpha, torch.stack(dw0), torch.stack(dw1), grad_gw, chain


def _silu_slope(s):
    """``silu'(s) = s0 * (1 + s * (1 - s0))``, ``s0 = sigmoid(s)``."""
    s0 = torch.sigmoid(s)
    return s0 * (1 + s * (1 - s0))


def _silu_curvature(s):
    """``silu''(s) = s0 * (1 - s0) * (2 + s * (1 - 2 * s0))``."""
    s0 = torch.sigmoid(s)
    return s0 * (1 - s0) * (2 + s * (1 - 2 * s0))


def double_backward(v, w, grad_out, y, z_all, alpha, w0, w1, gw, *, lmax: int, focus_dim: int,
                    apply_alpha: bool):
    """The derivative of the first-order backward (docs/contract.md §1, "Double backward").

    ``backward`` maps ``(grad_out, y, z, alpha, w0, w1, gw)`` to ``(grad_u0, grad_alpha)``;
    this returns the gradients of ``<grad_u0, v> + <grad_alpha, w>`` with respect to those
    inputs, ``(d_grad_out, d_y, d_z, d_alpha, d_w0, d_w1, d_gw)`` (``d_y`` and ``d_alpha``
    ``None`` without alpha, ``d_y`` also without ``w``).  ``v (F, E, ROW)`` and ``w (E, F)`` may
    be ``None`` (zero).  ``z`` and ``y`` count as inputs here: their own dependence on ``u0`` and
    the weights is the forward's, which the forward's backward adds when it receives ``d_z``
    and ``d_y``.  ``double_backward_from`` is the same from the saved values, with a chain
    already computed or without the weight terms.
    """
    return double_backward_from(v, w, grad_out, Saved(z_all, y, alpha), Weights(w0, w1, gw),
                                StackSpec.of(lmax, focus_dim, apply_alpha))


def double_backward_from(v, w, grad_out, saved: Saved, weights: Weights, spec: StackSpec, *, chain=None,
                         weight_grads: bool = True):
    """``double_backward`` from the saved ``z``, ``y`` and ``alpha``: ``chain`` what
    ``backward_state`` returns (``None``: computed here); the weight terms ``None`` unless
    ``weight_grads``.

    The pass runs forwards, layer by layer, a tangent ``u_dot`` of the layer inputs along
    ``v`` (the forward's Jacobian applied to ``v``, with every weight and ``z`` held):
    ``z_dot = u_dot @ W``, ``t_dot = s_dot @ gw``, ``sg_dot = sg (1 - sg) t_dot``; the
    cotangent ``h`` of each layer's output comes from the chain.  At alpha, ``y_dot``.
    """
    lay = spec.layout
    n_gated = weights.n_gated
    g_top = grad_out.transpose(0, 1)
    if spec.apply_alpha:
        g_top = g_top * saved.alpha.transpose(0, 1).unsqueeze(-1)
    if chain is None and n_gated:
        chain = backward_state(grad_out, saved, weights, spec)[5]
    u_dot = v if v is not None else g_top.new_zeros(g_top.shape)
    d_z, dws = [], []
    for k in range(n_gated):
        u_dot, d_z_k, dw_k = _tangent_layer(u_dot, saved.z[k], chain[k], weights, k, lay, weight_grads)
        d_z.append(d_z_k)
        dws.append(dw_k)
    y_dot = u_dot + _block_linear(u_dot, weights.w0[n_gated], weights.w1[n_gated], lay.m0)
    if weight_grads:
        dws.append(_block_outer(u_dot, g_top, lay.m0))
    d_grad_out, d_y, d_alpha = _identity_tangent(y_dot.transpose(0, 1), w, grad_out, saved, spec.apply_alpha)
    d_z = torch.stack(d_z) if n_gated else saved.z.new_zeros(saved.z.shape)
    if not weight_grads:
        return d_grad_out, d_y, d_z, d_alpha, None, None, None
    grad_gw = torch.stack([dgw for _, _, dgw in dws[:n_gated]]) if n_gated else weights.gw.new_zeros(weights.gw.shape)
    return (d_grad_out, d_y, d_z, d_alpha, torch.stack([dw[0] for dw in dws]), torch.stack([dw[1] for dw in dws]),
            grad_gw)


def _tangent_layer(u_dot, z, h, weights: Weights, k: int, lay: StackLayout, weight_grads: bool):
    """Gated layer ``k`` of the pass along ``v``: ``(u_dot of the next layer, d_z[k], (dw0[k],
    dw1[k], dgw[k]) or None)`` from this layer's tangent input ``u_dot``, its ``z`` and the
    cotangent ``h`` of its output."""
    m0, cf = lay.m0, lay.focus_dim
    gw_k = weights.gw[k]
    s = z[..., :cf]
    z_dot = _block_linear(u_dot, weights.w0[k], weights.w1[k], m0)
    s_dot = z_dot[..., :cf]
    sg = _gates(s, gw_k)
    slope = sg * (1 - sg)                                   # sigmoid' at the logits
    t_dot = torch.matmul(s_dot, gw_k)
    sg_dot = slope * t_dot
    gz, gl = _gate_cotangents(h, z, sg, gw_k, lay)
    curv = _gate_sum(h, z_dot, lay) * slope + _gate_sum(h, z, lay) * t_dot * slope * (1 - 2 * sg)
    sg_dot2 = torch.cat((sg_dot, sg_dot), -1)
    d_z = torch.cat((h[..., :cf] * s_dot * _silu_curvature(s) + torch.matmul(curv, gw_k.transpose(-1, -2)),
                     h[..., cf:m0] * sg_dot, h[..., m0:] * sg_dot2), -1)
    dw = None
    if weight_grads:
        dw = (*_block_outer(u_dot, gz, m0), torch.matmul(s_dot.transpose(-1, -2), gl) + torch.matmul(s.transpose(-1, -2), curv))
    a_dot = torch.cat((_silu_slope(s) * s_dot, z_dot[..., cf:m0] * sg + z[..., cf:m0] * sg_dot,
                       z_dot[..., m0:] * torch.cat((sg, sg), -1) + z[..., m0:] * sg_dot2), -1)
    return u_dot + a_dot, d_z, dw


def _identity_tangent(y_dot, w, grad_out, saved: Saved, apply_alpha: bool):
    """The terms at the result from ``y_dot`` (edge-major, unscaled): ``(d_grad_out, d_y,
    d_alpha)``, the last two ``None`` without alpha (``d_y`` also without ``w``)."""
    if not apply_alpha:
        return y_dot, None, None
    d_grad_out = y_dot * saved.alpha.unsqueeze(-1)
    d_alpha = (grad_out * y_dot).sum(-1)
    d_y = None
    if w is not None:
        d_grad_out = d_grad_out + w.unsqueeze(-1) * saved.y
        d_y = grad_out * w.unsqueeze(-1)
    return d_grad_out, d_y, d_alpha
