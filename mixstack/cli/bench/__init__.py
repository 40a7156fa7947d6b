"""``mixstack bench <target>``: time, peak memory and accuracy of each level.

One module per target, each with ``HELP``, ``DESCRIPTION``, ``add_arguments(parser)`` (its own
options only) and ``run(args, argv)``.  ``mixstack bench`` without a target runs ``stack``.  A new
target is a module here with those four names and a line in ``TARGETS``.
"""

from __future__ import annotations

from ..common import add_command
from . import deepmd, grid, model, stack, train

TARGETS = {"stack": stack, "model": model, "grid": grid, "train": train, "deepmd": deepmd}
DEFAULT_TARGET = "stack"
HELP_FLAGS = ("-h", "--help")

HELP = "time, peak memory and accuracy of each level: stack (default), model, grid, train, deepmd"
DESCRIPTION = ("Benchmark the mixing stack and what is built on it. `mixstack bench [options]` "
               "without a target is `mixstack bench stack [options]`: shapes S1-S4 and every level on a GPU; "
               "two small shapes at level 0 on a CPU. Each target lists its own options: "
               "`mixstack bench TARGET --help`. Results go to --out, or to a new folder in the user results "
               "folder (MIXSTACK_RESULTS_DIR; docs/configuration.md).")


def add_arguments(p) -> None:
    """A subcommand per target."""
    targets = p.add_subparsers(dest="target", title="targets", metavar="{" + ",".join(TARGETS) + "}")
    for name, module in TARGETS.items():
        add_command(targets, name, module)


def default_target(rest: list[str]) -> list[str]:
    """What to insert after ``bench`` in a command line whose arguments after it are ``rest``:
    ``[DEFAULT_TARGET]`` unless they name a target or ask for ``bench``'s own help."""
    if rest and (rest[0] in TARGETS or rest[0] in HELP_FLAGS):
        return []
    return [DEFAULT_TARGET]


def run(args, argv=None) -> int:
    return TARGETS[args.target].run(args, argv)
