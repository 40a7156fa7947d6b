"""The ``mixstack`` command.

``mixstack info``, ``mixstack bench stack|model|grid|train|deepmd``, ``mixstack tune``,
``mixstack freeze``, ``mixstack md`` and ``mixstack scaling``, one module each: its ``HELP``
line and ``DESCRIPTION``, ``add_arguments(parser)`` and ``run(args, argv)`` (the bench targets
one module each under ``cli/bench/``, the same four names).
``main(argv)`` returns the exit status, so tests call it directly; the console script
``mixstack``, ``python -m mixstack`` and ``python -m mixstack.cli`` run it.
Bad input (a flag, a device, a file, a value) ends with one line naming it and
exit status 2, never a traceback.

Building the parsers imports no torch, nor any module that does: command modules import
the library inside ``run``, so that ``--help``, ``--version`` and argument errors answer at once.
"""

from __future__ import annotations

import argparse
import logging
import sys

from . import bench, freeze, info, md, scaling, tune
from .common import add_command

COMMANDS = {"info": info, "bench": bench, "tune": tune, "freeze": freeze, "md": md, "scaling": scaling}

DESCRIPTION = ("Exact, fast GPU kernels for the gated SO(2) mixing stack of equivariant interatomic "
               "potentials: benchmark, tune, inspect and deploy.")


def version_line() -> str:
    """``mixstack X (torch Y, Triton Z)``, the versions read from the installed packages'
    metadata, so that nothing is imported."""
    from importlib import metadata

    from ..core.version import __version__

    def installed(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"
    return f"mixstack {__version__} (torch {installed('torch')}, Triton {installed('triton')})"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command."""
    p = argparse.ArgumentParser(prog="mixstack", description=DESCRIPTION)
    p.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    p.add_argument("--version", action="version", version=version_line(),
                   help="print the version of mixstack, torch and Triton and exit")
    sub = p.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}")
    for name, module in COMMANDS.items():
        add_command(sub, name, module)
    return p


def with_defaults(argv: list[str]) -> list[str]:
    """``argv`` with the default bench target named: ``mixstack bench [options]`` is
    ``mixstack bench stack [options]``, as it was before ``bench`` had targets."""
    argv = list(argv)
    at = next((i for i, a in enumerate(argv) if not a.startswith("-")), None)
    if at is not None and argv[at] == "bench":
        argv[at + 1:at + 1] = bench.default_target(argv[at + 1:])
    return argv


def parse_args(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None):
    """Parse a ``mixstack`` command line (``sys.argv[1:]`` by default)."""
    argv = sys.argv[1:] if argv is None else argv
    return (parser or build_parser()).parse_args(with_defaults(argv))


def main(argv: list[str] | None = None) -> int:
    """Run ``mixstack <command>``; return the exit status."""
    parser = build_parser()
    try:
        args = parse_args(argv, parser)
    except SystemExit as exc:                # --help, --version (0) or a usage error (2), already printed
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
