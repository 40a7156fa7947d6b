"""The pointwise math of the stack, once: every kernel that needs it calls these.

Forward: SiLU of the scalar channels and the gate sigmoid.  Backward: SiLU',
the gate-sigmoid gradient summed over a degree's three rows, and the gate
logit gradient.  The relay and any fused kernel must call the same helpers so
that they produce the same bits.
"""

import triton
import triton.language as tl


@triton.jit
def sigmoid(x):
    """``1 / (1 + exp(-x))`` in fp32; spelled out so every kernel rounds alike."""
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def silu(s):
    """SiLU of the scalar (l = 0) channels: ``s * sigmoid(s)``."""
    return s * sigmoid(s)


@triton.jit
def silu_grad(g, s):
    """Cotangent of ``silu`` at ``s``: ``g * s0 * (1 + s * (1 - s0))``, ``s0 = sigmoid(s)``."""
    s0 = sigmoid(s)
    return g * s0 * (1.0 + s * (1.0 - s0))


@triton.jit
def gate_grad(g_m0, z_m0, g_neg, z_neg, g_pos, z_pos):
    """Cotangent of one degree's gate: the m = 0 row plus the m = -1 and m = +1 rows."""
    return g_m0 * z_m0 + (g_neg * z_neg + g_pos * z_pos)


@triton.jit
def gate_logit_grad(gsg, sg):
    """Cotangent of the gate logit from that of its sigmoid ``sg``."""
    return gsg * sg * (1.0 - sg)
