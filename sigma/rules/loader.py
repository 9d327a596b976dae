"""Load the knowledge base: every `*.yaml` under a directory, typed, with errors naming file:line [key]."""

from __future__ import annotations

from pathlib import Path

from sigma.config import ConfigError, from_dict, load_yaml
from sigma.rules.schema import Rule, RuleFile


def load_rule_file(path: str | Path) -> list[Rule]:
    data, source = load_yaml(path)
    if data is None:
        return []
    return from_dict(RuleFile, data, source).rules


def load_rules(location: str | Path) -> list[Rule]:
    """Rules from one file or from every *.yaml in a directory (sorted by name); ids must be unique."""
    location = Path(location)
    if location.is_dir():
        files = sorted(location.glob("*.yaml"))
    elif location.exists():
        files = [location]
    else:
        raise ConfigError(str(location), "no such rules file or directory")
    rules: list[Rule] = []
    seen: dict[str, str] = {}
    for path in files:
        data, source = load_yaml(path)
        for i, rule in enumerate(load_rule_file(path)):
            if rule.id in seen:
                raise ConfigError(source.where(("rules", i, "id")),
                                  f"duplicate rule id {rule.id!r} (first defined in {seen[rule.id]})")
            seen[rule.id] = source.where(("rules", i, "id"))
            rules.append(rule)
    return rules
