"""Run config: presets load, overrides apply, bad keys and layouts give clear errors."""

import pytest

from sigma.config import ConfigError
from sigma.paths import configs_dir
from sigma.train.train_config import apply_overrides, check_layout, load_train_config

PRESETS = sorted((configs_dir() / "train").glob("*.yaml"))


@pytest.mark.parametrize("path", PRESETS, ids=[p.stem for p in PRESETS])
def test_presets_load_and_name_existing_model_presets(path):
    from sigma.train.config import load_model_config

    cfg = load_train_config(path)
    model = load_model_config(cfg.model, cfg.model_overrides)
    check_layout(cfg, cfg.launch.world_size, model.n_experts)
    assert cfg.data.seq_len <= model.max_seq_len


def test_overrides_reach_nested_sections_and_parse_yaml_values():
    path = configs_dir() / "train" / "debug.yaml"
    cfg = load_train_config(path, ["steps=7", "optim.lr=1e-3", "parallel.ep=2", "fault.nan_at_step=3",
                                   "model_overrides.n_layers=3", "name=x"])
    assert (cfg.steps, cfg.optim.lr, cfg.parallel.ep, cfg.fault.nan_at_step) == (7, 1e-3, 2, 3)
    assert cfg.model_overrides == {"n_layers": 3} and cfg.name == "x"
    assert apply_overrides({"a": {"b": 1}}, ["a.c=[1, 2]"]) == {"a": {"b": 1, "c": [1, 2]}}


def test_unknown_key_lists_the_valid_ones(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\noptim:\n  lr: 1.0e-3\n  warmup: 5\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:4 \[optim.warmup\].*valid keys: .*warmup_steps"):
        load_train_config(bad)


def test_wrong_type_and_bad_values_name_the_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: many\n")
    with pytest.raises(ConfigError, match=r"\[steps\]: expected int"):
        load_train_config(bad)
    bad.write_text("optim:\n  lr: 1.0e-3\n  min_lr: 1.0e-2\n")
    with pytest.raises(ConfigError, match=r"\[optim\].*min_lr"):
        load_train_config(bad)
    with pytest.raises(ConfigError, match="not key=value"):
        load_train_config(bad, ["steps"])


def test_layout_checks():
    cfg = load_train_config(configs_dir() / "train" / "debug.yaml", ["parallel.ep=2", "data.global_batch=6"])
    check_layout(cfg, 2, 4)
    with pytest.raises(ConfigError, match="world size 3 .* not divisible by parallel.ep=2"):
        check_layout(cfg, 3, 4)
    with pytest.raises(ConfigError, match="global_batch 6 is not divisible by the 4"):
        check_layout(cfg, 4, 4)
    with pytest.raises(ConfigError, match="5 routed experts cannot be split"):
        check_layout(cfg, 2, 5)


def test_cli_reports_layout_errors_before_submitting(capsys):
    from sigma.cli import main

    code = main(["train", "--config", str(configs_dir() / "train" / "debug.yaml"), "--gpus-per-node", "2",
                 "parallel.ep=4"])
    assert code == 2
    assert "world size 2" in capsys.readouterr().err


def test_docs_cover_every_config_key_and_command():
    import dataclasses

    from sigma.paths import project_root
    from sigma.train.train_config import TrainConfig

    docs = (project_root() / "docs" / "train.md").read_text()
    keys = []
    for f in dataclasses.fields(TrainConfig):
        if dataclasses.is_dataclass(f.default_factory) if f.default_factory is not dataclasses.MISSING else False:
            keys += [f"{f.name}.{sub.name}" for sub in dataclasses.fields(f.default_factory)]
        else:
            keys.append(f.name)
    missing = [k for k in keys if f"`{k}`" not in docs]
    assert not missing, f"docs/train.md does not describe {missing}"
    for command in ("sigma train --config", "sigma train prepare", "sigma train calibrate", "sbatch/train.sbatch",
                    "python -m sigma.train.trainer"):
        assert command in docs
