"""The ``mixstack`` command.

``mixstack info``, ``mixstack bench [stack|model]``, ``mixstack tune``,
``mixstack freeze`` and ``mixstack md``, one module each (``add_parser`` and ``run``).  ``main(argv)``
returns the exit status, so tests call it directly; the console script
``mixstack``, ``python -m mixstack`` and ``python -m mixstack.cli`` run it.
Bad input (a flag, a device, a file, a value) ends with one line naming it and
exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys

from . import bench, freeze, info, md, tune

COMMANDS = {"info": info, "bench": bench, "tune": tune, "freeze": freeze, "md": md}

DESCRIPTION = ("Exact, fast GPU kernels for the gated SO(2) mixing stack of equivariant interatomic "
               "potentials: benchmark, tune, inspect and deploy.")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command."""
    p = argparse.ArgumentParser(prog="mixstack", description=DESCRIPTION)
    p.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = p.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}")
    for module in COMMANDS.values():
        module.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run ``mixstack <command>``; return the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:                # --help (0) or a usage error (2), already printed
        return int(exc.code or 0)
    if args.command is None:
        parser.print_usage(sys.stderr)
        print(f"mixstack: error: choose a command: {', '.join(COMMANDS)} (mixstack --help says more)",
              file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return COMMANDS[args.command].run(args, argv)
    except (ValueError, ImportError, FileNotFoundError) as exc:
        print(f"mixstack {args.command}: error: {exc}", file=sys.stderr)
        return 2
