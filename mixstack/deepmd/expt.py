"""deepmd-kit's PT-expt backend (``deepmd.pt_expt``: ``dp --pt-expt``, its ``.pte`` / ``.pt2``
freeze) on mixstack: its DPA4 (SeZM) SO(2) convolution holds SeZM's submodules and parameters
under SeZM's names, so ``MixstackConvolution``'s forward serves it; what differs is the dtype
spelling (precision strings there) and the attention softmax, deepmd-kit's array-API one, which
also takes the padded layout's edge mask.  Imported only when a model holds PT-expt modules.
"""

from __future__ import annotations

import torch

from .compat import deepmd_pt

deepmd_pt()

# GatedActivation, Identity and DescrptDPA4: the backend's classes, which backends.expt() reads here
from deepmd.dpmodel.common import get_xp_precision  # noqa: E402
from deepmd.dpmodel.descriptor.dpa4_nn.activation import GatedActivation  # noqa: E402, F401
from deepmd.dpmodel.descriptor.dpa4_nn.attention import segment_envelope_gated_softmax  # noqa: E402
from deepmd.dpmodel.utils.network import Identity  # noqa: E402, F401
from deepmd.pt_expt.descriptor.dpa4 import _TRAINABLE_ATTRS, DescrptDPA4  # noqa: E402, F401
from deepmd.pt_expt.descriptor.dpa4_nn.so2 import SO2Convolution  # noqa: E402

from . import glue  # noqa: E402
from .convolution import MixstackConvolution  # noqa: E402


class MixstackDPA4Convolution(SO2Convolution, MixstackConvolution):
    """deepmd-kit's PT-expt DPA4 ``SO2Convolution`` with its value path on mixstack.  Its own
    class comes first (a mixin before it changes the object layout, and ``accelerate``'s class
    switch is refused), so ``MixstackConvolution``'s methods are bound here by name."""

    _mixstack = True
    forward = MixstackConvolution.forward
    stack_shape_key = MixstackConvolution.stack_shape_key
    _attention_weights = MixstackConvolution._attention_weights
    _output_gate = MixstackConvolution._output_gate

    @property
    def compute_dtype(self) -> torch.dtype:
        return get_xp_precision(torch, self.compute_precision)

    @property
    def dtype(self) -> torch.dtype:
        return get_xp_precision(torch, self.precision)

    def _mixstack_softmax(self, logits, edges: glue.Edges, edge_cache, n_node: int, cd) -> torch.Tensor:
        """deepmd-kit's envelope-gated softmax over each destination's edges ``(E, F, H)``, the
        padded layout's empty slots masked out."""
        return segment_envelope_gated_softmax(
            logits=logits, edge_env=edges.env.to(dtype=cd), dst=edges.dst, n_nodes=n_node,
            z_bias_raw=self.adamw_attn_z_bias_raw, eps=self.eps,
            src_weight=None if edges.gate is None else edges.gate.to(dtype=cd), edge_mask=edge_cache.edge_mask)


# PT-expt makes a module's trainable arrays Parameters by its class's name, after building and after
# deserializing (``_TRAINABLE_ATTRS``): the accelerated class is looked up under its own name, so
# without this entry a convolution switched before that pass would keep its attention weights as
# buffers, and training would never update them.
_TRAINABLE_ATTRS.setdefault(MixstackDPA4Convolution.__name__, _TRAINABLE_ATTRS[SO2Convolution.__name__])
