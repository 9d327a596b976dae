"""sigma numerics: a reference recorded on this CPU, replayed clean and with each numerical fault injected."""

import json

import pytest
import torch
import torch.nn.functional as F

from sigma.cli import main
from sigma.train.numerics.check import check, similarity
from sigma.train.numerics.faults import FAULTS, inject
from sigma.train.numerics.record import record
from sigma.train.numerics.reference import NumericsError
from sigma.train.train_config import load_train_config
from tests.conftest import REPO

CONFIG = str(REPO / "configs/train/debug.yaml")
RNG_ON = ["model_overrides.dropout=0.1", "model_overrides.router_jitter=0.01"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    torch.set_num_threads(1)
    ref = tmp_path_factory.mktemp("numerics") / "ref"
    record(load_train_config(CONFIG, RNG_ON), ref, steps=3, batch=2, seq_len=16, data=("random",), log=lambda m: None)
    return ref


def test_similarity_of_equal_scaled_and_zero_tensors():
    a = torch.randn(100)
    assert similarity(a, a) == (1.0, 0.0)
    cos, rel = similarity(2 * a, a)
    assert cos == pytest.approx(1.0) and rel == pytest.approx(1.0)
    assert similarity(torch.zeros(3), torch.zeros(3)) == (1.0, 0.0)
    assert similarity(a, torch.zeros(100))[0] == 0.0


def test_reference_holds_every_component(reference):
    meta = json.loads((reference / "meta.json").read_text())
    kinds = {kind for _, kind in meta["units"]}
    assert {"embedding", "attention", "rope", "router", "experts", "shared_expert", "dense_ffn", "residual", "norm",
            "output_head", "loss", "moe_combine"} <= kinds
    assert (reference / "random" / "step-3.pt").is_file()


def test_clean_replay_passes_with_tiny_differences(reference):
    result = check(reference)
    assert not result.flagged, result.to_dict()
    assert all(min(u.cos.values()) > 0.9999 for u in result.units.values())


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_each_fault_is_caught_and_attributed(reference, name):
    with inject(name) as state:
        result = check(reference, faults=state)
    kinds = {result.units[n].kind for n in result.culprits}
    assert kinds and kinds <= set(FAULTS[name].module.split(",")), (name, kinds)


def test_fault_sub_operation_is_named(reference):
    with inject("flash_attn_grad") as state:
        result = check(reference, faults=state)
    assert all("sdpa" in result.units[n].subop for n in result.culprits)
    with inject("gemm_equal_tiles") as state:
        result = check(reference, faults=state)
    assert all(result.units[n].subop.endswith(".wq (output)") for n in result.culprits)


def test_unknown_fault_is_refused():
    with pytest.raises(ValueError, match="unknown numerical fault 'nope'; faults: flash_attn_grad"):
        with inject("nope"):
            pass


def test_reference_of_another_model_is_refused(reference):
    other = load_train_config(str(REPO / "configs/train/tiny.yaml"))
    with pytest.raises(NumericsError, match=r"another model config; differing keys: .*dim: reference 64, --config 256"):
        check(reference, config=other)


def test_nan_in_candidate_is_an_error_not_a_table(reference, monkeypatch):
    original = F.rms_norm
    monkeypatch.setattr(F, "rms_norm", lambda x, *a, **k: original(x, *a, **k) * float("nan"))
    with pytest.raises(NumericsError, match=r"candidate's output of layers.0.attn_norm at step 1 .* NaN"):
        check(reference)


def test_corrupt_and_incomplete_references(reference, tmp_path):
    import shutil

    broken = tmp_path / "ref"
    shutil.copytree(reference, broken)
    (broken / "random" / "step-2.pt").write_bytes(b"not a tensor file")
    with pytest.raises(NumericsError, match=r"step-2.pt: corrupt reference file \(random data, step 2\)"):
        check(broken)
    (broken / "init.pt").unlink()
    with pytest.raises(NumericsError, match=r"init.pt: missing from the reference \(initial weights\)"):
        check(broken)
    meta = json.loads((broken / "meta.json").read_text())
    meta["units"].append(["layers.7.attn", "attention"])
    (broken / "meta.json").write_text(json.dumps(meta))
    shutil.copy(reference / "init.pt", broken / "init.pt")
    with pytest.raises(NumericsError, match="the reference has a attention at layers.7.attn; this model has no"):
        check(broken)
    meta["format"] = 99
    (broken / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(NumericsError, match="reference format 99"):
        check(broken)
    (broken / "meta.json").write_text("{truncated")
    with pytest.raises(NumericsError, match="corrupt reference metadata"):
        check(broken)
    with pytest.raises(NumericsError, match="no such reference directory"):
        check(tmp_path / "absent")


def test_cli_check_json_and_table(reference, capsys):
    assert main(["numerics", "check", "--reference", str(reference), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "pass" and {r["module"] for r in out["table"]} >= {"attention", "router", "loss"}
    assert main(["numerics", "check", "--reference", str(reference), "--fault", "bf16_reduction"]) == 1
    text = capsys.readouterr().out
    assert "FAIL: loss diverge(s)" in text and "loss " in text
    assert main(["numerics", "check", "--reference", str(reference / "nope")]) == 2
    assert "no such reference directory" in capsys.readouterr().err


def test_cli_record_refuses_existing_reference(reference, capsys):
    assert main(["numerics", "record", "--config", CONFIG, "--out", str(reference), "--data", "random"]) == 2
    assert "already holds a reference" in capsys.readouterr().err


def test_cli_record_and_faults(tmp_path, capsys):
    out = tmp_path / "ref"
    assert main(["numerics", "record", "--config", CONFIG, "--out", str(out), "--data", "random", "--steps", "2",
                 "--seq-len", "8"]) == 0
    assert "reference written to" in capsys.readouterr().out
    assert json.loads((out / "meta.json").read_text())["steps"] == 2
    assert main(["numerics", "record", "--config", CONFIG, "--out", str(tmp_path / "r2"), "--data", "real",
                 "data.path=" + str(tmp_path / "nodata")]) == 2
    assert "sigma train prepare" in capsys.readouterr().err
    assert main(["numerics", "faults"]) == 0
    assert set(FAULTS) <= {line.split()[0] for line in capsys.readouterr().out.splitlines()}
