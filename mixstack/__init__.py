"""mixstack: the gated SO(2) mixing stack of equivariant interatomic potentials, exact and fast.

Public API (docs/contract.md §2): ``mixing_stack``, ``MixingStack``,
``reference``, ``set_level`` / ``get_level`` / ``use_level``, ``dispatch_log``;
``rotate_in`` and ``rotate_out_sum``, the convolution's rotations around the stack, and
``LinearRadial``, radial weights given as the layer that makes them, ``DegreeMix``, a per-edge
mix of degrees, ``edge_order`` / ``EdgeOrder``, the edges grouped by destination, and
``edge_wigner``, the packed Wigner rows they read (docs/contract.md §7, docs/convolution.md);
``tuning`` (the tables) and ``tune`` (the sweep, docs/contract.md §5);
``freeze`` and ``load`` (docs/contract.md §6).  The potential and its ASE
calculator (``mixstack.potential``, ``mixstack.potential.calculator``) are
imported on demand, so ``import mixstack`` stays light (no ASE, no tuner, no compiler).
"""

from . import reference, tuning
from .conv.functional import edge_order, edge_wigner, rotate_in, rotate_out_sum
from .conv.layout import DegreeMix, EdgeOrder, LinearRadial
from .core.version import __version__
from .dispatch.levels import get_level, set_level, use_level
from .dispatch.log import dispatch_log
from .stack.functional import mixing_stack
from .stack.nn import MixingStack

_LAZY = {"tune": ("tuner", "tune"), "freeze": ("export", "freeze"), "load": ("export", "load")}


def __getattr__(name):
    """``tune``, ``freeze`` and ``load`` on first use: they sit on upper floors (the sweep, the
    compiler), so ``import mixstack`` loads only the operators."""
    if name in _LAZY:
        import importlib
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(f"{__name__}.{module}"), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DegreeMix", "EdgeOrder", "LinearRadial", "MixingStack", "dispatch_log", "edge_order", "edge_wigner", "freeze",
    "get_level", "load", "mixing_stack", "reference", "rotate_in",
    "rotate_out_sum", "set_level", "tune", "tuning", "use_level", "__version__",
]
