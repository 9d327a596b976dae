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
