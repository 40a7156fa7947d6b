"""The guards that decide whether the Triton levels can run a call.

A call runs the kernels when Triton is installed (Linux), its tensors are on
CUDA (or on any device under ``TRITON_INTERPRET=1``), are float32, and its ``focus_dim`` is a multiple of 16
up to 128 (docs/contract.md §3); anything else falls back to the reference,
with a one-time warning that says why (one per reason: CPU tensors warn once per device type).
"""

from __future__ import annotations

import contextlib
import logging
import threading

import torch

from ..core import config
from ..core.layout import StackLayout
from ..core.threads import scoped
from ..core.tracing import tracing
from . import levels
from .log import warn_once

log = logging.getLogger(__name__)

MAX_FOCUS_DIM = 128


_triton_installed: bool | None = None


def triton_installed() -> bool:
    """Whether Triton can be imported (it ships for Linux only; elsewhere: level 0).  Asked
    once; a plain global rather than ``functools.cache``, which Dynamo warns about when a
    compiled graph calls it."""
    global _triton_installed
    if _triton_installed is None:
        try:
            import triton  # noqa: F401
            _triton_installed = True
        except ImportError:
            _triton_installed = False
    return _triton_installed


def kernels_can_run(t: torch.Tensor) -> bool:
    """Triton kernels run on CUDA tensors, or on any tensor under the interpreter."""
    return triton_installed() and (t.device.type == "cuda" or config.triton_interpret())


_target = threading.local()


@contextlib.contextmanager
def kernel_target(device):
    """While open, the stack's dispatch takes its operator for tensors on any device, as it would
    on ``device`` (a CUDA device): a trace on the CPU for a GPU package (deepmd-kit's freeze traces
    on the CPU) then records ``mixstack::`` operators, whose bodies run their reference branch on
    CPU tensors and their kernels once the graph is moved to ``device`` and compiled."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"kernel_target: device must be a CUDA device, got {device}")
    with scoped(_target, "device", device):
        yield


def _targeted() -> bool:
    """Whether a ``kernel_target`` is open: tensors off CUDA still take the stack's operator."""
    return triton_installed() and getattr(_target, "device", None) is not None


_opaque = threading.local()


@contextlib.contextmanager
def opaque_operators():
    """While open, a trace (``make_fx``, AOTAutograd, Inductor) keeps mixstack's operators as
    opaque calls: torch does not decompose them into their Triton kernels
    (``torch._functorch.config.decompose_custom_triton_ops`` off), so a compiled graph calls the
    same launchers an eager call does, and the convolution's operators trace as themselves
    instead of their reference formulas (``conv_level``)."""
    from torch._functorch import config as functorch_config
    saved = functorch_config.decompose_custom_triton_ops
    functorch_config.decompose_custom_triton_ops = False
    try:
        with scoped(_opaque, "on", True):
            yield
    finally:
        functorch_config.decompose_custom_triton_ops = saved


def _opaque_trace() -> bool:
    return getattr(_opaque, "on", False)


def no_kernels_reason(t: torch.Tensor) -> str:
    """Why the Triton kernels cannot run on ``t`` (where ``kernels_can_run(t)`` is false)."""
    if not triton_installed():
        return "Triton is not installed (it ships for Linux only)"
    return (f"the Triton kernels need CUDA tensors, got {t.device.type} tensors "
            f"(TRITON_INTERPRET=1 runs them on the CPU through Triton's interpreter, slowly)")


def unsupported_reason(layout: StackLayout, dtype: torch.dtype) -> str | None:
    """Why the Triton levels cannot run this shape/dtype, or ``None`` if they can."""
    if dtype != torch.float32:
        return f"the Triton levels run float32 only, got {dtype}"
    cf = layout.focus_dim
    if cf % 16 != 0 or cf > MAX_FOCUS_DIM:
        return f"the Triton levels need focus_dim a multiple of 16 up to {MAX_FOCUS_DIM}, got {cf}"
    return None


def forward_level(u0: torch.Tensor, layout: StackLayout) -> int:
    """The level this forward call runs at: the requested one, or 0 if it cannot run."""
    level = levels.get_level()
    if level == 0:
        return 0
    if not kernels_can_run(u0) and not _targeted():
        warn_once(f"no-kernels:{u0.device.type}", f"mixstack: level {level} runs the reference: {no_kernels_reason(u0)}")
        return 0
    reason = unsupported_reason(layout, u0.dtype)
    if reason is not None:
        warn_once(f"unsupported:{reason}", f"mixstack: falling back to the reference: {reason}")
        log.debug("level %d falls back to the reference: %s", level, reason)
        return 0
    return level


# The convolution kernels hold a (edges, channels) tile per subtile; wider channels than the
# stack's widest would need another tiling.
MAX_CONV_CHANNELS = MAX_FOCUS_DIM


def conv_unsupported_reason(channels: int, dtype: torch.dtype) -> str | None:
    """Why the convolution kernels (rotate_in, rotate_out_sum) cannot run, or ``None``."""
    if dtype != torch.float32:
        return f"the Triton levels run float32 only, got {dtype}"
    if channels > MAX_CONV_CHANNELS:
        return f"the convolution kernels take at most {MAX_CONV_CHANNELS} channels, got {channels}"
    return None


def conv_level(t: torch.Tensor, channels: int) -> int:
    """The level a convolution operator runs at for tensor ``t`` (0 where its kernels cannot run).

    While a compiler traces (``torch.compile``, ``torch.export``, ``make_fx``: ``tracing``) the
    convolution's operators run their reference formulas, which Inductor fuses: the bench model compiled at levels 2
    and 3 with the convolution's kernels traced inside gave wrong forces on the H200, where the
    same frames run eagerly are right; compiled, the frame then traces the stack's kernels
    alone, as when compiled level 3 was measured right.  The fault is not isolated: on an H100
    each operator's traced kernels gave right forces (``repro/traced_conv_kernels.py``;
    docs/contract.md §7; BENCHMARKS.md, "The glue on kernels").  Under ``opaque_operators`` a
    trace keeps the operators whole, calls of the eager kernels, and takes them; under a
    ``kernel_target`` (a package for a GPU) it records them, and the package compiles their kernels."""
    level = levels.get_level()
    if level == 0 or not config.conv_kernels_enabled():
        return 0
    if not _targeted():      # a trace for a GPU package records the operators, whose kernels it compiles
        if not kernels_can_run(t):
            warn_once(f"no-kernels:{t.device.type}", f"mixstack: level {level} runs the reference: {no_kernels_reason(t)}")
            return 0
        if tracing(t) and not _opaque_trace():
            return 0
    reason = conv_unsupported_reason(channels, t.dtype)
    if reason is not None:
        warn_once(f"conv-unsupported:{reason}", f"mixstack: falling back to the reference: {reason}")
        return 0
    return level
