"""mixstack inside deepmd-kit's freeze (``dp --pt freeze`` of a SeZM checkpoint to an AOTInductor
``.pt2``): the accelerated model's mixing stacks traced as ``mixstack::`` operators, their keys
tuned by mixstack's one freeze-time tuner.

deepmd-kit's ``freeze_sezm_to_pt2`` builds the model (accelerated by the plugin with
``MIXSTACK_DEEPMD=1``), tunes its own Triton tables (``_tune_triton_configs``), traces the model
on the CPU, moves the exported graph to the target device and compiles it.  ``install`` wraps the
two at runtime, deepmd-kit's files untouched:

* the freeze runs inside ``guards.kernel_target(device)`` for a CUDA target, so the trace on CPU
  tensors records the stacks' operators (their bodies run the reference formulas on the CPU, and
  their Triton kernels once AOTInductor compiles the graph for the GPU) instead of the reference
  formulas themselves;
* after deepmd-kit's own tuning, ``tune(model, device)`` tunes the model's stack keys that have
  no table entry on that device with ``mixstack.export.tune_for_freeze``, the tuner
  ``mixstack freeze`` calls: one tuner for both routes.

The convolution's rotations trace as their reference formulas (a trace never runs their
kernels: ``guards.tracing``).  A CPU target freezes as before.
"""

from __future__ import annotations

import contextlib
import functools
import logging

import torch

from ..dispatch import guards, levels
from ..export import check_level3, stack_keys, tune_for_freeze

logger = logging.getLogger("deepmd.mixstack")

_MARK = "_mixstack_freeze"


def tune(model: torch.nn.Module, device) -> str:
    """Tune ``model``'s mixing-stack keys missing from the tables for ``device`` (the active
    mixstack level decides the families); what was done, as ``tune_for_freeze`` says it."""
    device = torch.device(device)
    keys = stack_keys(model)
    level = levels.get_level()
    if device.type == "cuda" and torch.cuda.is_available():
        with torch.cuda.device(device):
            done = tune_for_freeze(keys, device, level)
            checked = check_level3(keys, device, level)
            done += f"; level 3: {checked}" if checked else ""
    else:
        done = tune_for_freeze(keys, device, level)
    logger.info("mixstack freeze tuning on %s: %s", device, done)
    return done


def target(device) -> contextlib.AbstractContextManager:
    """``guards.kernel_target(device)`` for a CUDA ``device``; nothing for another."""
    device = torch.device(device)
    return guards.kernel_target(device) if device.type == "cuda" else contextlib.nullcontext()


def install() -> None:
    """Wrap deepmd-kit's ``freeze_sezm_to_pt2`` and ``_tune_triton_configs`` (idempotent)."""
    from deepmd.pt.entrypoints import freeze_pt2

    freeze, tune_tables = freeze_pt2.freeze_sezm_to_pt2, freeze_pt2._tune_triton_configs
    if getattr(freeze, _MARK, False):
        return

    @functools.wraps(freeze)
    def freeze_sezm_to_pt2(ckpt_path, out_path, *, device=None, **kwargs):
        from deepmd.pt.utils.env import DEVICE

        with target(device if device is not None else DEVICE):
            return freeze(ckpt_path, out_path, device=device, **kwargs)

    @functools.wraps(tune_tables)
    def _tune_triton_configs(model, target_device):
        tune_tables(model, target_device)
        tune(model, target_device)

    for fn in (freeze_sezm_to_pt2, _tune_triton_configs):
        setattr(fn, _MARK, True)
    freeze_pt2.freeze_sezm_to_pt2, freeze_pt2._tune_triton_configs = freeze_sezm_to_pt2, _tune_triton_configs


def uninstall() -> None:
    """Undo ``install``."""
    from deepmd.pt.entrypoints import freeze_pt2

    for name in ("freeze_sezm_to_pt2", "_tune_triton_configs"):
        fn = getattr(freeze_pt2, name)
        if getattr(fn, _MARK, False):
            setattr(freeze_pt2, name, fn.__wrapped__)
