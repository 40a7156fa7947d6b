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

A compiled frame runs no module's ``forward`` (the trace replaced them), so its ranges hold
nothing; ``kernel_split`` charges every variant's device kernels by name instead, the same way
for all: mixstack's value-path kernels and deepmd-kit's (``deepmd.kernels.triton.sezm``'s SO(2)
modules) to ``value_path``, deepmd-kit's Wigner kernels to ``wigner``, mixstack's compensated
product to ``products``, every other kernel (Inductor's fused ones, ATen's) to ``other``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import pkgutil

import torch

STAGES = ("edges", "wigner", "value_path", "convolution")
KERNEL_STAGES = ("wigner", "value_path", "products", "other")
# deepmd-kit's SeZM Triton modules (deepmd.kernels.triton.sezm) by the stage their kernels serve
DEEPMD_KERNEL_MODULES = {"so2_block_gemm": "value_path", "so2_rotation": "value_path",
                         "so2_stack_fp16x3": "value_path", "so2_value_path": "value_path",
                         "flash_atten": "value_path", "radial_mix": "value_path", "wigner_monomials": "wigner"}
MIXSTACK_PRODUCT_MODULES = ("product",)      # mixstack.kernels modules of deepmd-kit's own products


@functools.cache
def kernel_stages() -> dict[str, str]:
    """Kernel name -> stage (``KERNEL_STAGES``) for the kernels ``kernel_split`` knows by name."""
    from .. import kernels
    from ..packages import jit_function_names, mixstack_kernel_names

    ours = mixstack_kernel_names()
    named = {}
    for info in pkgutil.iter_modules(kernels.__path__):
        stage = "products" if info.name in MIXSTACK_PRODUCT_MODULES else "value_path"
        module = importlib.import_module(f"{kernels.__name__}.{info.name}")
        named.update({name: stage for name in jit_function_names(module) & ours})
    try:
        from ..deepmd.compat import deepmd_pt
        deepmd_pt()                        # deepmd-kit's op library, or its stand-in, before its modules
    except ImportError:
        return named
    for name, stage in DEEPMD_KERNEL_MODULES.items():
        try:
            module = importlib.import_module(f"deepmd.kernels.triton.sezm.{name}")
        except Exception:                  # another deepmd-kit: its kernels stay "other"
            continue
        named.update({kernel: stage for kernel in jit_function_names(module)})
    return named


def kernel_split(events) -> dict[str, float]:
    """µs of device work in a profiler's ``events()`` by ``KERNEL_STAGES``, kernels charged by
    name (``kernel_stages``); other device work (copies, memsets) is ``other``."""
    from torch.autograd import DeviceType

    from .breakdown import kernel_time

    named = kernel_stages()
    split = dict.fromkeys(KERNEL_STAGES, 0.0)
    device = [e for e in events if e.device_type == DeviceType.CUDA]
    for e in device:
        stage = named.get(e.name)
        if stage is not None:
            split[stage] += e.device_time
    split["other"] = kernel_time(device) - sum(split[s] for s in KERNEL_STAGES if s != "other")
    return split


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
