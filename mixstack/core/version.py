"""The package version (one place; ``mixstack.__version__`` and table stamps read it)."""

__version__ = "0.1.0"
