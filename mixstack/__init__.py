"""mixstack: the gated SO(2) mixing stack of equivariant interatomic potentials, exact and fast.

Public API (docs/contract.md §2): ``mixing_stack``, ``MixingStack``,
``reference``, ``set_level`` / ``get_level`` / ``use_level``, ``dispatch_log``;
``rotate_in`` and ``rotate_out_sum``, the convolution's rotations around the stack, and
``LinearRadial``, radial weights given as the layer that makes them, and ``edge_wigner``, the
packed Wigner rows they read (docs/contract.md §7);
``tuning`` (the tables) and ``tune`` (the sweep, docs/contract.md §5);
``freeze`` and ``load`` (docs/contract.md §6).  The potential and its ASE
calculator (``mixstack.potential``, ``mixstack.potential.calculator``) are
imported on demand, so ``import mixstack`` stays light (no ASE).
"""

from . import reference, tuning
from .conv import edge_wigner, rotate_in, rotate_out_sum
from .conv_layout import LinearRadial
from .dispatch.levels import get_level, set_level, use_level
from .dispatch.log import dispatch_log
from .export import freeze, load
from .functional import mixing_stack
from .nn import MixingStack
from .tuner import tune
from .version import __version__

__all__ = [
    "LinearRadial", "MixingStack", "dispatch_log", "edge_wigner", "freeze", "get_level", "load", "mixing_stack",
    "reference", "rotate_in",
    "rotate_out_sum", "set_level", "tune", "tuning", "use_level", "__version__",
]
