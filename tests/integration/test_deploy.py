"""docs/deploy.md, followed step by step on emulated hosts that share nothing but what a cluster shares.

The wheel is built from this checkout and installed into a fresh virtual environment at /opt/sigma of the node
image; a head node and three compute nodes, each in its own network namespace with its own host name, address,
processes and file system (tests/integration/hosts.py), run the site's own SLURM, munge and (on the nodes)
journald (tests/integration/slurm_site.py). Then the guide: `sigma site init` on the head, the head's files under
its /, each node's bundle unpacked on that node, the units started as their ExecStart lines say, slurm.conf's
lines, `sigma site check` on every host, a first fault in observe mode, the switch to acting, and an Xid 79, a hung
job and a node death each through to return to service. The sidecars push to the head over the cluster's network;
kernel lines reach each node's journal as the kernel's do (its ring buffer, read by journald).
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.integration import hosts
from tests.integration.slurm_site import Site

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
NODES = ["gpu003", "gpu004", "gpu005"]
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python3, GPU has fallen off the bus."
JOB = """#!/bin/sh
#SBATCH --job-name=train
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --output=/home/train-%j.out
export KPI_JOB_SYNC_DIR=/home/sync   # the ranks meet on the shared file system; KPIs stay on each node
exec srun python3 /home/kpi_job.py 0.5
"""
QUERY = ("import json, sqlite3, sys; c = sqlite3.connect('file:/var/lib/sigma/controller.db?mode=ro', uri=True); "
         "c.row_factory = sqlite3.Row; print(json.dumps([dict(r) for r in c.execute(sys.argv[1], json.loads("
         "sys.argv[2]))]))")


def sql(head: hosts.Host, query: str, *args) -> list[dict]:
    """The controller database, read-only (measurements only; the platform is driven by its commands)."""
    out = head.run(f"/opt/sigma/bin/python -c {shlex.quote(QUERY)} {shlex.quote(query)} "
                   f"{shlex.quote(json.dumps(args))}", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else []


def lifecycle(head, node) -> dict:
    rows = sql(head, "SELECT * FROM node_lifecycle WHERE node = ?", node)
    return rows[0] if rows else {}


def job_run(head, job_id: int) -> tuple[list[str], float]:
    """The nodes of the job's current run and when it started ([] while it does not run)."""
    out = head.run(f"squeue -h -j {job_id} -o '%t %N %S'", check=False).stdout.split()
    if len(out) != 3 or out[0] != "R":
        return [], 0.0
    return (head.run(f"scontrol show hostnames {out[1]}").stdout.split(),
            time.mktime(time.strptime(out[2], "%Y-%m-%dT%H:%M:%S")))


def steps_after(head, job_id: int, node: str, since: float) -> int:
    rows = sql(head, "SELECT COUNT(*) AS n FROM kpis WHERE job_id = ? AND node = ? AND ts > ? AND step IS NOT NULL",
               job_id, node, since)
    return rows[0]["n"] if rows else 0


def back_in_service(site: Site, node: str, incident_rule: str, since: float, timeout: float) -> dict:
    """The node went drained -> ... -> resumed for the incident of that rule opened after `since`."""
    head = site.head

    def resumed():
        inc = sql(head, "SELECT id FROM incidents WHERE node = ? AND rule_id = ? AND opened_at > ?", node,
                  incident_rule, since)
        lc = lifecycle(head, node)
        return inc and lc.get("incident_id") == inc[0]["id"] and lc.get("state") == "resumed" and lc
    try:
        return wait_for(resumed, timeout=timeout, interval=2, what=f"{node} back in service after {incident_rule}")
    except AssertionError:
        raise AssertionError(f"{node} not back in service after {incident_rule}: {lifecycle(head, node)}\n"
                             f"{head.run('sigma nodes; sigma incidents; sinfo -R', check=False).stdout}\n"
                             f"{head.read('/var/log/sigma/decisions.log')[-4000:]}") from None


class Clock:
    """Milestones since the start, printed as they happen (pytest -s shows them) and kept for the summary."""

    def __init__(self):
        self.t0, self.marks = time.monotonic(), []

    def __call__(self, what: str) -> None:
        self.marks.append((time.monotonic() - self.t0, what))
        print(f"{self.marks[-1][0]:7.1f} s  {what}", flush=True)


