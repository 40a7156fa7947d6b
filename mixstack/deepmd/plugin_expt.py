"""deepmd-kit's plugin hook for its PT-expt backend: the ``deepmd.pt_expt`` entry point of mixstack
(pyproject.toml).  deepmd-kit imports it while it imports ``deepmd.pt_expt``; with
``MIXSTACK_DEEPMD=1`` it installs ``plugin.install_expt()`` (``dp --pt-expt``'s DPA4 descriptors
accelerated as they are built, its freeze hooked); without the variable it does nothing."""

from __future__ import annotations

from ..core import config

if config.deepmd_enabled():
    from .plugin import install_expt

    install_expt()
