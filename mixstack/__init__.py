"""mixstack: the gated SO(2) mixing stack of equivariant interatomic potentials, exact and fast.

Public API (SPEC §2): ``mixing_stack``, ``MixingStack``, ``reference``,
``set_level`` / ``get_level`` / ``use_level``, ``dispatch_log``; ``tuning`` and
``tune`` (SPEC §5); ``freeze`` and ``load`` (SPEC §6).  The potential
(``mixstack.potential``) and the ASE calculator (``mixstack.calculator``) are
imported on demand, so ``import mixstack`` stays light (no ASE).
"""

from . import reference
from .api import mixing_stack
from .deploy import freeze, load
from .dispatch import dispatch_log
from .levels import get_level, set_level, use_level
from .module import MixingStack
from . import tuning
from .tuning import tune

__version__ = "0.1.0"

__all__ = [
    "MixingStack", "dispatch_log", "freeze", "get_level", "load", "mixing_stack", "reference", "set_level",
    "tune", "tuning", "use_level", "__version__",
]
