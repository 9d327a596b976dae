"""Trainers that are not ours, through the real pipeline: a Hugging Face Trainer (transformers from the registry), a
PyTorch Lightning Trainer (lightning from the registry) and a plain PyTorch loop, each a 2-node job submitted with
their sbatch scripts, real sidecars pushing to `sigma controller run`, faults injected at their source.

- HF Trainer: an Xid 79 in one node's kernel log drains it; the controller asks the other node for a just-in-time
  checkpoint, the Trainer saves it through its own checkpointing, the job is requeued and resumes from it with at
  most one step lost. Then, on the resumed run, `sigma chaos nan`: the NaN is caught (its update is not applied,
  the Trainer saves the model before it), the job is requeued and resumes from that checkpoint.
- Lightning: the same Xid; the controller's request is answered through `trainer.save_checkpoint`, and the requeued
  run resumes from it with `fit(ckpt_path=...)`, at most one step lost.
- plain loop: one node's ranks are held off the CPU 70 % of each second (`sigma chaos straggler`): the controller
  names that node from the ranks' own all-reduce waits and the job moves; then one node's ranks of the moved run are
  stopped (`sigma chaos hang`): the watchdog's hang names that node (its heartbeats fell silent while the other
  node's beat on), drains it, and the job is requeued and resumes from its newest checkpoint.
- no integration at all: a job writing no KPI line, stopped on one node, is requeued from what the node sees of its
  processes; a job sleeping all along (never busy) is left alone.
"""

import json
import sys
import time
from pathlib import Path

import pytest

from sigma.chaos.inject import Chaos
from sigma.controller.detect.laggard import STEADY_S
from sigma.kpi import read_kpis
from tests.conftest import wait_for
from tests.integration.pipeline import Pipeline

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def submit(slurm, cluster, script: str, out: Path, *args: str) -> int:
    env = f"ALL,SIGMA_KPI_DIR={cluster.env['SIGMA_KPI_DIR']},SIGMA_PYTHON={sys.executable},SIGMA_SBATCH_DIR={REPO / 'sbatch'}"
    return slurm.submit(REPO / "sbatch" / script, "-N2", "--ntasks-per-node=1", f"--output={out}/job-%j.out",
                        f"--export={env}", script_args=[str(out / "run"), *args])


def records(cluster, job_id: int, rank: int = 0) -> list[dict]:
    """Rank `rank`'s lines, on whichever node each run put it, oldest first."""
    job_dir = Path(cluster.env["SIGMA_KPI_DIR"]) / f"job-{job_id}"
    return sorted((r for p in job_dir.glob(f"rank-{rank}.*.jsonl") for r in read_kpis(p)), key=lambda r: r["ts"])


def last_step(cluster, job_id: int) -> int:
    return max((r["step"] for r in records(cluster, job_id) if "event" not in r), default=0)


def events(cluster, job_id: int, kind: str) -> list[dict]:
    return [r for r in records(cluster, job_id) if r.get("event") == kind]


def wait_resumed(cluster, job_id: int, count: int, timeout: float = 300) -> dict:
    return wait_for(lambda: len(events(cluster, job_id, "resume")) >= count
                    and events(cluster, job_id, "resume")[count - 1], timeout=timeout, interval=1.0,
                    what=f"resume #{count} of job {job_id}")


def steps_lost(cluster, job_id: int, resume: dict) -> int:
    before = max(r["step"] for r in records(cluster, job_id) if "event" not in r and r["ts"] < resume["ts"])
    return before - resume["step"]


def xid_is_answered_through_the_trainers_own_checkpoint(p, slurm, cluster, job_id: int, saved_as) -> dict:
    """An Xid 79 in the kernel log of one of the job's nodes, past step 10: the controller asks the other node for a
    checkpoint, the trainer saves it through its own framework (at saved_as(step)), the job is requeued and resumes
    from it with at most one step lost. Returns the resume event."""
    wait_for(lambda: last_step(cluster, job_id) >= 10, timeout=300, interval=1.0, what="step 10")
    victim = slurm.job(job_id).nodes[-1]
    p.inject_xid79(victim)
    resume = wait_resumed(cluster, job_id, 1)
    (req,) = p.query("SELECT node, ack_step FROM checkpoint_requests WHERE job_id = ?", (job_id,))
    assert req["node"] != victim and req["ack_step"] >= 10
    answer = next(r for r in events(cluster, job_id, "checkpoint") if r.get("kind") == "jit")
    assert answer["path"] == str(saved_as(req["ack_step"])) == resume["checkpoint"]
    assert resume["step"] == req["ack_step"] and resume["checkpoint_kind"] == "jit"
    assert steps_lost(cluster, job_id, resume) <= 1
    (lost,) = wait_for(lambda: p.query("SELECT * FROM job_losses WHERE job_id = ?", (job_id,)), timeout=120,
                       what="steps lost recorded")
    assert lost["steps_lost"] <= 1 and lost["source"] == "jit"
    assert victim not in slurm.job(job_id).nodes
    return resume


