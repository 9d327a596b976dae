"""Load the knowledge base: every `*.yaml` / `*.yml` under a directory, typed, with errors naming file:line [key].

Strict: a file that is empty or not a rule file, a directory without rule files, a knowledge base with no rules
at all and a rule id defined twice are errors, never an empty or partial rule set loaded without a word.
"""

from __future__ import annotations

from pathlib import Path

from sigma.config import ConfigError, from_dict, load_yaml, yaml_files
from sigma.rules.schema import Rule, RuleFile


def load_rule_file(path: str | Path) -> list[Rule]:
    data, source = load_yaml(path)
    if data is None:
        raise ConfigError(str(path), "empty rules file (expected 'version:' and 'rules:')")
    rules = from_dict(RuleFile, data, source).rules
    for i, rule in enumerate(rules):
        rule.origin = source.where(("rules", i, "id"))
    return rules


def rule_files(location: str | Path) -> list[Path]:
    location = Path(location)
    if location.is_dir():
        files = yaml_files(location)
        if not files:
            raise ConfigError(str(location), "no rule files (*.yaml or *.yml) in this directory")
        return files
    if location.exists():
        return [location]
    raise ConfigError(str(location), "no such rules file or directory")


def load_rules(location: str | Path, errors: list[ConfigError] | None = None,
               overrides: str | Path | None = None) -> list[Rule]:
    """Rules from one file or from every YAML file in a directory (sorted by name); ids must be unique; then the
    site's overrides (sigma.rules.overrides) at `overrides`, where there are any.

    errors: given a list, every problem is appended to it and the valid rules are returned (for `--check`, which
    reports all of them at once); without one, the first problem raises ConfigError.
    """
    def fail(exc: ConfigError) -> None:
        if errors is None:
            raise exc
        errors.append(exc)

    rules: list[Rule] = []
    seen: dict[str, str] = {}
    files = rule_files(location)
    for path in files:
        try:
            loaded = load_rule_file(path)
        except ConfigError as exc:
            fail(exc)
            continue
        for rule in loaded:
            if rule.id in seen:
                fail(ConfigError(rule.origin, f"duplicate rule id {rule.id!r} (first defined in {seen[rule.id]})"))
                continue
            seen[rule.id] = rule.origin
            rules.append(rule)
    if not rules and not (errors or []):
        fail(ConfigError(str(location), f"the knowledge base holds no rules ({len(files)} file(s) read)"))
    if overrides:
        from sigma.rules.overrides import apply_overrides

        rules = apply_overrides(rules, overrides, errors)
    return rules