@pytest.fixture
def site(tmp_path):
    why = hosts.available()
    if why:
        pytest.fail(f"the deployment test needs emulated hosts: {why}")
    mark = Clock()
    # 1. The package (docs/deploy.md: `make wheel`, which is this command)
    home = tmp_path / "home"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(home / "dist"), str(ROOT)], check=True, capture_output=True, timeout=600)
    mark("wheel built")
    # 2. Install, once into the node image every host boots with: a fresh virtual environment at /opt/sigma
    image = tmp_path / "image"
    image.mkdir()
    builder = hosts.Host("image", "", tmp_path / "build", netns=None, shared=home, image=image, image_writable=True)
    builder.write("/etc/rc.boot", "#!/bin/sh\n", 0o755)
    builder.start()
    try:
        builder.run("python3 -m venv /opt/sigma && /opt/sigma/bin/pip install -q --no-compile "
                    "/home/dist/sigma_slurm-*.whl && /opt/sigma/bin/sigma --help >/dev/null", timeout=1500)
    finally:
        builder.stop()
    mark("installed into a fresh virtual environment")
    s = Site(tmp_path, "head", NODES, image=image)
    try:
        s.up()
        mark("the site's SLURM up on 4 emulated hosts")
        s.mark = mark
        yield s
    finally:
        for h in s.hosts.values():  # what each host logged, for a failure's report
            for log in ("/var/log/sigma/decisions.log", "/var/log/sigma-sidecar.log", "/var/log/slurm/slurmd.log",
                        "/var/log/slurm/slurmctld.log"):
                text = h.read(log) if h.pid else ""
                if text:
                    (tmp_path / f"{h.name}-{Path(log).name}").write_text(text)
            if h.pid:
                for out in h.run("ls /var/lib/sigma/validate-*.out 2>/dev/null", check=False).stdout.split():
                    (tmp_path / f"{h.name}-{Path(out).name}").write_text(h.read(out))
        s.down()
        shutil.rmtree(image, ignore_errors=True)  # the installed environment (about 1 GB)


