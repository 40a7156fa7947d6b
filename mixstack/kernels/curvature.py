"""The double backward's pointwise math: second derivatives of SiLU and of the gate sigmoid,
and the forward-direction (tangent) step of one gated layer.

The double backward (docs/contract.md §1, "Double backward") differentiates the first-order
backward.  Along the incoming cotangent ``v`` of ``grad_u0`` it runs a tangent ``u_dot`` of
the layer inputs forwards through the stack (``z_dot = u_dot @ W`` is a GEMM of the stack's
own kernel); per gated layer this module's ``tangent_kernel`` then

1. advances the tangent, ``u_dot += a_dot`` with
   ``a_dot = [silu'(s) s_dot | z0_dot sg + z0 sg_dot | z1_dot [sg|sg] + z1 [sg_dot|sg_dot]]``,
   ``sg_dot = sg (1 - sg) t_dot``, ``t_dot = s_dot @ gw`` (in place: each program reads its
   rows before it writes them);
2. writes ``d_z``, the derivative of ``<z_dot, gz>`` with respect to the layer's saved
   pre-activations ``z`` at fixed cotangent ``h`` of the layer output:
   ``[h_s s_dot silu''(s) + gl_curv @ gw^T | h_0 sg_dot | h_1 [sg_dot|sg_dot]]`` with
   ``gl_curv = sg (1 - sg) (gsg_dot + gsg t_dot (1 - 2 sg))`` (``gsg`` the gate cotangent of
   ``h`` against ``z``, ``gsg_dot`` the same against ``z_dot``).

The first derivatives come from the shared helpers of ``activations`` (``silu_grad`` gives
``silu'(s) s_dot``, ``gate_logit_grad`` gives ``sg (1 - sg) x``, ``gate_grad`` the degree's
three-row sum) and the gate sigmoids from ``gate.gate_sigmoids``, so every kernel forms them
with the same bits.  The second derivatives exist once, here: ``silu_curvature`` and
``gate_logit_curvature``; the gate weight-gradient kernel (``wgrad.gate_wgrad_kernel``) calls
the same helpers.

Like the relay's pointwise kernel (``gate``), the kernels walk the gate columns ``GC`` at a
time (``tuning.configs.gate_chunk``) in degree order, with ``BLOCK_M x GC`` register tiles; only
the logit contraction and the scalar columns are ``CP = next_pow2(Cf)`` wide, with masks.  The
loops are runtime loops.  Row offsets are int64.
"""

import triton
import triton.language as tl

from .activations import gate_grad, gate_logit_grad, sigmoid, silu_grad
from .gate import gate_operands, gate_sigmoids
from .rows import degree_cols, load_degree_cols, row_width


@triton.jit
def silu_curvature(h, s_dot, s):
    """``h * s_dot * silu''(s)``, ``silu''(s) = s0 (1 - s0) (2 + s (1 - 2 s0))``, ``s0 = sigmoid(s)``:
    the derivative of ``<s_dot, silu_grad(h, s)>`` with respect to ``s``."""
    s0 = sigmoid(s)
    return h * s_dot * (s0 * (1.0 - s0) * (2.0 + s * (1.0 - 2.0 * s0)))


@triton.jit
def gate_logit_curvature(gsg_dot, gsg, t_dot, sg):
    """The gate-logit cotangent of the double backward: the derivative of
    ``<t_dot, gl> + <gsg_dot, sg>`` with respect to the logits, ``gl = gate_logit_grad(gsg, sg)``:
    ``sg (1 - sg) (gsg_dot + gsg t_dot (1 - 2 sg))`` (sigmoid'' = sigmoid' (1 - 2 sigmoid))."""
    return gate_logit_grad(gsg_dot + gsg * t_dot * (1.0 - 2.0 * sg), sg)


@triton.jit
def tangent_logits(sd_rows, mask, gw_base, gcol, G: tl.constexpr, GC: tl.constexpr, R: tl.constexpr,
                   BLOCK_M: tl.constexpr):
    """``t_dot = s_dot @ gw[:, gcol]`` for ``GC`` gate columns: the tangent of the gate logits,
    read and multiplied in the ``R`` chunks of ``GC`` K columns that ``gate.gate_sigmoids``
    takes for the logits themselves (exact fp32)."""
    cg = tl.arange(0, GC)
    acc = tl.zeros((BLOCK_M, GC), dtype=tl.float32)
    for k in tl.range(0, R):
        kc = k * GC + cg
        sd_k = tl.load(sd_rows[:, None] + kc[None, :], mask=mask, other=0.0)
        acc = tl.dot(sd_k, tl.load(gw_base + kc[:, None] * G + gcol[None, :]), acc, input_precision="ieee")
    return acc


