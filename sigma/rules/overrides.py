"""A site's own decisions about shipped rules, kept apart from the shipped knowledge base.

Where a site disagrees with what a rule does, it says so in its own file (the controller's `rule_overrides`, by
default /etc/sigma/rules.d/*.yaml) instead of editing configs/rules, so an upgrade of the shipped rules keeps the
site's choice and shows both:

    version: 1
    overrides:
      - rule: nic-bond-member-down
        action: notify                     # our bonds are active-backup with a spare link
        why: a bond member down is a ticket here, not a drain

Only what a site decides can be changed (action, severity, requeue_jobs, shadow, enabled, summary); the match is
the rule's own. An override naming no known rule, or making a job-scope rule drain a node, is an error naming its
file and line. Each overridden rule keeps where its action came from (`sigma controller rules` shows it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from sigma.config import ConfigError, from_dict, load_yaml, yaml_files
from sigma.rules.schema import Action, Rule, Severity


@dataclass
class Override:
    rule: str  # id of the shipped rule this changes
    action: Action | None = None  # what the controller does instead
    severity: Severity | None = None  # how bad the site judges it
    requeue_jobs: bool | None = None  # drain actions: requeue the node's jobs, or let them finish
    shadow: bool | None = None  # log what would happen, do nothing
    enabled: bool | None = None  # false: the site does not evaluate the rule at all
    summary: str | None = None  # short text in the drain reason
    why: str = ""  # the site's reason, shown beside the effective action


@dataclass
class OverrideFile:
    version: int  # version of the overrides file
    overrides: list[Override] = field(default_factory=list)  # the site's changes to shipped rules


CHANGES = ("action", "severity", "requeue_jobs", "shadow", "enabled", "summary")


def override_files(location: str | Path | None) -> list[Path]:
    """The override files at a path: a directory's *.yaml / *.yml, or one file; none where nothing is there."""
    if not location:
        return []
    path = Path(location)
    if path.is_dir():
        return yaml_files(path)
    return [path] if path.is_file() else []


def apply_overrides(rules: list[Rule], location: str | Path | None,
                    errors: list[ConfigError] | None = None) -> list[Rule]:
    """The rules with the site's overrides applied (each changed rule records where its action came from).
    errors: given a list, problems are appended to it (and that override skipped); otherwise the first one raises."""
    by_id = {r.id: i for i, r in enumerate(rules)}
    out = list(rules)
    for path in override_files(location):
        data, source = load_yaml(path)
        try:
            if data is None:
                raise ConfigError(str(path), "empty overrides file (expected 'version:' and 'overrides:')")
            overrides = from_dict(OverrideFile, data, source).overrides
        except ConfigError as exc:
            if errors is None:
                raise
            errors.append(exc)
            continue
        for n, o in enumerate(overrides):
            where = source.where(("overrides", n, "rule"))
            try:
                if o.rule not in by_id:
                    raise ConfigError(where, f"no rule {o.rule!r} in the knowledge base to override")
                out[by_id[o.rule]] = _override(out[by_id[o.rule]], o, where)
            except ConfigError as exc:
                if errors is None:
                    raise
                errors.append(exc)
    return out


def _override(rule: Rule, o: Override, where: str) -> Rule:
    changes = {k: getattr(o, k) for k in CHANGES if getattr(o, k) is not None}
    try:
        changed = dataclasses.replace(rule, **changes)  # validated again (a job-scope rule cannot drain)
    except ValueError as exc:
        raise ConfigError(where, str(exc)) from None
    changed.origin = rule.origin
    changed.shipped_action = rule.shipped_action or rule.action
    changed.overridden = f"{where}" + (f": {o.why}" if o.why else "")
    return changed
