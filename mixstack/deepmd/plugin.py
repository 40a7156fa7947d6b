"""deepmd-kit's plugin hook: the ``deepmd.pt`` entry point of mixstack (pyproject.toml).

deepmd-kit imports this module while it imports ``deepmd.pt`` (``load_entry_point("deepmd.pt")``
in ``deepmd/pt/__init__.py``), so every command of its PyTorch backend (``dp --pt train``,
``dp --pt test``, ``dp --pt freeze``, the ASE calculator, ``DeepPot``) passes here.  With
``MIXSTACK_DEEPMD=1`` it installs ``install()``: every SeZM descriptor deepmd-kit builds from
then on is accelerated right after construction (``mixstack.deepmd.accelerate``, at the active
mixstack level, ``MIXSTACK_LEVEL``), and the report goes to deepmd-kit's log (logger
``deepmd.mixstack``, INFO); and ``dp --pt freeze`` traces the stacks as mixstack's operators and
tunes their keys (``mixstack.deepmd.freeze``).  Without the variable it does nothing.
"""

from __future__ import annotations

import functools
import logging

from ..core import config

# A child of deepmd-kit's own logger: the report appears in its log (dp's output and log file).
logger = logging.getLogger("deepmd.mixstack")

_MARK = "_mixstack_accelerates"


def install() -> None:
    """Accelerate every SeZM descriptor built from now on (idempotent)."""
    from .compat import deepmd_pt

    deepmd_pt()                  # inside deepmd.pt's own import (the entry point): the module as it stands
    from deepmd.pt.model.descriptor.sezm import DescrptSeZM

    init = DescrptSeZM.__init__
    if getattr(init, _MARK, False):
        return

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        from .accelerate import accelerate

        logger.info("%s", accelerate(self))

    setattr(__init__, _MARK, True)
    DescrptSeZM.__init__ = __init__
    from . import freeze

    freeze.install()


def uninstall() -> None:
    """Stop accelerating the SeZM descriptors built from now on (those built stay as they are)."""
    from deepmd.pt.model.descriptor.sezm import DescrptSeZM

    init = DescrptSeZM.__init__
    if getattr(init, _MARK, False):
        DescrptSeZM.__init__ = init.__wrapped__
    from . import freeze

    freeze.uninstall()


def installed() -> bool:
    """Whether SeZM descriptors are accelerated as deepmd-kit builds them."""
    from deepmd.pt.model.descriptor.sezm import DescrptSeZM

    return getattr(DescrptSeZM.__init__, _MARK, False)


if config.deepmd_enabled():
    install()