def test_hf_trainer_xid_answers_through_its_own_checkpoint_and_nan_is_caught(slurm, cluster, tmp_path):
    with Pipeline(cluster, tmp_path / "pipeline") as p:
        job_id = submit(slurm, cluster, "hf-trainer.sbatch", tmp_path, "--steps", "100000", "--save-steps", "1000",
                        "--step-delay", "0.1", "--fault-hooks")
        resume = xid_is_answered_through_the_trainers_own_checkpoint(  # the Trainer's own save
            p, slurm, cluster, job_id, lambda step: tmp_path / "run" / f"checkpoint-{step}")

        wait_for(lambda: last_step(cluster, job_id) >= resume["step"] + 5, timeout=240, interval=1.0,
                 what="steps after the resume")
        Chaos(cluster).inject("nan", slurm.job(job_id).nodes[0], job_id=job_id)
        again = wait_resumed(cluster, job_id, 2)
        (nan,) = events(cluster, job_id, "nan_loss")
        rollback = next(r for r in events(cluster, job_id, "checkpoint") if r.get("kind") == "rollback")
        assert again["step"] == rollback["step"] == nan["step"] and again["checkpoint_kind"] == "rollback"
        assert p.query("SELECT 1 FROM incidents WHERE job_id = ? AND rule_id = 'kpi-nan-loss-event'", (job_id,))
        watch = json.loads(_sigma_jobs(p, job_id))[0]
        assert watch["watched"] and watch["answers_requests"] and watch["fault_hooks"] == ["nan"]
        assert {r["rank"] for r in watch["ranks"]} == {0, 1} and not watch["refused"]
        slurm.cancel(job_id)


def test_lightning_xid_answers_through_trainer_save_checkpoint_and_resumes_from_it(slurm, cluster, tmp_path):
    with Pipeline(cluster, tmp_path / "pipeline") as p:
        job_id = submit(slurm, cluster, "lightning.sbatch", tmp_path, "--steps", "100000", "--save-every", "1000",
                        "--step-delay", "0.1")
        resume = xid_is_answered_through_the_trainers_own_checkpoint(  # trainer.save_checkpoint
            p, slurm, cluster, job_id, lambda step: tmp_path / "run" / f"sigma-step={step}.ckpt")
        wait_for(lambda: last_step(cluster, job_id) >= resume["step"] + 3, timeout=240, interval=1.0,
                 what="steps after the resume")
        slurm.cancel(job_id)


