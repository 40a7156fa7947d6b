"""mixstack inside deepmd-kit's freeze (``dp --pt freeze`` of a SeZM checkpoint to an AOTInductor
``.pt2``, and ``dp --pt-expt freeze`` of a DPA4 one to a ``.pt2`` or ``.pte``): the accelerated
model's mixing stacks traced as ``mixstack::`` operators, their keys tuned by mixstack's one
freeze-time tuner, which both routes reach.

deepmd-kit's ``freeze_sezm_to_pt2`` builds the model (accelerated by the plugin with
``MIXSTACK_DEEPMD=1``), tunes its own Triton tables (``_tune_triton_configs``), traces the model
on the CPU, moves the exported graph to the target device and compiles it.  ``install`` wraps the
two at runtime, deepmd-kit's files untouched:

* the freeze runs inside ``guards.kernel_target(device)`` for a CUDA target, so the trace on CPU
  tensors records the stacks' and the convolution's operators (their bodies run the reference
  formulas on the CPU, and their Triton kernels once AOTInductor compiles the graph for the GPU)
  instead of the reference formulas themselves;
* after deepmd-kit's own tuning, ``tune(model, device)`` tunes the model's stack keys that have
  no table entry on that device with ``mixstack.export.tune_for_freeze``, the tuner
  ``mixstack freeze`` calls: one tuner for both routes.

PT-expt's freeze (``deepmd.pt_expt.utils.serialization``) rebuilds the model from its serialized
form (accelerated there by the plugin's PT-expt hook), traces it on the CPU and moves the exported
graph to its target device (``deepmd.pt_expt.utils.env.DEVICE``).  ``install_expt`` wraps its
``_trace_and_export``, which both its ``.pt2`` and ``.pte`` writers call: for a CUDA target, the
same model's keys first go to ``tune``, then the trace runs inside the kernel target.

With ``MIXSTACK_DEEPMD_REST_PRODUCTS=compensated`` a CUDA target's package runs the rest of the
model's float32 products as compensated fp16 products (``rest_products``; the decomposition is in
place while AOTInductor lowers the exported graph).

With ``MIXSTACK_PRIVATE_CXX_RUNTIME=1`` both routes compile their ``.pt2`` with a private, hidden
copy of libstdc++ (``mixstack.cxx_runtime``).

A CPU target freezes the reference formulas, as before.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys

import torch

from .. import cxx_runtime
from ..core import config
from ..dispatch import guards, levels
from ..export import check_level3, stack_keys, tune_for_freeze
from . import rest_products

logger = logging.getLogger("deepmd.mixstack")

_MARK = "_mixstack_freeze"


def tune(model: torch.nn.Module, device) -> str:
    """Tune ``model``'s mixing-stack keys missing from the tables for ``device`` (the active
    mixstack level decides the families); what was done, as ``tune_for_freeze`` says it."""
    device = torch.device(device)
    keys = stack_keys(model)
    level = levels.get_level()
    say = functools.partial(logger.info, "mixstack freeze tuning on %s: %s", device)
    if keys and level >= 2 and device.type == "cuda":
        say(f"{len(keys)} stack key(s) ({'; '.join(k.short() for k in keys)}), the keys no table covers swept")
    if device.type == "cuda" and torch.cuda.is_available():
        with torch.cuda.device(device):
            done = tune_for_freeze(keys, device, level, progress=say)
            if level >= 3 and keys:
                say("level 3's configs checked against float64")
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

        where = device if device is not None else DEVICE
        with target(where), cxx_runtime.private_runtime(), \
                rest_products.for_target(where, config.deepmd_rest_products()):
            return freeze(ckpt_path, out_path, device=device, **kwargs)

    @functools.wraps(tune_tables)
    def _tune_triton_configs(model, target_device):
        tune_tables(model, target_device)
        tune(model, target_device)

    for fn in (freeze_sezm_to_pt2, _tune_triton_configs):
        setattr(fn, _MARK, True)
    freeze_pt2.freeze_sezm_to_pt2, freeze_pt2._tune_triton_configs = freeze_sezm_to_pt2, _tune_triton_configs


_SINGLE = "_mixstack_single_rank"


def _answer_no(owner, name: str) -> None:
    """``owner.name`` replaced by a function that returns ``False``, the original kept on it."""
    original = getattr(owner, name)
    if getattr(original, _SINGLE, None) is not None:
        return

    def no(*args, **kwargs) -> bool:
        return False
    setattr(no, _SINGLE, original)
    setattr(owner, name, no)


def _answer_again(owner, name: str) -> None:
    original = getattr(getattr(owner, name), _SINGLE, None)
    if original is not None:
        setattr(owner, name, original)


def single_rank() -> None:
    """``dp --pt freeze`` from now on writes no multi-rank with-comm artifact: SeZM models answer
    that they take no edge-parallel ranks, so the freeze runs one AOTInductor compile instead of
    two (the second, as long as the first, is the graph LAMMPS runs on several ranks) and the
    package runs on one rank (idempotent; ``single_rank_expt`` for ``dp --pt-expt freeze``)."""
    from deepmd.pt.model.model import sezm_model

    _answer_no(sezm_model.SeZMModel, "supports_edge_parallel")


def single_rank_expt() -> None:
    """The same for ``dp --pt-expt freeze``: no with-comm artifact (idempotent)."""
    from deepmd.pt_expt.utils import serialization

    _answer_no(serialization, "_needs_with_comm_artifact")


def all_ranks() -> None:
    """Undo ``single_rank`` and ``single_rank_expt``: deepmd-kit's own answers again."""
    from deepmd.pt.model.model import sezm_model

    _answer_again(sezm_model.SeZMModel, "supports_edge_parallel")
    if "deepmd.pt_expt.utils.serialization" in sys.modules:
        _answer_again(sys.modules["deepmd.pt_expt.utils.serialization"], "_needs_with_comm_artifact")


