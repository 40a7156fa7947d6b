"""Which SeZM ``SO2Convolution`` options mixstack reproduces exactly, and the one reason when not.

Each check names the option in deepmd-kit's own spelling.  An option mixstack does not
reproduce leaves the convolution on deepmd-kit's path; it is never approximated.  The last
checks are a safety net on the modules themselves, so that a deepmd-kit version that builds the
stack differently is refused rather than misread.
"""

from __future__ import annotations

import re

import torch

SUPPORTED_DTYPES = (torch.float32, torch.float64)
# PT-expt's generated ``forward`` methods (its module wrappers, auto-wrapped or decorated): they run ``call``
_DELEGATES = re.compile(r"(torch_module|auto_wrapped_class)\.<locals>\.")


def _dtypes(conv) -> tuple:
    """``(dtype, compute dtype)`` of a convolution: attributes on PyTorch's, precision strings on
    PT-expt's."""
    if "compute_dtype" in dir(type(conv)) or "compute_dtype" in conv.__dict__:
        return conv.dtype, conv.compute_dtype
    from deepmd.dpmodel.common import get_xp_precision
    return get_xp_precision(torch, conv.precision), get_xp_precision(torch, conv.compute_precision)


def _option_reason(conv) -> str | None:
    """The first option of ``conv`` that mixstack does not reproduce, or ``None``."""
    if conv.edge_cartesian:
        return ("edge_cartesian: a global-frame Cartesian tensor product (no edge rotation, no SO(2) stack) "
                "replaces the SO(2) value path")
    if conv.mixing_layers == 0:
        return "mixing_layers 0: no mixing stack (the radial scaling alone)"
    if conv.lmax == 0:
        return "lmax 0: a block of scalar (l = 0) features alone has no SO(2) stack (mixstack takes lmax 1..6)"
    if not 1 <= conv.lmax <= 6:
        return f"lmax {conv.lmax}: mixstack takes 1..6"
    if conv.mmax != 1:
        return f"mmax {conv.mmax}: mixstack keeps the orders |m| <= 1"
    if conv.so2_norm:
        return "so2_norm: an RMS norm before each mixing layer"
    if conv.use_so2_attn_res:
        return f"so2_attn_res {conv.so2_attn_res_mode!r}: depth attention over the mixing layers"
    if conv.layer_scale:
        return "layer_scale: a learned scale on each residual branch"
    if conv.mlp_bias:
        return "mlp_bias: biases in the mixing layers, the gates and the focus competition"
    if conv.s2_activation:
        return "s2_activation: an S2-grid SwiGLU in place of the gated activation"
    if conv.activation_function.lower() != "silu":
        return f"activation_function {conv.activation_function!r}: mixstack's scalar activation is SiLU"
    if conv.node_wise_grid_product is not None:
        return "node_wise_s2 / node_wise_so3: a source-destination grid product inside the value path"
    if conv.n_atten_head > 0 and conv.atten_f_mix:
        return "atten_f_mix: attention over the merged focus streams"
    if conv.attn_v_proj is not None:
        return "atten_v_proj: a value projection before the attention aggregation"
    if conv.attn_o_proj is not None:
        return "atten_o_proj: an output projection after the attention aggregation"
    dtype, compute_dtype = _dtypes(conv)
    if dtype not in SUPPORTED_DTYPES or compute_dtype != dtype:
        return f"precision {conv.precision}: mixstack's operators take float32 or float64"
    return None


def _math_owner(module_type: type) -> type:
    """The first class of ``module_type``'s MRO that defines its math (``forward``, or ``call``
    for deepmd-kit's array-API modules, whose PT-expt wrappers' ``forward`` calls ``call``)."""
    return next(c for c in module_type.__mro__ if "call" in c.__dict__ or "forward" in c.__dict__
                and not _DELEGATES.match(getattr(c.__dict__["forward"], "__qualname__", "")))


def _structure_reason(conv, backend) -> str | None:
    """The safety net: the modules themselves are the ones the mapping reads."""
    cf = conv.so2_focus_dim
    for k, linear in enumerate(conv.so2_linears):
        if (linear.in_channels, linear.out_channels, linear.n_focus, linear.mmax) != (cf, cf, conv.n_focus, 1):
            return f"so2_linears[{k}] is not a ({cf} -> {cf})-channel mmax 1 layer per focus stream"
        if linear.bias0 is not None:
            return f"so2_linears[{k}] has a bias"
    for k, norm in enumerate(conv.so2_inter_norms):
        if not isinstance(norm, backend.identity):
            return f"so2_inter_norms[{k}] is {type(norm).__name__}, not Identity"
    acts = list(conv.non_linearities)
    for k, act in enumerate(acts[:-1]):
        if not isinstance(act, backend.gated) or _math_owner(type(act)) not in _owners(backend.gated):
            return f"non_linearities[{k}] is {type(act).__name__}, not GatedActivation"
        gate = act.gate_linear
        if getattr(gate, "bias", None) is not None or act.lmax != conv.lmax or act.channels != cf:
            return f"non_linearities[{k}] is not a bias-free degree gate of {cf} channels"
    if not isinstance(acts[-1], backend.identity):
        return f"non_linearities[{len(acts) - 1}] is {type(acts[-1]).__name__}: the last layer must be linear"
    if conv.focus_compete and conv.n_focus > 1 and conv.focus_compete_bias is not None:
        return "the focus competition has a bias"
    return None


def _owners(types: tuple[type, ...]) -> set[type]:
    return {_math_owner(t) for t in types}


def unsupported_reason(conv) -> str | None:
    """``None`` when mixstack reproduces this SeZM ``SO2Convolution`` (deepmd-kit's PyTorch or
    PT-expt one) exactly, else the one option (or module) it does not."""
    from .backends import of

    backend = of(conv)
    if backend is None:
        return f"{type(conv).__name__} is not a SeZM SO2Convolution"
    base = _math_owner(type(conv))
    if base is not _math_owner(backend.convolution) and not getattr(base, "_mixstack", False):
        return f"{type(conv).__name__} overrides SO2Convolution.forward"
    return _option_reason(conv) or _structure_reason(conv, backend)