def test_deploy_by_the_guide_and_return_three_faults_to_service(site):
    head, nodes, mark = site.head, {n.name: n for n in site.nodes()}, site.mark
    for host in site.hosts.values():  # 2. `sigma` on admins' PATH
        host.run("ln -s /opt/sigma/bin/sigma /usr/local/bin/sigma && sigma --help >/dev/null")

    # 4. The site's files
    out = head.run("sigma site init --controller head --nodes 'gpu[003-005]' --gpus 0 --out /root/sigma-site").stdout
    assert "keys: 3 issued" in out
    # the site's own edits before copying (docs/deploy.md: review and edit): hangs are judged after 20 s (the shipped
    # 120 s is for real jobs); the validation of these CPU-only hosts, which share two cores, runs the checks that
    # judge them in seconds (the GEMM and collective checks only measure until a baseline is recorded)
    head.run("sed -i 's/^  hang_timeout_s: 120$/  hang_timeout_s: 20/' /root/sigma-site/head/etc/sigma/controller.yaml")
    checks = ", ".join(f"--check, {c}" for c in ("accelerators", "kernel_log", "free_memory", "disk", "net_interfaces",
                                                  "stray_processes", "gemm_sustained", "train_step"))
    head.run(f"sed -i 's|^  script: sbatch/validate-node.sbatch$|&\\n  args: [{checks}]|' "
             "/root/sigma-site/head/etc/sigma/remediation.yaml")

    # 5. Head node
    head.run("cp -a /root/sigma-site/head/. /")
    site.enable(head, "sigma-controller.service")

    # 6. Compute nodes: each its own bundle, carried to it as scp would, then the sidecar
    for name, node in nodes.items():
        node.copy_in(head.fetch(f"/root/sigma-site/nodes/{name}.tar"), "/root/sigma-node.tar")
        node.run("tar -xpf /root/sigma-node.tar -C / && rm /root/sigma-node.tar")
        site.enable(node, "sigma-sidecar.service")
    assert head.run("sigma site check", check=False).returncode == 1  # slurm.conf lacks sigma's lines yet

    # 7. slurm.conf: the lines on every host, then scontrol reconfigure
    lines = head.read("/root/sigma-site/slurm.conf")
    for host in site.hosts.values():
        host.run("cat >> /etc/slurm/slurm.conf", input=lines)
    head.run("scontrol reconfigure")

    # 8. Every host checked: nothing missing
    for host in site.hosts.values():
        check = wait_for(lambda: (c := host.run("sigma site check", check=False)).returncode == 0 and c,
                         timeout=60, what=f"sigma site check on {host.name}")
        assert check.stdout.strip().endswith("ready"), check.stdout
    node_check = nodes["gpu004"].run("sigma site check").stdout
    assert "the systemd journal" in node_check and "http://head:8470/healthz answers" in node_check, node_check
    assert "key gpu004-" in node_check  # its own key
    wait_for(lambda: len(sql(head, "SELECT DISTINCT node FROM events WHERE source = 'sidecar'")) == 3, timeout=90,
             what="every sidecar pushing to the head")
    mark("deployed: every host checked, every sidecar pushing")

    # 9. First rollout, observe mode: a fault is recorded, SLURM is not touched
    t0 = time.time()
    nodes["gpu005"].kernel(XID79)
    observed = wait_for(lambda: sql(head, "SELECT * FROM incidents WHERE node = 'gpu005' AND opened_at > ?", t0),
                        timeout=60, what="the observed Xid's incident")
    assert observed[0]["rule_id"] == "gpu-xid-79" and observed[0]["status"] == "shadow"
    assert "gpu005" not in head.run("sinfo -R -h").stdout
    assert "OBSERVE mode" in head.run("sigma nodes").stdout
    mark("observe mode: the Xid on gpu005 recorded, nothing done")
    # ... and the switch to acting, by the guide
    head.run("sed -i 's/^mode: observe/mode: act/' /etc/sigma/controller.yaml && sigma controller rules --check")
    site.reload(head, "sigma-controller.service")
    for node in nodes.values():
        node.run("sed -i 's/^  mode: observe/  mode: act/' /etc/sigma/health.yaml")
    wait_for(lambda: "RELOAD applied" in (log := head.read("/var/log/sigma/decisions.log")) and
             "ACT mode" in log.split("RELOAD applied")[-1], timeout=60, what="the controller acting")
    # what observe mode would have done is the admins' to do: they agree, and take gpu005 out by hand
    head.run("scontrol update NodeName=gpu005 State=DRAIN Reason='xid 79 seen in observe mode'")
    mark("acting; gpu005 drained by an admin")

    # A training job on two nodes that reports its KPIs (the KPI protocol: JSON lines in each node's KPI directory)
    head.run("cat > /home/kpi_job.py", input=(ROOT / "tests/integration/kpi_job.py").read_text())
    head.run("cat > /home/train.sbatch", input=JOB)
    job = int(head.run("cd /home && sbatch --parsable train.sbatch").stdout.strip())

    def training(since: float) -> list[str]:
        """The nodes of the job's run started after `since`, once each of its ranks reported steps."""
        on, start = job_run(head, job)
        return on if on and start >= int(since) and all(steps_after(head, job, n, start) >= 3 for n in on) else []

    # Fault 1: an Xid 79 on one of the job's nodes, through that node's journal
    first = wait_for(lambda: training(0), timeout=180, what="the job training")[0]
    t1 = time.time()
    nodes[first].kernel(XID79)
    back = back_in_service(site, first, "gpu-xid-79", t1, timeout=600)
    acks = sql(head, "SELECT * FROM node_requests WHERE node = ? AND kind = 'log-ack' AND requested_at > ?", first, t1)
    assert acks and acks[0]["answered_at"], acks  # the node acknowledged its own kernel log, through its sidecar
    reboots = sql(head, "SELECT COUNT(*) AS n FROM actions WHERE kind = 'reboot' AND target = ? AND state = 'done'"
                        " AND created_at > ?", first, t1)
    assert reboots[0]["n"] == 1
    mark(f"Xid 79 on {first}: drained, job requeued, rebooted, kernel log acknowledged, validated, back in service "
         f"{back['updated_at'] - t1:.0f} s after the line")

    # Fault 2: the job's rank on its other node hangs (its process stopped); the rank beside it waits for it
    second = next(n for n in wait_for(lambda: training(t1), timeout=300, what="the job training after the Xid")
                  if n != first)
    t2 = time.time()
    nodes[second].run("pkill -STOP -f '[k]pi_job.py'")
    back = back_in_service(site, second, "watchdog-hang", t2, timeout=600)
    mark(f"hang on {second}: isolated, drained, job requeued, rebooted, validated, back in service "
         f"{back['updated_at'] - t2:.0f} s after the stop")

    # Fault 3: a node of the job dies (every process of that host gone); an admin powers it back on
    third = next(n for n in wait_for(lambda: training(t2), timeout=300, what="the job training after the hang")
                 if n != second)
    t3 = time.time()
    nodes[third].power_off()
    wait_for(lambda: sql(head, "SELECT 1 FROM incidents WHERE node = ? AND rule_id = 'slurm-node-not-responding'"
                               " AND opened_at > ?", third, t3), timeout=180, what=f"{third}'s death detected")
    wait_for(lambda: lifecycle(head, third).get("state") == "remediating", timeout=120, what="waiting for a person")
    nodes[third].reboot()  # power on: it boots, its units start
    wait_for(lambda: not head.run(f"sinfo -h -n {third} -o %t").stdout.strip().endswith("*"), timeout=120,
             what=f"{third}'s slurmd answering again")
    head.run(f"sigma nodes --repaired {third}")
    back = back_in_service(site, third, "slurm-node-not-responding", t3, timeout=600)
    wait_for(lambda: training(t3), timeout=300, what="the job training after the node death")
    mark(f"death of {third}: detected, set down, job requeued, powered on, repaired, validated, back in service "
         f"{back['updated_at'] - t3:.0f} s after the power-off")

    # gpu005, repaired by hand: its kernel log acknowledged on the node, then back into service
    nodes["gpu005"].run("sigma health log-ack")
    head.run("scontrol update NodeName=gpu005 State=RESUME")

    # What an admin reads afterwards
    report = head.run("sigma nodes; sigma incidents; sinfo -R -h").stdout
    for node, rule in ((first, "gpu-xid-79"), (second, "watchdog-hang"), (third, "slurm-node-not-responding")):
        assert node in report and rule in report, report
    assert not head.run("sinfo -R -h").stdout.strip()  # nothing left drained