def test_plain_loop_straggler_is_named_and_a_hang_resumes_from_the_newest_checkpoint(slurm, cluster, tmp_path):
    with Pipeline(cluster, tmp_path / "pipeline", controller={"watchdog": {"hang_timeout_s": 20}}) as p:
        job_id = submit(slurm, cluster, "plain-torch.sbatch", tmp_path, "--steps", "100000", "--save-every", "10",
                        "--step-delay", "0.05")
        wait_for(lambda: last_step(cluster, job_id) >= 20, timeout=240, interval=1.0, what="step 20")
        victim = slurm.job(job_id).nodes[-1]
        chaos = Chaos(cluster)
        first = min(r["ts"] for r in records(cluster, job_id) if "event" not in r)
        wait_for(lambda: time.time() - first >= STEADY_S, timeout=STEADY_S + 5, interval=1.0,
                 what="a steady run (the straggler rule judges none younger)")
        slow = chaos.inject("straggler", victim, job_id=job_id, percent=70)
        try:
            named = wait_for(lambda: p.query("SELECT node, rule_id, evidence FROM incidents WHERE job_id = ? AND"
                                             " node IS NOT NULL", (job_id,)), timeout=240, interval=2.0,
                             what="the straggler named")
        finally:
            chaos.undo(slow.id)
        assert named[0]["node"] == victim, named
        moved = wait_resumed(cluster, job_id, 1)
        wait_for(lambda: last_step(cluster, job_id) >= moved["step"] + 15, timeout=240, interval=1.0,
                 what="steps after the move")
        hung = slurm.job(job_id).nodes[-1]
        hang = chaos.inject("hang", hung, job_id=job_id)
        try:
            resume = wait_resumed(cluster, job_id, 2, timeout=400)
        finally:
            chaos.undo(hang.id)
        assert resume["ts"] > hang.ts
        saved = [r["step"] for r in events(cluster, job_id, "checkpoint") if r["ts"] < resume["ts"]]
        assert resume["step"] == max(saved) and resume["checkpoint"].endswith(f"step-{resume['step']}.pt")
        # the hang is the watchdog's, and its culprit is the node whose ranks fell silent while the other's beat on
        (inc,) = p.query("SELECT id, node, source FROM incidents WHERE job_id = ? AND rule_id = 'watchdog-hang'",
                         (job_id,))
        assert inc["node"] == hung and inc["source"] == "isolation", inc
        assert p.query("SELECT 1 FROM actions WHERE incident_id = ? AND kind = 'drain' AND target = ?",
                       (inc["id"], hung))
        assert hung not in slurm.job(job_id).nodes
        slurm.cancel(job_id)


WORK = """import time
while True:  # a job of its own: computes a little, writes no KPI line
    sum(range(300000))
    time.sleep(0.05)
"""


def test_a_job_without_kpis_stopped_on_one_node_is_requeued_and_an_idle_one_is_left_alone(slurm, cluster, tmp_path):
    script = tmp_path / "work.py"
    script.write_text(WORK)
    with Pipeline(cluster, tmp_path / "pipeline", controller={"watchdog": {"hang_timeout_s": 20}}) as p:
        work = slurm.submit(None, "-N2", "--requeue", f"--output={tmp_path}/work-%j.out",
                            wrap=f"srun {sys.executable} {script}")
        idle = slurm.submit(None, "-N1", "--requeue", f"--output={tmp_path}/idle-%j.out", wrap="srun sleep 600")
        busy = "SELECT DISTINCT node FROM samples WHERE metric = 'job.procs.cpu' AND labels = ? AND value > 0.02"
        wait_for(lambda: len(p.query(busy, (f'{{"job":"{work}"}}',))) == 2, timeout=180, interval=2.0,
                 what="both nodes see the job's processes busy")
        hung = slurm.job(work).nodes[-1]
        stop = Chaos(cluster).inject("hang", hung, job_id=work)
        try:
            (inc,) = wait_for(lambda: p.query("SELECT id, summary, scope FROM incidents WHERE job_id = ? AND"
                                              " rule_id = 'watchdog-proc-hang'", (work,)), timeout=180,
                              interval=2.0, what="the hang seen from the node")
            wait_for(lambda: (j := slurm.job(work)) and j.restarts >= 1 and j.state == "RUNNING", timeout=240,
                     interval=2.0, what="the job requeued and running again")
        finally:
            Chaos(cluster).undo(stop.id)
        assert hung in inc["summary"] and "SIGSTOP" in inc["summary"] and inc["scope"] == "job"
        kinds = {r["kind"] for r in p.query("SELECT kind FROM actions WHERE incident_id = ?", (inc["id"],))}
        assert "requeue" in kinds and "drain" not in kinds  # a stopped process says nothing against its node
        # the sleeping job ran all along with no CPU progress, never busy: no hang
        assert slurm.job(idle).state == "RUNNING" and slurm.job(idle).restarts == 0
        assert not p.query("SELECT 1 FROM incidents WHERE job_id = ?", (idle,))
        slurm.cancel(work)
        slurm.cancel(idle)


def _sigma_jobs(p: Pipeline, job_id: int) -> str:
    import subprocess

    return subprocess.run([sys.executable, "-m", "sigma.cli", "jobs", "--job", str(job_id), "--json", "--config",
                           str(p.config)], env=p.env, capture_output=True, text=True, check=True).stdout
