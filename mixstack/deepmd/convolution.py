"""``MixstackSO2Convolution``: a SeZM ``SO2Convolution`` whose value path runs on mixstack.

``accelerate`` switches the class of a built convolution to this subclass (``restore`` switches
it back): the parameters, buffers, state-dict keys and submodules stay deepmd-kit's own, and
only ``forward`` changes.  The forward is ``MixstackConvolution``'s, which the PT-expt
backend's class (``expt.MixstackDPA4Convolution``) shares; a backend supplies its attention
softmax (``_mixstack_softmax``).  The forward keeps deepmd-kit's steps around the value path, calling
its own submodules in its own order: ``pre_focus_mix``; the attention logits (``attn_qk_norm``,
``attn_q_proj`` / ``attn_k_proj``, the radial logit bias) and deepmd-kit's
``segment_envelope_gated_softmax``; the output-side head gate (or, without heads, the degree
normalisation); the message-node grid product, the node Cartesian product and
``post_focus_mix``.  The value path between them is ``value_path.aggregate``.  It runs in
training and in evaluation alike (deepmd-kit's own fused paths only run in evaluation).
"""

from __future__ import annotations

import torch

from .compat import deepmd_pt

deepmd_pt()

from deepmd.pt.model.descriptor.sezm_nn.attention import segment_envelope_gated_softmax  # noqa: E402
from deepmd.pt.model.descriptor.sezm_nn.so2 import SO2Convolution  # noqa: E402

from ..tuning import shape_key  # noqa: E402
from . import glue, value_path  # noqa: E402


class MixstackConvolution:
    """The forward of a SeZM convolution on mixstack, for any deepmd-kit backend whose
    convolution holds SeZM's submodules and parameters under SeZM's names (PyTorch's
    ``SO2Convolution``, PT-expt's).  ``_mixstack_level`` is the mixstack level it pins
    (``None``: the active level); a backend's class supplies ``_mixstack_softmax``."""

    _mixstack = True
    _mixstack_level: int | None = None

    def _mixstack_softmax(self, logits, edges: glue.Edges, edge_cache, n_node: int, cd) -> torch.Tensor:
        raise NotImplementedError

    def stack_shape_key(self):
        """The tuning key of this convolution's mixing stack (``mixstack.export.stack_keys`` finds
        it): never alpha, which rotate-out's edge weight carries (``value_path``)."""
        return shape_key(focus_dim=self.so2_focus_dim, lmax=self.lmax, n_focus=self.n_focus, apply_alpha=False)

    def _attention_weights(self, x, rad, edges: glue.Edges, edge_cache, n_node: int) -> torch.Tensor:
        """SeZM's envelope-gated softmax weights ``(E, F, H)`` over each destination's edges."""
        cd = self.compute_dtype
        n_edge = edges.src.shape[0]
        heads, head_dim = self.n_atten_head, self.head_dim
        x_l0 = x[:, 0, :].reshape(n_node, self.attn_n_focus, self.attn_focus_dim)
        qk = self.attn_qk_norm(x_l0.to(dtype=cd))
        q = self.attn_q_proj(qk).index_select(0, edges.dst).reshape(n_edge, self.attn_n_focus, heads, head_dim)
        k = self.attn_k_proj(qk).index_select(0, edges.src).reshape(n_edge, self.attn_n_focus, heads, head_dim)
        radial_l0 = rad[:, 0, :].reshape(n_edge, self.attn_n_focus, self.attn_focus_dim)
        bias = torch.einsum("efi,ifo->efo", radial_l0.to(dtype=cd), self.adamw_attn_logit_w)
        logits = (q * k).sum(-1) * (head_dim ** -0.5) + bias
        return self._mixstack_softmax(logits, edges, edge_cache, n_node, cd)

    def _output_gate(self, x, n_node: int) -> torch.Tensor:
        """SeZM's output-side head gate, ``(N, F*Cf)``: one sigmoid per (stream, head) on its
        channels."""
        cd = self.compute_dtype
        x_l0 = x[:, 0, :].reshape(n_node, self.attn_n_focus, self.attn_focus_dim)
        gate = torch.sigmoid(torch.einsum("nfi,ifo->nfo", self.attn_output_gate_norm(x_l0.to(dtype=cd)),
                                          self.adamw_attn_gate_w))
        return (gate.reshape(n_node, self.attn_n_focus, self.n_atten_head, 1)
                .expand(n_node, self.attn_n_focus, self.n_atten_head, self.head_dim)
                .reshape(n_node, self.hidden_channels))

    def forward(self, x: torch.Tensor, edge_cache, radial_feat: torch.Tensor) -> torch.Tensor:
        """Node features ``(N, (lmax+1)^2, C)`` to message updates ``(N, (lmax+1)^2, C)``, as
        ``SO2Convolution.forward``."""
        n_node = x.shape[0]
        x = self.pre_focus_mix(x.unsqueeze(2)).squeeze(2)                # (N, D, F*Cf)
        edges = glue.frame_edges(edge_cache, self.lmax, self.compute_dtype, n_node, self._mixstack_level)
        rad = radial_feat if self.radial_hidden_proj is None else self.radial_hidden_proj(radial_feat)
        attention = self._attention_weights(x, rad, edges, edge_cache, n_node) if self.n_atten_head > 0 else None
        agg = value_path.aggregate(self, x, rad, edges, n_node, attention, level=self._mixstack_level)
        if attention is None:
            out = agg * edge_cache.inv_sqrt_deg.to(dtype=agg.dtype)
        else:
            out = agg * self._output_gate(x, n_node).unsqueeze(1)
        out = out.to(dtype=self.dtype)
        if self.message_node_grid_product is not None:
            out = out + self.message_node_grid_product(out, x)
        if self.node_cartesian_tp is not None:
            out = self.node_cartesian_tp(out, x)
        return self.post_focus_mix(out.unsqueeze(2)).squeeze(2)


class MixstackSO2Convolution(MixstackConvolution, SO2Convolution):
    """deepmd-kit's PyTorch SeZM ``SO2Convolution`` with its value path on mixstack."""

    def _mixstack_softmax(self, logits, edges: glue.Edges, edge_cache, n_node: int, cd) -> torch.Tensor:
        """deepmd-kit's envelope-gated softmax over each destination's edges ``(E, F, H)``."""
        return segment_envelope_gated_softmax(
            logits=logits, edge_env=edges.env.to(dtype=cd), dst=edges.dst, n_nodes=n_node,
            z_bias_raw=self.adamw_attn_z_bias_raw, eps=self.eps,
            src_weight=None if edges.gate is None else edges.gate.to(dtype=cd))
