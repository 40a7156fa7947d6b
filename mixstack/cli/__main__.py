"""``python -m mixstack.cli``: the ``mixstack`` command."""

import sys

from . import main

sys.exit(main())
