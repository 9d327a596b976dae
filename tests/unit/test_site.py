"""A site's deployment files (`sigma site init`), what `sigma site check` says of a host, hostlists in `sigma keys`,
and the wheel carrying what a site deploys."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml

from sigma.cli import main
from sigma.health.config import load_health_config
from sigma.paths import BIN, ETC, KPI_DIR, LOG_DIR, PREFIX, SHIPPED_DIRS, VAR_LIB, project_root
from sigma.security.keys import KeyTable, read_node_key
from sigma.site.check import Host, check
from sigma.site.yamledit import set_values
from sigma.telemetry.config import load

ROOT = Path(__file__).resolve().parents[2]


def init(out: Path, nodes: str = "gpu[003-005]", *extra: str) -> int:
    return main(["site", "init", "--controller", "head", "--nodes", nodes, "--gpus", "8", "--out", str(out), *extra])


def test_init_writes_head_files_and_one_bundle_per_node_of_the_hostlist(tmp_path, capsys):
    out = tmp_path / "site"
    assert init(out) == 0
    head = out / "head" / "etc" / "sigma"
    table = KeyTable(head / "ingest-keys.json").load()
    assert sorted(k.node for k in table.keys) == ["gpu003", "gpu004", "gpu005"]
    assert sorted(p.name for p in (out / "nodes").iterdir()) == ["gpu003.tar", "gpu004.tar", "gpu005.tar"]
    ctl = yaml.safe_load((head / "controller.yaml").read_text())
    assert ctl["rules"] == "/etc/sigma/rules" and ctl["mode"] == "observe" and ctl["listen"] == "0.0.0.0:8470"
    assert (head / "rules" / "gpu.yaml").read_text() == (project_root() / "configs/rules/gpu.yaml").read_text()
    unit = (out / "head/etc/systemd/system/sigma-controller.service").read_text()
    assert f"ExecStart={BIN} controller run --config {ETC}/controller.yaml" in unit
    assert f"root {BIN} rules learn" in (out / "head/etc/cron.d/sigma").read_text()
    conf = (out / "slurm.conf").read_text()
    assert f"Prolog={BIN.parent}/sigma-prolog" in conf and "nohold_on_prolog_fail" in conf

    root = tmp_path / "gpu004"
    with tarfile.open(out / "nodes" / "gpu004.tar") as tar:
        assert {m.name: (m.uid, m.mode) for m in tar.getmembers()}["etc/sigma/ingest.secret"] == (0, 0o600)
        tar.extractall(root)
    key = read_node_key(root / "etc/sigma/ingest.secret")
    assert key.key_id.startswith("gpu004-") and table.for_node("gpu004")[0].secret.encode() == key.secret
    telemetry = load(root / "etc/sigma/telemetry.yaml", node="gpu004")
    assert telemetry.config.push.url == "http://head:8470/v1/ingest"
    health = load_health_config(root / "etc/sigma/health.yaml")
    assert health.profile("gpu004").gpus == 8 and health.profile("gpu004").type == "gpu-8x"
    assert health.prolog.mode == health.epilog.mode == "observe"  # the first rollout drains nothing
    # the shipped file's comments survive: the site's file reads like the shipped one
    assert "# override per run with --controller URL" in (root / "etc/sigma/telemetry.yaml").read_text()


def test_init_again_keeps_the_keys_it_issued_and_the_sites_edits(tmp_path, capsys):
    out = tmp_path / "site"
    assert init(out) == 0
    first = {k.node: k.id for k in KeyTable(out / "head/etc/sigma/ingest-keys.json").load().keys}
    controller = out / "head/etc/sigma/controller.yaml"
    controller.write_text(controller.read_text().replace("\nmode: observe", "\nmode: act"))  # the admins switched
    health = out / "node/etc/sigma/health.yaml"
    health.write_text(health.read_text().replace("    gpus: 8", "    gpus: 8\n    mounts: [/scratch]"))
    assert main(["site", "init", "--controller", "head2", "--nodes", "gpu[003-006]", "--gpus", "8",
                 "--out", str(out)]) == 0
    assert "keys: 1 issued, 3 kept" in capsys.readouterr().out
    again = {k.node: k.id for k in KeyTable(out / "head/etc/sigma/ingest-keys.json").load().keys}
    assert {n: again[n] for n in first} == first and "gpu006" in again
    assert yaml.safe_load(controller.read_text())["mode"] == "act"
    assert load_health_config(health).profile("gpu003").mounts == ["/scratch"]
    with tarfile.open(out / "nodes" / "gpu006.tar") as tar:  # the new node's bundle has the edits and the answers
        files = {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}
    assert "/scratch" in files["etc/sigma/health.yaml"]
    assert "url: http://head2:8470/v1/ingest" in files["etc/sigma/telemetry.yaml"]


def test_init_refuses_a_site_edit_that_does_not_load_and_issues_nothing(tmp_path, capsys):
    out = tmp_path / "site"
    assert init(out) == 0
    controller = out / "head/etc/sigma/controller.yaml"
    controller.write_text(controller.read_text().replace("poll_s: 1.0", "poll_s: soon"))
    assert init(out, "gpu[003-006]") == 2
    err = capsys.readouterr().err
    assert f"{controller}:" in err and "[poll_s]" in err
    assert len(KeyTable(out / "head/etc/sigma/ingest-keys.json").load().keys) == 3


@pytest.mark.parametrize("nodes, said", [("gpu[003-", "'[' without ']'"), ("gpu[5-3]", "'5-3' is not a range"),
                                         ("", "names no node")])
def test_init_refuses_a_bad_hostlist_and_writes_nothing(tmp_path, capsys, nodes, said):
    assert init(tmp_path / "site", nodes) == 2
    assert said in capsys.readouterr().err and not (tmp_path / "site").exists()


def test_keys_issue_expands_a_hostlist(tmp_path, capsys):
    table = tmp_path / "keys.json"
    assert main(["keys", "issue", "gpu[003-005]", "--table", str(table), "--out", str(tmp_path / "k")]) == 0
    assert sorted(k.node for k in KeyTable(table).load().keys) == ["gpu003", "gpu004", "gpu005"]
    assert sorted(p.name for p in (tmp_path / "k").iterdir()) == ["gpu003.key", "gpu004.key", "gpu005.key"]
    assert main(["keys", "revoke", "gpu[004-005]", "--table", str(table)]) == 0
    assert [k.node for k in KeyTable(table).load().keys] == ["gpu003"]
    assert main(["keys", "issue", "gpu[7-", "--table", str(table)]) == 2
    assert "hostlist 'gpu[7-'" in capsys.readouterr().err


def test_check_a_node_root_says_what_is_there_and_what_is_not(tmp_path, capsys):
    out = tmp_path / "site"
    assert init(out) == 0
    root = tmp_path / "gpu003"
    with tarfile.open(out / "nodes" / "gpu003.tar") as tar:
        tar.extractall(root)
    found = {f.what: f for f in check(Host(root), "node", "gpu003", timeout_s=0.5)}
    assert found["ingest key"].status == "ok" and found["telemetry config"].status == "ok"
    assert found["health config"].status == "ok" and found["sigma-sidecar.service"].status == "ok"
    assert found["sigma"].status == "MISSING"  # no /opt/sigma under this root
    assert found["controller"].status == "MISSING"  # nothing answers at http://head:8470
    assert found["slurm.conf"].status == "MISSING"
    # another node's key and a node the hostlist does not name are wrong, each said so
    found = {f.what: f for f in check(Host(root), "node", "gpu009", timeout_s=0.5)}
    assert found["ingest key"].status == "WRONG" and "another node's" in found["ingest key"].detail
    assert found["health config"].status == "WRONG" and "no pattern of `nodes` names gpu009" in \
        found["health config"].detail
    slurm = root / "etc/slurm/slurm.conf"
    slurm.parent.mkdir(parents=True)
    slurm.write_text((out / "slurm.conf").read_text().replace("#RebootProgram", "RebootProgram") +
                     "SchedulerParameters=batch_sched_delay=0\n")
    found = {f.what: f for f in check(Host(root), "node", "gpu003", timeout_s=0.5)}
    assert found["slurm.conf"].status == "WRONG" and "schedulerparameters=batch_sched_delay=0" in \
        found["slurm.conf"].detail
    assert main(["site", "check", "--root", str(root), "--node", "gpu003"]) == 1
    assert "thing(s) to do" in capsys.readouterr().out


def test_set_values_keeps_comments_and_adds_a_key_only_to_a_mapping_the_file_has():
    text = "a: 1  # one\nb:\n  c: x   # see\n  d: [1, 2]\n# tail\n"
    assert set_values(text, {"b.c": "y", "a": 1}) == "a: 1  # one\nb:\n  c: y   # see\n  d: [1, 2]\n# tail\n"
    assert set_values(text, {"b.c": "yes"}).startswith("a: 1  # one\nb:\n  c: 'yes'")  # the string, not true
    assert yaml.safe_load(set_values(text, {"b.e": "z"}))["b"] == {"c": "x", "d": [1, 2], "e": "z"}
    with pytest.raises(KeyError, match="no key 'f.e'"):
        set_values(text, {"f.e": 1})


def test_the_layout_is_the_one_the_units_hooks_and_defaults_use():
    units = {p.name: p.read_text() for p in (project_root() / "daemons").iterdir()}
    assert f"ExecStart={BIN} sidecar --config {ETC}/telemetry.yaml" in units["sigma-sidecar.service"]
    assert f"SIGMA_KPI_DIR={KPI_DIR}" in units["sigma-sidecar.service"]
    assert f"mkdir -p {VAR_LIB} {LOG_DIR}" in units["sigma-controller.service"]
    from sigma.controller.config import ControllerConfig
    from sigma.security.keys import DEFAULT_TABLE
    from sigma.telemetry.config import PushConfig, variables_for
    from sigma.train.kpi import DEFAULT_KPI_DIR

    assert ControllerConfig().db == f"{VAR_LIB}/controller.db" and ControllerConfig().log_dir == str(LOG_DIR)
    assert DEFAULT_TABLE == f"{ETC}/ingest-keys.json" and PushConfig().secret_file == f"{ETC}/ingest.secret"
    assert DEFAULT_KPI_DIR == str(KPI_DIR)
    env = {k: os.environ.pop(k) for k in ("SIGMA_CLUSTER_DIR", "SIGMA_NODE_DIR", "SIGMA_KPI_DIR") if k in os.environ}
    try:
        assert variables_for("gpu003")["node_dir"] == str(VAR_LIB)
    finally:
        os.environ.update(env)
    guide = (ROOT / "docs" / "deploy.md").read_text()
    for path in (PREFIX, ETC, VAR_LIB, KPI_DIR, LOG_DIR, BIN.parent / "sigma-prolog"):
        assert f"`{path}" in guide or f"{path}" in guide, path


def test_the_wheel_carries_what_a_site_deploys(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path), str(ROOT)], check=True, capture_output=True, timeout=600)
    wheel = next(tmp_path.glob("sigma_slurm-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        names = {i.filename: i.external_attr >> 16 for i in z.infolist()}
    tracked = subprocess.run(["git", "ls-files", *SHIPPED_DIRS], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    assert tracked and {f"sigma/share/{p}" for p in tracked} <= set(names)
    assert names["sigma/share/prolog/sigma-prolog"] & 0o111  # executable, as slurmd runs it
    scripts = [n for n in names if ".data/scripts/" in n]
    assert sorted(Path(n).name for n in scripts) == ["sigma-epilog", "sigma-prolog"]
    assert all(names[n] & 0o111 for n in scripts)