def _expt_model(data: dict):
    """The PT-expt model that ``data`` (deepmd-kit's serialized model) describes, built on the CPU
    (only its stack keys are read; deepmd-kit's own trace builds it there too), or ``None`` where
    it is not one PT-expt's registry builds (its spin models)."""
    from deepmd.pt_expt.model.model import BaseModel
    from deepmd.pt_expt.utils import env

    saved, env.DEVICE = env.DEVICE, torch.device("cpu")
    try:
        return BaseModel.deserialize(data["model"])
    except Exception as err:               # deepmd-kit raises many types for what it does not build
        logger.info("mixstack freeze: no keys tuned for this model (%s: %s)", type(err).__name__, err)
        return None
    finally:
        env.DEVICE = saved


def install_expt() -> None:
    """Wrap PT-expt's ``_trace_and_export`` and its ``.pt2`` writer (idempotent)."""
    from deepmd.pt_expt.utils import serialization

    trace, write_pt2 = serialization._trace_and_export, serialization._deserialize_to_file_pt2
    if getattr(trace, _MARK, False):
        return

    @functools.wraps(trace)
    def _trace_and_export(data, *args, **kwargs):
        from deepmd.pt_expt.utils import env

        device = env.DEVICE
        if device.type == "cuda":
            model = _expt_model(data)
            if model is not None:
                tune(model, device)
        with target(device), rest_products.for_target(device, config.deepmd_rest_products()):
            return trace(data, *args, **kwargs)

    @functools.wraps(write_pt2)
    def _deserialize_to_file_pt2(*args, **kwargs):
        with cxx_runtime.private_runtime():        # MIXSTACK_PRIVATE_CXX_RUNTIME=1: its own libstdc++
            return write_pt2(*args, **kwargs)

    for fn in (_trace_and_export, _deserialize_to_file_pt2):
        setattr(fn, _MARK, True)
    serialization._trace_and_export, serialization._deserialize_to_file_pt2 = _trace_and_export, _deserialize_to_file_pt2


def uninstall_expt() -> None:
    """Undo ``install_expt``."""
    from deepmd.pt_expt.utils import serialization

    for name in ("_trace_and_export", "_deserialize_to_file_pt2"):
        fn = getattr(serialization, name)
        if getattr(fn, _MARK, False):
            setattr(serialization, name, fn.__wrapped__)


def uninstall() -> None:
    """Undo ``install``."""
    from deepmd.pt.entrypoints import freeze_pt2

    for name in ("freeze_sezm_to_pt2", "_tune_triton_configs"):
        fn = getattr(freeze_pt2, name)
        if getattr(fn, _MARK, False):
            setattr(freeze_pt2, name, fn.__wrapped__)
