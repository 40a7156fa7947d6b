"""Profiler ranges around the SO(2) value path of a deepmd-kit SeZM model, for the benchmark.

``ranges(model)`` (a context manager) wraps, on the model's own instances and only while it is
open, each piece in a ``torch.profiler.record_function`` range named ``stage::<name>``, so that
``mixstack.bench.breakdown.attribute`` charges every operator's device time, forward and
backward, to the innermost range it ran in:

* ``edges``: the frame's edge list: deepmd-kit's ``build_neighbor_list`` (its neighbour search
  and compaction), or ``FrameRunner``'s packing of the kept list (its own range);
* ``wigner``: deepmd-kit's ``(E, D, D)`` Wigner blocks in the edge cache (``wigner_calc``), which
  only its own value path reads (an accelerated descriptor no longer builds them);
* ``value_path``: on deepmd-kit's path ``SO2Convolution.so2_message`` (rotation, radial degree
  mixer, stack, competition, and the rotation back unless its fused attention aggregation runs)
  and that aggregation (``_flash_atten_fn``); on mixstack's, ``value_path.aggregate`` (rotate-in
  to aggregation, all of it) and the frame's Wigner rows and destination order
  (``glue.frame_edges``, built by the frame's first convolution);
* ``convolution``: the rest of each ``SO2Convolution`` (channel mixes, attention logits and
  gates, grid products, and deepmd-kit's unfused aggregation);
* everything else is ``other`` (the embedding, the FFNs, the readout, the force scatter).
"""

from __future__ import annotations

import contextlib
import functools

import torch

STAGES = ("edges", "wigner", "value_path", "convolution")


def _ranged(fn, name: str):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        with torch.profiler.record_function("stage::" + name):
            return fn(*args, **kwargs)
    return call


@contextlib.contextmanager
def ranges(model):
    """Open the ranges of the module docstring on ``model``'s SeZM modules; restore on exit."""
    from deepmd.pt.model.descriptor.sezm import DescrptSeZM
    from deepmd.pt.model.descriptor.sezm_nn.so2 import SO2Convolution

    from ..deepmd import glue, value_path

    undo = []

    def wrap(obj, attr, name):
        had = attr in vars(obj)
        old = vars(obj).get(attr)
        setattr(obj, attr, _ranged(getattr(obj, attr), name))
        undo.append(lambda: setattr(obj, attr, old) if had else delattr(obj, attr))

    if callable(getattr(model, "build_neighbor_list", None)):
        wrap(model, "build_neighbor_list", "edges")
    for module in model.modules():
        if isinstance(module, DescrptSeZM):
            wrap(module.wigner_calc, "forward", "wigner")
        if isinstance(module, SO2Convolution):
            wrap(module, "forward", "convolution")
            if not getattr(type(module), "_mixstack", False):
                wrap(module, "so2_message", "value_path")
                if module._flash_atten_fn is not None:
                    wrap(module, "_flash_atten_fn", "value_path")
    for module, attr in ((value_path, "aggregate"), (glue, "frame_edges")):
        old = getattr(module, attr)
        setattr(module, attr, _ranged(old, "value_path"))
        undo.append(functools.partial(setattr, module, attr, old))
    try:
        yield
    finally:
        for step in reversed(undo):
            step()
