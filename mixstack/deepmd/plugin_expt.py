"""deepmd-kit's plugin hook for its PT-expt backend: the ``deepmd.pt_expt`` entry point of mixstack
(pyproject.toml).  deepmd-kit imports it while it imports ``deepmd.pt_expt``; with
``MIXSTACK_DEEPMD=1`` it installs ``plugin.install_expt()`` (``dp --pt-expt``'s DPA4 descriptors
accelerated as they are built, its freeze hooked); without the variable it does nothing.  With
``MIXSTACK_FREEZE_SINGLE_RANK=1`` PT-expt's freezes write packages for one LAMMPS rank
(``freeze.single_rank_expt``)."""

from __future__ import annotations

from ..core import config

if config.deepmd_enabled():
    from .plugin import install_expt

    install_expt()
if config.freeze_single_rank():
    from .freeze import single_rank_expt

    single_rank_expt()