@triton.jit(do_not_specialize=["layer", "h_layer"])
def tangent_kernel(
    ud_ptr, zd_ptr, z_ptr, h_ptr, gw_ptr, dz_ptr,
    layer, h_layer, E, F,
    LMAX: tl.constexpr, CF: tl.constexpr, CP: tl.constexpr, GC: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """One gated layer of the double backward's tangent pass (module doc): ``u_dot`` (focus-major
    ``(F, E, ROW)``, updated in place), ``z_dot = u_dot @ W`` (``(F, E, ROW)``), the saved ``z``
    and the chain ``h`` (``(n, F, E, ROW)``, read at ``layer`` and ``h_layer``), ``d_z`` written at
    ``layer``.  Gate columns ``GC`` at a time, in degree order, as the relay's pointwise kernel."""
    ROW: tl.constexpr = row_width(LMAX, CF)
    G: tl.constexpr = LMAX * CF
    R: tl.constexpr = CF // GC
    f, e, e_in, row_ptrs, z_rows, gw_base, _, _, unused, _ = gate_operands(       # z_rows: z and d_z
        z_ptr, gw_ptr, gw_ptr, gw_ptr, layer, E, F, LMAX, CF, GC, BLOCK_M, False, False)
    mask = e_in[:, None]
    rows = row_ptrs[:, None]
    z2 = z_rows[:, None]
    h2 = (((h_layer * F + f) * E + e) * ROW)[:, None]
    cg = tl.arange(0, GC)
    c = tl.arange(0, CP)
    c_mask = c < CF

    contraction = tl.zeros((BLOCK_M, CP), dtype=tl.float32)
    for t in tl.range(0, LMAX * R):              # gate columns, GC at a time, in degree order
        gcol = t * GC + cg
        col_m0, col_neg, col_pos = degree_cols(gcol, LMAX, CF)
        sg = gate_sigmoids(z_ptr + z_rows, mask, unused, unused, gw_base, gw_base, 1.0, gcol,
                           G, GC, R, BLOCK_M, False)
        t_dot = tangent_logits(zd_ptr + row_ptrs, mask, gw_base, gcol, G, GC, R, BLOCK_M)
        sg_dot = gate_logit_grad(t_dot, sg)
        h_m0, h_neg, h_pos = load_degree_cols(h_ptr, h2, col_m0, col_neg, col_pos, mask)
        z_m0, z_neg, z_pos = load_degree_cols(z_ptr, z2, col_m0, col_neg, col_pos, mask)
        zd_m0, zd_neg, zd_pos = load_degree_cols(zd_ptr, rows, col_m0, col_neg, col_pos, mask)
        u_m0, u_neg, u_pos = load_degree_cols(ud_ptr, rows, col_m0, col_neg, col_pos, mask)
        tl.store(ud_ptr + rows + col_m0, u_m0 + (zd_m0 * sg + z_m0 * sg_dot), mask=mask)
        tl.store(ud_ptr + rows + col_neg, u_neg + (zd_neg * sg + z_neg * sg_dot), mask=mask)
        tl.store(ud_ptr + rows + col_pos, u_pos + (zd_pos * sg + z_pos * sg_dot), mask=mask)
        tl.store(dz_ptr + z2 + col_m0, h_m0 * sg_dot, mask=mask)
        tl.store(dz_ptr + z2 + col_neg, h_neg * sg_dot, mask=mask)
        tl.store(dz_ptr + z2 + col_pos, h_pos * sg_dot, mask=mask)
        gl_curv = gate_logit_curvature(gate_grad(h_m0, zd_m0, h_neg, zd_neg, h_pos, zd_pos),
                                       gate_grad(h_m0, z_m0, h_neg, z_neg, h_pos, z_pos), t_dot, sg)
        gw_t = tl.load(gw_base + c[None, :] * G + gcol[:, None], mask=c_mask[None, :], other=0.0)
        contraction = tl.dot(gl_curv, gw_t, contraction, input_precision="ieee")
    full = mask & c_mask[None, :]
    s = tl.load(z_ptr + z2 + c[None, :], mask=full, other=0.0)
    s_dot = tl.load(zd_ptr + rows + c[None, :], mask=full, other=0.0)
    h_s = tl.load(h_ptr + h2 + c[None, :], mask=full, other=0.0)
    u_s = tl.load(ud_ptr + rows + c[None, :], mask=full, other=0.0)
    tl.store(ud_ptr + rows + c[None, :], u_s + silu_grad(s_dot, s), mask=full)
    tl.store(dz_ptr + z2 + c[None, :], silu_curvature(h_s, s_dot, s) + contraction, mask=full)
