"""The README's first-hour commands, run as a user would after a fault, on the real local cluster.

The platform comes up with `sigma stack up`, an Xid 79 is written into an idle node's kernel log with
`sigma chaos log` and handled end to end; then the block of commands under the README's `first-hour` marker runs
in one shell, from a scratch directory holding only a link to configs/, with this cluster as the checkout's own
(`SIGMA_CLUSTER_DIR`) and no other setting: no `--config`, no `--db`. Each command must succeed and print what
the README says it shows.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, wait_for

pytestmark = pytest.mark.integration

# What each README command must print (a command is known by its first words).
EXPECTED = {
    "sigma nodes": ["resumed", "gpu-xid-79"],
    "sigma incidents": ["gpu-xid-79", "node3"],
    "sigma explain": ["drain reason", "sigma: gpu-xid-79", "node lifecycle", "resumed"],
    "sigma report --html": ["wrote report.html"],
    "sigma report": ["utilisation", "automation ratio", "node recycling"],
    "sigma chaos list": ["handled (incident"],
    "eval": [],
    "sinfo -R": ["REASON"],
    "sigma train --config configs/train/debug.yaml --nodes 2": ["submitted new run debug as slurm job",
                                                                "run debug finished at step 20"],
    "sigma train --config configs/train/debug.yaml --resume debug": ["submitted resumed run debug",
                                                                     "run debug finished at step 40"],
    "squeue": ["JOBID"],
}


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = re.search(r"<!-- first-hour:[^\n]*-->\n```\n(.*?)```", text, re.S)
    assert block, "README.md has no first-hour block"
    commands = [line.split("  #")[0].strip() for line in block.group(1).splitlines()]
    return [c for c in commands if c and not c.startswith("#")]  # comment-only lines continue a comment


def expected_for(command: str) -> list[str]:
    key = max((k for k in EXPECTED if command.startswith(k)), key=len, default=None)
    assert key is not None, f"README command {command!r} has no expected output in this test"
    return EXPECTED[key]


def test_readme_first_hour_commands_work_as_written(slurm, cluster, tmp_path):
    bin_dir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items()
           if k not in ("SLURM_CONF", "SIGMA_CONTROLLER_CONFIG", "SIGMA_KPI_DIR", "COLUMNS")}
    env.update(SIGMA_CLUSTER_DIR=str(cluster.state_dir), PATH=f"{bin_dir}:{env.get('PATH', '')}")

    def sigma(*args, check=True):
        return subprocess.run([str(bin_dir / "sigma"), *args], env=env, cwd=tmp_path, capture_output=True,
                              text=True, check=check, timeout=300)

    (tmp_path / "configs").symlink_to(REPO / "configs")
    sigma("stack", "up")
    try:
        # the fault the demo injects, on an idle node, handled by the platform on its own
        injected = json.loads(sigma("chaos", "log", "--xid", "79", "--node", "node3", "--json").stdout)

        def incident():
            found = json.loads(sigma("incidents", "--node", "node3", "--json").stdout)
            return next((i for i in found if i["rule_id"] == "gpu-xid-79" and i["opened_at"] >= injected["ts"] - 1
                         and i["status"] == "resolved"), None)

        inc = wait_for(incident, timeout=180, interval=2, what="the Xid on node3 handled and node3 back in service")

        commands = readme_commands()
        script = []
        for k, command in enumerate(commands):
            # `sigma explain 1` in the README is the demo's first incident; here, the one just handled
            command = re.sub(r"^sigma explain \d+", f"sigma explain {inc['id']}", command)
            script += [f"echo '@@@ {k}'", command, f"echo \"@@@ rc=$?\""]
        run = subprocess.run(["bash", "-c", "\n".join(script)], env=env, cwd=tmp_path, capture_output=True,
                             text=True, timeout=900)
        outputs = re.split(r"^@@@ \d+\n", run.stdout, flags=re.M)[1:]
        assert len(outputs) == len(commands), run.stdout[-3000:] + run.stderr[-3000:]
        for command, out in zip(commands, outputs):
            rc = re.search(r"^@@@ rc=(\d+)$", out, re.M)
            assert rc and rc.group(1) == "0", f"`{command}` failed:\n{out}\n{run.stderr[-3000:]}"
            assert "Traceback" not in out, f"`{command}`:\n{out}"
            for expected in expected_for(command):
                assert expected in out, f"`{command}` did not print {expected!r}:\n{out}"
        page = (tmp_path / "report.html").read_text()
        assert page.count("<img alt=") == 4 and "gpu-xid-79" in page

        # the bad input of the README's table: one line saying what to do, exit 2, nothing created or submitted
        train = ["train", "--config", "configs/train/debug.yaml"]
        down_conf = tmp_path / "down" / "etc" / "slurm.conf"  # this cluster's config, slurmctld on a dead port
        down_conf.parent.mkdir(parents=True)
        down_conf.write_text(re.sub(r"(?m)^SlurmctldPort=\d+", "SlurmctldPort=9", cluster.conf.read_text()))
        jobs_before = {j.job_id for j in slurm.jobs()}  # finished jobs may age out of SLURM's list meanwhile
        for args, extra_env, expected in [
            ((*train, "--nodes", "8"), {}, "--nodes 8 can never run: partition debug has 4 node(s)"),
            ((*train, "steps=abc"), {}, "command line `steps=abc`: expected int"),
            ((*train, "--resume", "debug", "steps=40"), {}, "run 'debug' is finished: it reached step 40 of steps=40"),
            ((*train,), {"SLURM_CONF": str(down_conf)}, "SLURM does not answer"),
            (("health", "run", "--node", "node9"), {}, "unknown node 'node9' on the local cluster"),
            (("incidents", "--node", "node9"), {}, "no node 'node9' known to the controller"),
            (("explain", "99999"), {}, "no incident 99999"),
        ]:
            bad = subprocess.run([str(bin_dir / "sigma"), *args], env={**env, **extra_env}, cwd=tmp_path,
                                 capture_output=True, text=True, timeout=120)
            assert bad.returncode == 2 and bad.stderr.startswith("sigma: error: ") and expected in bad.stderr, \
                (args, bad.returncode, bad.stderr)
            assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
        assert not (cluster.state_dir / "nodes" / "node9").exists() and not {j.job_id for j in slurm.jobs()} - jobs_before
    finally:
        sigma("stack", "down", check=False)
