"""Config that cannot fail silently: strict YAML, a knowledge base that must hold rules, `rules --check`."""

from dataclasses import dataclass, field

import pytest

from sigma.cli import main
from sigma.config import ConfigError, load_config
from sigma.controller.config import load_controller_config
from sigma.paths import configs_dir
from sigma.rules.loader import load_rules

RULE = ("  - id: {id}\n    description: d\n    severity: error\n    action: drain\n"
        "    log: {{source: log, kinds: [xid], fields: {{xid: {xid}}}}}\n")


def rules_file(path, *rules, version="version: 1\n"):
    path.write_text(version + "rules:\n" + "".join(RULE.format(**r) for r in rules))
    return path


@dataclass
class Policy:
    names: list[str] = field(default_factory=list)  # a list
    limits: dict[str, list] = field(default_factory=dict)  # key -> list
    window_s: float = 1.0  # a number


def test_a_duplicate_key_names_both_lines(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("window_s: 1\nnames: [a]\nwindow_s: 2\n")
    with pytest.raises(ConfigError, match=r"c.yaml:3 \[window_s\]: duplicate key 'window_s' \(first given at line 1\)"):
        load_config(Policy, p)


def test_a_duplicate_key_inside_a_rule_is_located(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("version: 1\nrules:\n  - id: a\n    description: d\n    severity: info\n    action: record\n"
                 "    log: {source: log}\n    severity: error\n")
    with pytest.raises(ConfigError, match=r"r.yaml:8 \[rules.0.severity\]: duplicate key 'severity'"):
        load_rules(p)


def test_a_scalar_where_a_list_belongs_fails_at_load_time(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("limits:\n  a: 5\n")
    with pytest.raises(ConfigError, match=r"c.yaml:2 \[limits.a\]: expected a list, got int 5"):
        load_config(Policy, p)
    p = rules_file(tmp_path / "r.yaml", {"id": "scalar-xid", "xid": 79})  # fields: {xid: 79}, not [79]
    with pytest.raises(ConfigError, match=r"r.yaml:7 \[rules.0.log.fields.xid\]: expected a list, got int 79"):
        load_rules(p)


def test_non_finite_numbers_are_rejected(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("window_s: .nan\n")
    with pytest.raises(ConfigError, match=r"c.yaml:1 \[window_s\]: expected a finite number"):
        load_config(Policy, p)


def test_yml_and_yaml_files_both_load(tmp_path):
    rules_file(tmp_path / "a.yml", {"id": "a", "xid": [79]})
    rules_file(tmp_path / "b.yaml", {"id": "b", "xid": [48]})
    (tmp_path / "notes.txt").write_text("not a rule file")
    assert [r.id for r in load_rules(tmp_path)] == ["a", "b"]
    assert load_rules(tmp_path)[0].origin.endswith("a.yml:3 [rules.0.id]")


def test_empty_knowledge_bases_are_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"no rule files \(\*.yaml or \*.yml\)"):
        load_rules(tmp_path)
    (tmp_path / "empty.yaml").write_text("# nothing yet\n")
    with pytest.raises(ConfigError, match=r"empty.yaml: empty rules file"):
        load_rules(tmp_path)
    (tmp_path / "empty.yaml").write_text("version: 1\nrules: []\n")
    with pytest.raises(ConfigError, match=r"holds no rules"):
        load_rules(tmp_path)


def test_rules_check_exits_non_zero_and_reports_every_problem(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["controller", "rules", "--check", "--rules", str(empty)]) == 1
    assert "no rule files" in capsys.readouterr().out
    kb = tmp_path / "kb"
    kb.mkdir()
    rules_file(kb / "good.yml", {"id": "good", "xid": [79]})
    rules_file(kb / "bad.yaml", {"id": "bad", "xid": 48})
    (kb / "dup.yaml").write_text("version: 1\nversion: 2\nrules: []\n")
    assert main(["controller", "rules", "--check", "--rules", str(kb)]) == 1
    out = capsys.readouterr().out
    assert "bad.yaml:7 [rules.0.log.fields.xid]: expected a list" in out
    assert "dup.yaml:2 [version]: duplicate key 'version'" in out
    assert "1 valid rules, 2 problem(s)" in out
    assert main(["controller", "rules", "--check", "--rules", str(kb / "good.yml")]) == 0


def test_the_shipped_knowledge_base_and_policy_pass_the_strict_loader(capsys):
    assert main(["controller", "rules", "--check", "--rules", str(configs_dir() / "rules")]) == 0
    assert " 0 problem(s)" in capsys.readouterr().out
    cfg = load_controller_config(configs_dir() / "controller.yaml")
    assert cfg.breaker.wave_max_nodes >= cfg.breaker.max_nodes
