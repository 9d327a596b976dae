"""docs/rules.md covers every `sigma rules` command, learning setting and composite condition key."""

import dataclasses
import re

from sigma.cli import build_parser
from sigma.paths import project_root
from sigma.rules.composite import Composite, Condition, PeerRank
from sigma.rules.learn.config import LearnConfig, LlmConfig

DOC = (project_root() / "docs" / "rules.md").read_text()


def test_every_setting_and_condition_key_is_documented():
    for cls in (LearnConfig, LlmConfig, PeerRank, Condition, Composite):
        for f in dataclasses.fields(cls):
            assert re.search(rf"`[^`]*\b{f.name}\b[^`]*`", DOC), f"{cls.__name__}.{f.name} not in docs/rules.md"


def test_every_rules_command_is_documented():
    parser = build_parser()
    rules = next(a for a in parser._actions if a.dest == "command").choices["rules"]
    actions = next(a for a in rules._actions if a.dest == "action").choices
    assert set(actions) == {"learn", "candidates", "show", "promote", "reject", "label"}
    for name in actions:
        assert f"sigma rules {name}" in DOC
    assert (project_root() / "sbatch" / "learn-rules.sbatch").exists() and "learn-rules.sbatch" in DOC


def test_learn_rules_sbatch_is_valid_bash_and_runs_sigma_rules_learn():
    import subprocess

    script = project_root() / "sbatch" / "learn-rules.sbatch"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    assert '"$sigma" rules learn "$@"' in text and "#SBATCH --job-name=sigma-learn-rules" in text
