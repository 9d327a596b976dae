"""`sigma rules ...` end to end on a real controller database: label, learn, candidates, show, promote, reject."""

import json
import shutil

import pytest

from sigma.cli import main
from sigma.paths import configs_dir
from tests.unit.rules_learn_helpers import NVME, T0, FakeHistory


@pytest.fixture
def setup(tmp_path):
    shutil.copytree(configs_dir() / "rules", tmp_path / "rules")
    h = FakeHistory(tmp_path / "c.db", hours=1)
    with h.conn:
        h.event("node3", T0 + 1800, NVME.format(code=19))
    (tmp_path / "learn.yaml").write_text("proposers: [deterministic]\n")
    args = ["--db", str(tmp_path / "c.db"), "--rules", str(tmp_path / "rules"),
            "--learn-config", str(tmp_path / "learn.yaml")]
    return tmp_path, args


def sigma(capsys, *argv) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_label_learn_review_promote_reject(setup, capsys):
    tmp, common = setup
    rc, _, err = sigma(capsys, "rules", "learn", "--since", "2020-01-01", *common)
    assert rc == 2 and "no confirmed incident or fault label" in err and "sigma rules label" in err
    rc, out, _ = sigma(capsys, "rules", "label", "--node", "node3", "--at", str(T0 + 1800), "--cause", "nvme reset",
                       "--category", "disk", *common)
    assert rc == 0 and "label 1: node3" in out and "a fault: nvme reset" in out
    rc, out, _ = sigma(capsys, "rules", "learn", "--since", "2020-01-01", *common)
    assert rc == 0 and "cause 'nvme reset'" in out and "candidate written" in out
    rc, out, _ = sigma(capsys, "rules", "candidates", "--json", *common)
    (cand,) = json.loads(out)
    cid = cand["candidate"]["id"]
    rc, out, _ = sigma(capsys, "rules", "show", cid[:22], *common)
    assert rc == 0 and "provenance:" in out and "examples:" in out and "rule:" in out
    rc, out, _ = sigma(capsys, "rules", "promote", cid, *common)
    assert rc == 0 and "shadow mode" in out and f"sigma rules promote {cid} --live" in out
    rc, out, _ = sigma(capsys, "rules", "promote", cid, "--live", *common)
    assert rc == 0 and "live" in out
    rc, out, _ = sigma(capsys, "rules", "reject", cid, "--reason", "not needed", *common)
    assert rc == 0
    rc, out, _ = sigma(capsys, "rules", "candidates", *common)
    assert "no candidates" in out
    rc, _, err = sigma(capsys, "rules", "show", "nope", *common)
    assert rc == 2 and "no candidate 'nope'" in err


def test_label_needs_a_time_and_a_cause(setup, capsys):
    _, common = setup
    rc, _, err = sigma(capsys, "rules", "label", "--node", "node1", "--cause", "x", *common)
    assert rc == 2 and "--at TIME or --incident ID" in err
    rc, _, err = sigma(capsys, "rules", "label", "--node", "node1", "--at", "5m", *common)
    assert rc == 2 and "needs a cause" in err
    rc, _, err = sigma(capsys, "rules", "label", "--node", "node1", "--at", "yesterday", "--cause", "x", *common)
    assert rc == 2 and "'yesterday'" in err
    rc, out, _ = sigma(capsys, "rules", "label", "--node", "node1", "--at", "5m", "--healthy", "--json", *common)
    assert json.loads(out)["verdict"] == "healthy"
