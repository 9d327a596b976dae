"""sigma.kpi, the public reporter any trainer imports: light, safe without the platform, and speaking the protocol
the real sidecar parses (its KPI collector reads what a Run writes), the control file the real sidecar writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from sigma import kpi
from sigma.chaos.inject import nan_hook_missing
from sigma.telemetry.control import write_checkpoint_requests
from tests.unit.telemetry_helpers import make, run as collect


@pytest.fixture
def job(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SIGMA_KPI_DIR", str(tmp_path / "kpi"))
    monkeypatch.setenv("SLURMD_NODENAME", "node1")
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("SLURM_PROCID", "0")
    kpi._warned.clear()
    return tmp_path


def test_importing_it_pulls_in_nothing_heavy():
    code = ("import sys, sigma.kpi; heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'numpy', 'yaml', 'psutil', 'rich', 'submitit', 'transformers')"
            " or m.startswith(('sigma.train', 'sigma.controller', 'sigma.slurm'))); print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_without_the_platform_it_is_a_no_op_that_says_so_once(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    kpi._warned.clear()
    for _ in range(2):
        r = kpi.Run()
        r.start(0)
        r.step(1, loss=float("nan"))
        r.checkpoint_saved(1, tmp_path / "ckpt.pt")
        assert not r.enabled and r.checkpoint_request() is None and not r.nan_injected()
        r.hold(kpi.Request(1, time.time() + 60))  # returns at once: nothing would requeue
        r.close()
    err = capsys.readouterr().err.splitlines()
    assert err == ["sigma.kpi: not a SLURM job (no SLURM_JOB_ID): the platform does not watch this run; KPI "
                   "reporting is off"]
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.delenv("SIGMA_KPI_DIR", raising=False)
    if not os.path.isdir(kpi.DEFAULT_KPI_DIR):
        assert not kpi.Run().enabled and "no KPI directory" in capsys.readouterr().err


def test_what_a_run_writes_is_what_the_sidecar_reads(job):
    r = kpi.Run(trainer="test loop")
    r.start(0)
    r.add_wait(0.25)
    r.step(1, loss=2.5, grad_norm=0.5, tokens=1000, step_time_s=0.5, lr=0.1)
    r.step(2, loss=float("nan"), tokens=1000, step_time_s=0.5)
    with r.paused("evaluation", max_s=600):
        r.heartbeat()  # an evaluation's work: the run still says it is alive
    r.close()
    assert r.path == job / "kpi" / "job-4242" / "rank-0.node1.jsonl"
    c = make("kpi", {"dir": str(job / "kpi"), "node_name": "node1"}, node="node1")
    out = collect(c)
    assert not [e for e in out.events if e[2] == "kpi_malformed"]
    assert [(k[3], k[4], k[5], k[6], k[8], json.loads(k[9])) for k in out.kpis] == [
        (1, 2.5, 0.5, 2000.0, 0.5, {"wait_s": 0.25, "lr": 0.1}),
        (2, None, 0.5, 2000.0, None, {"nonfinite": {"loss": "nan"}})]  # NaN reaches the kpi-nonfinite rule
    events = {e[2]: json.loads(e[5]) for e in out.events}
    assert events["start"]["jit_poll_every"] == 1 and events["start"]["trainer"] == "test loop"
    assert events["pause"]["max_s"] == 600.0 and "pause_end" in events


class Clock:
    """time as sigma.kpi sees it: sleeping moves it on at once."""

    def __init__(self, now: float):
        self.now, self.slept = now, []

    def time(self) -> float:
        return self.now

    perf_counter = time

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def test_checkpoint_request_answer_manifest_and_resume(job, monkeypatch):
    r = kpi.Run()
    r.start(0)
    assert r.checkpoint_request() is None
    deadline = time.time() + 0.5
    assert write_checkpoint_requests(job / "kpi", "node1", [{"id": 17, "job_id": 4242, "deadline": deadline}]) == []
    write_checkpoint_requests(job / "kpi", "node2", [{"id": 18, "job_id": 4242, "deadline": deadline}])
    req = r.checkpoint_request()
    assert req == kpi.Request(17, deadline)  # this node's file only; the ranks agree on the rest
    ckpt = job / "ckpt" / "step-12.pt"
    ckpt.parent.mkdir()
    ckpt.write_text("weights")
    r.checkpoint_saved(12, ckpt, request=req)
    clock = Clock(1000.0)
    with monkeypatch.context() as m:   # hold waits on a clock of the test's own: what it does, not how long it takes
        m.setattr(kpi, "time", clock)
        r.hold(kpi.Request(17, 1003.0), tick_s=1.0)
        assert clock.slept == [1.0, 1.0, 1.0]  # held, tick by tick, up to the request's deadline and no tick past it
        asked = []
        done = lambda: asked.append(1) or len(asked) > 2  # noqa: E731 - the framework caught SIGTERM at the third look
        r.hold(kpi.Request(19, 1063.0), tick_s=1.0, done=done)
        assert len(asked) == 3 and clock.slept[3:] == [1.0, 1.0]  # left when done said so, not at the deadline
    assert r.checkpoint_request() is None  # answered once
    r.close()
    answer = [json.loads(x) for x in r.path.read_text().splitlines() if '"checkpoint"' in x][-1]
    assert (answer["step"], answer["request"], answer["kind"]) == (12, 17, "jit")
    assert kpi.resume_checkpoint(job / "ckpt") == str(ckpt)
    # the requeued run: resumed from that answer, it does not answer the same request again
    again = kpi.Run()
    again.since = 0.0  # as if the control file were written after it started
    write_checkpoint_requests(job / "kpi", "node1", [{"id": 17, "job_id": 4242, "deadline": time.time() + 60}])
    again.start(12, resumed_from=kpi.resume_checkpoint(job / "ckpt"))
    assert again.checkpoint_request() is None
    resume = [json.loads(x) for x in again.path.read_text().splitlines() if '"resume"' in x][-1]
    assert resume["checkpoint_kind"] == "jit" and resume["step"] == 12
    ckpt.unlink()
    assert kpi.resume_checkpoint(job / "ckpt") is None  # a manifest naming a file gone is no checkpoint


def test_a_control_file_older_than_the_process_is_an_earlier_runs(job):
    write_checkpoint_requests(job / "kpi", "node1", [{"id": 3, "job_id": 4242, "deadline": time.time() + 60}])
    path = job / "kpi" / "job-4242" / "checkpoint-request.node1.json"
    os.utime(path, (time.time() - 3600, time.time() - 3600))
    assert kpi.Run().checkpoint_request() is None


def test_the_nan_hook_only_when_offered_and_chaos_refuses_without_it(job):
    plain = kpi.Run()
    plain.start(0)
    trigger = job / "kpi" / "job-4242" / "inject-nan"
    trigger.write_text("1")
    assert not plain.nan_injected() and trigger.exists()
    assert "wrote no KPI start event" not in nan_hook_missing(trigger.parent, 4242)
    assert "has no NaN fault hook" in nan_hook_missing(trigger.parent, 4242)
    hooked = kpi.Run(rank=1, fault_hooks=True)
    hooked.start(0)
    assert nan_hook_missing(trigger.parent, 4242) == ""
    assert hooked.nan_injected() and not trigger.exists() and not hooked.nan_injected()
    assert "wrote no KPI start event" in nan_hook_missing(job / "kpi" / "job-1", 1)
