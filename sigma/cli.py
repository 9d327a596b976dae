"""`sigma`: one command line for admins and researchers.

Each area registers its own subcommands: a module `sigma/<area>/cli.py` with `register(subparsers)`. Handlers
import their heavy dependencies lazily so `sigma health` in a prolog starts fast.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
import sys
import time

# Modules with register(subparsers), in the order of `sigma --help`; ones not present yet are skipped.
COMMAND_MODULES = tuple(f"sigma.{area}.cli" for area in (
    "slurm", "health", "telemetry", "controller", "companion", "rules", "train", "tune", "chaos", "security", "simulate", "site")) + (
    "sigma.train.numerics.cli", "sigma.train.collapse", "sigma.stack", "sigma.demo")


# What SLURM commands print when slurmctld cannot be reached (down, wrong SLURM_CONF).
UNREACHABLE = ("Unable to contact slurm controller", "Connection refused", "configuration source",
               "Socket timed out", "Zero Bytes were transmitted")


class CommandError(RuntimeError):
    """A user-facing failure: printed as `sigma: error: ...` with exit code 2, no traceback."""


def parse_since(text: str | None, now: float | None = None, *, option: str = "--since") -> float | None:
    """A time on the command line: epoch seconds, a duration ago ('90s', '30m', '2h', '7d') or an ISO date/time;
    None for no text."""
    if not text:
        return None
    text, now = text.strip(), now or time.time()
    if re.fullmatch(r"\d+\.\d+|\d{9,}", text):
        return float(text)
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text)
    if m:
        return now - float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    for fmt in ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d"):
        try:
            return time.mktime(time.strptime(text, fmt))
        except ValueError:
            continue
    raise CommandError(f"{option} {text!r}: use e.g. 30m, 2h, 7d (ago), epoch seconds or 2026-11-21T10:00")


def console():
    """A rich console for tables: the terminal's width on a terminal; piped to a file or a pager, as wide as the
    content (rich would otherwise cut every table at 80 columns)."""
    import os

    from rich.console import Console

    wide = not sys.stdout.isatty() and not os.environ.get("COLUMNS")
    return Console(width=100_000 if wide else None)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sigma", description="Keep GPU training clusters on SLURM productive.",
        epilog="New here? `make demo`, then `sigma nodes`, `sigma incidents`, `sigma explain 1`, "
               "`sigma report --html report.html` (README: After the demo). `sigma COMMAND --help` for each command.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        package = name.rpartition(".")[0]
        if importlib.util.find_spec(package) and importlib.util.find_spec(name):
            importlib.import_module(name).register(sub)
    _describe(parser)
    return parser


def _describe(parser: argparse.ArgumentParser) -> None:
    """`sigma X --help` opens with what X does: a command registered without a description gets its help line."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                if not sub.description and helps.get(name):
                    sub.description = helps[name][0].upper() + helps[name][1:] + "."
                _describe(sub)


def main(argv: list[str] | None = None) -> int:
    from sigma.slurm.cluster import ClusterError
    from sigma.slurm.command import SlurmError

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SlurmError as exc:  # the last line SLURM printed, and where to look when it is unreachable
        said = exc.stderr.splitlines()[-1] if exc.stderr else str(exc)
        unreachable = exc.timed_out or any(s in exc.stderr for s in UNREACHABLE)
        print(f"sigma: error: {' '.join(exc.argv[:2])}: {said}" + (
            "; SLURM is not reachable: is it up? (`sigma cluster status`; the local cluster starts with "
            "`sigma cluster up`)" if unreachable else ""), file=sys.stderr)
        return 2
    except (CommandError, ClusterError, FileNotFoundError, ValueError) as exc:
        print(f"sigma: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    # `python -m sigma.cli` runs this file as __main__: use the importable module, whose CommandError the
    # handlers raise, or every user-facing error would surface as a traceback
    from sigma.cli import main as _main

    sys.exit(_main())
