"""deepmd-kit's plugin hook: the ``deepmd.pt`` entry point of mixstack (pyproject.toml); the
``deepmd.pt_expt`` one is ``plugin_expt``, which calls ``install_expt`` here.

deepmd-kit imports this module while it imports ``deepmd.pt`` (``load_entry_point("deepmd.pt")``
in ``deepmd/pt/__init__.py``), so every command of its PyTorch backend (``dp --pt train``,
``dp --pt test``, ``dp --pt freeze``, the ASE calculator, ``DeepPot``) passes here.  With
``MIXSTACK_DEEPMD=1`` it installs ``install()``: every SeZM descriptor deepmd-kit builds from
then on is accelerated right after construction (``mixstack.deepmd.accelerate``, at the active
mixstack level, ``MIXSTACK_LEVEL``), and the report goes to deepmd-kit's log (logger
``deepmd.mixstack``, INFO); and ``dp --pt freeze`` traces the stacks as mixstack's operators and
tunes their keys (``mixstack.deepmd.freeze``).  ``install_expt()`` does the same for the PT-expt
backend (``dp --pt-expt``: its DPA4 descriptor, its freeze).  Without the variable nothing is
installed.  ``MIXSTACK_FREEZE_SINGLE_RANK=1``, with or without it, makes deepmd-kit's freezes
write packages for one LAMMPS rank (``freeze.single_rank``: one AOTInductor compile, not two).
"""

from __future__ import annotations

import functools
import logging
import sys

from ..core import config

# A child of deepmd-kit's own logger: the report appears in its log (dp's output and log file).
logger = logging.getLogger("deepmd.mixstack")

_MARK = "_mixstack_accelerates"


def _accelerate_on_init(descriptor: type) -> None:
    """Wrap ``descriptor.__init__``: each instance is accelerated once built (idempotent)."""
    init = descriptor.__init__
    if getattr(init, _MARK, False):
        return

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        from .accelerate import accelerate

        logger.info("%s", accelerate(self))

    setattr(__init__, _MARK, True)
    descriptor.__init__ = __init__


def _stop_accelerating(descriptor: type) -> None:
    init = descriptor.__init__
    if getattr(init, _MARK, False):
        descriptor.__init__ = init.__wrapped__


def install() -> None:
    """Accelerate every SeZM descriptor of deepmd-kit's PyTorch backend built from now on, and
    hook its freeze (idempotent)."""
    from .compat import deepmd_pt

    deepmd_pt()                  # inside deepmd.pt's own import (the entry point): the module as it stands
    from deepmd.pt.model.descriptor.sezm import DescrptSeZM

    _accelerate_on_init(DescrptSeZM)
    from . import freeze

    freeze.install()


def install_expt() -> None:
    """The same for deepmd-kit's PT-expt backend: its DPA4 descriptor and its freeze (idempotent)."""
    from .compat import deepmd_pt

    deepmd_pt()
    from deepmd.pt_expt.descriptor.dpa4 import DescrptDPA4

    _accelerate_on_init(DescrptDPA4)
    from . import freeze

    freeze.install_expt()


def uninstall() -> None:
    """Stop accelerating the SeZM descriptors built from now on (those built stay as they are),
    both backends' hooks."""
    from deepmd.pt.model.descriptor.sezm import DescrptSeZM

    from . import freeze

    _stop_accelerating(DescrptSeZM)
    freeze.uninstall()
    if "deepmd.pt_expt.descriptor.dpa4" in sys.modules:
        from deepmd.pt_expt.descriptor.dpa4 import DescrptDPA4

        _stop_accelerating(DescrptDPA4)
        freeze.uninstall_expt()


def installed() -> bool:
    """Whether SeZM descriptors are accelerated as deepmd-kit builds them."""
    from deepmd.pt.model.descriptor.sezm import DescrptSeZM

    return getattr(DescrptSeZM.__init__, _MARK, False)


if config.deepmd_enabled():
    install()
if config.freeze_single_rank():
    from .freeze import single_rank

    single_rank()
