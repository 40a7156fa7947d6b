"""``python -m mixstack``: the ``mixstack`` command."""

import sys

from .cli import main

sys.exit(main())
