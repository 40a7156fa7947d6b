"""``python -m mixstack.deepmd.dp ARGS``: deepmd-kit's ``dp`` command, with mixstack's plugin.

The same as ``dp ARGS`` where mixstack is installed with its entry point, with two differences
that matter on machines where deepmd-kit's wheel and torch disagree (a CPU test machine):
``deepmd.pt`` is imported through ``mixstack.deepmd.compat`` (a stand-in for its compiled op
library when that cannot load), and the plugin module (``plugin_expt`` too for ``--pt-expt``) is
imported whether or not the entry point is registered (a source checkout).  ``MIXSTACK_DEEPMD=1`` still switches it on.
"""

from __future__ import annotations

import sys


def main(argv=None) -> int:
    from .compat import deepmd_pt

    deepmd_pt()
    from deepmd.main import main as dp_main

    from . import plugin  # noqa: F401  (the entry point, also where it is not registered)

    args = list(sys.argv[1:] if argv is None else argv)
    if "--pt-expt" in args or "--pt_expt" in args:
        from . import plugin_expt  # noqa: F401  (the PT-expt backend's entry point, the same way)
    dp_main(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
