"""``python -m mixstack``: the ``mixstack`` command."""

import sys

from .cli import main

if __name__ == "__main__":          # spawned worker processes (measure.prewarm) import this module too
    sys.exit(main())
