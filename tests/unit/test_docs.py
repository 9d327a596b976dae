"""The README documents every CLI command (and stays in step as commands are added)."""

import argparse

from sigma.cli import build_parser
from tests.conftest import REPO


def commands(parser: argparse.ArgumentParser, prefix: str = "sigma") -> list[str]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.append(f"{prefix} {name}")
                found += commands(sub, f"{prefix} {name}")
    return found


def test_readme_mentions_every_command():
    docs = (REPO / "README.md").read_text() + "".join(p.read_text() for p in (REPO / "docs").glob("*.md"))
    missing = [c for c in commands(build_parser()) if c not in docs]
    assert not missing, f"commands missing from README.md/docs: {missing}"


def test_readme_first_hour_commands_parse():
    """Every `sigma` line of the README's first-hour block is a valid command line (the integration test
    tests/integration/test_first_hour.py runs them on the cluster)."""
    import re
    import shlex

    from sigma.train.cli import submit_parser

    text = (REPO / "README.md").read_text()
    block = re.search(r"<!-- first-hour:[^\n]*-->\n```\n(.*?)```", text, re.S).group(1)
    lines = [line.split("  #")[0].strip() for line in block.splitlines() if line.strip().startswith("sigma ")]
    assert len(lines) >= 8, lines
    for line in lines:
        argv = shlex.split(line)[1:]
        args = build_parser().parse_args(argv)
        if argv[0] == "train":
            submit_parser().parse_args(args.argv)
