"""Executors for journaled actions. Each looks at the current state first, so running it twice is harmless.

Only sigma.slurm talks to SLURM; tickets go to an HTTP webhook; playbook commands run with a timeout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from sigma.controller.act.guards import admin_hold
from sigma.controller.act.jit import JitGate
from sigma.controller.act.journal import NotYet, Skip
from sigma.controller.act.noderequests import NodeRequests
from sigma.slurm.client import Slurm

FINISHED_FAIL_STATES = ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
                        "PREEMPTED")
HELD_REASONS = ("launch failed requeued held", "JobHeldAdmin", "job requeued in held state")


class SlurmActions:
    def __init__(self, slurm: Slurm, *, command_timeout_s: float = 600.0, webhook_timeout_s: float = 10.0,
                 adopt_reasons: tuple[str, ...] = (), jit_gate: JitGate | None = None,
                 node_requests: NodeRequests | None = None):
        self.slurm = slurm
        self.jit_gate = jit_gate  # just-in-time checkpoint asked for before a requeue (act/jit.py)
        self.node_requests = node_requests  # what a node's sidecar is asked to do (act/noderequests.py)
        self.adopt_reasons = tuple(adopt_reasons)
        self.command_timeout_s = command_timeout_s
        self.webhook_timeout_s = webhook_timeout_s

    def __call__(self, kind: str, target: str, params: dict, key: str) -> str:
        handler = getattr(self, f"_{kind.replace('-', '_')}", None)
        if handler is None:
            raise Skip(f"unknown action kind {kind!r}")
        return handler(target, params, key)

    # ---------- nodes ----------
    def _drain(self, node: str, params: dict, key: str) -> str:
        n = self.slurm.node(node)
        if (held := admin_hold(n, self.adopt_reasons)) is not None:
            raise Skip(f"taken out by someone else ({n.state}, {held!r}); left as is")
        if n.drained and n.drained_by_sigma:
            return f"already drained: {n.reason}"
        self.slurm.drain([node], params["reason"])
        return f"drained (was: {n.reason})" if n.drained else "drained"

    def _resume(self, node: str, params: dict, key: str) -> str:
        n = self.slurm.node(node)
        if n.reason and not n.drained_by_sigma:
            raise Skip(f"drain reason {n.reason!r} was not set by sigma; never resumed by us")
        if n.available:
            return "already available"
        self.slurm.resume([node])
        return "resumed"

    def _set_down(self, node: str, params: dict, key: str) -> str:
        """A node SLURM reports NOT_RESPONDING, drained by us: set it DOWN once its jobs are requeued, so that SLURM
        ends their steps there now rather than after SlurmdTimeout (the requeued job stays COMPLETING until then).
        Waits for the requeues (a just-in-time checkpoint may still be on its way from the healthy nodes); never
        touches a node that answers again, is being rebooted (our reboots stop slurmd) or that someone else took."""
        n = self.slurm.node(node)
        if (held := admin_hold(n, self.adopt_reasons)) is not None:
            raise Skip(f"taken out by someone else ({n.state}, {held!r}); left as is")
        if n.state == "down":
            return "already DOWN"
        if n.rebooting:
            raise Skip("a reboot is under way; its slurmd is stopped on purpose")
        if "NOT_RESPONDING" not in n.flags:
            raise Skip("slurmd answers again; left drained")
        if not (n.drained and n.drained_by_sigma):
            raise Skip(f"not drained by sigma ({n.state}, {n.reason!r}); never set DOWN")
        waiting = []
        for job_id, before in (params.get("requeued") or {}).items():
            job = self.slurm.job(int(job_id))
            if job is not None and job.state in ("RUNNING", "CONFIGURING") and job.restarts <= before:
                waiting.append(int(job_id))
        if waiting:
            raise NotYet(f"job(s) {waiting} not requeued yet")
        self.slurm.set_down([node], params["reason"])
        return "set DOWN (slurmd not responding): SLURM ends the job steps left on it now, not after SlurmdTimeout"

    def _reboot(self, node: str, params: dict, key: str) -> str:
        n = self.slurm.node(node)
        if (held := admin_hold(n, self.adopt_reasons)) is not None:  # the journal may replay a planned reboot
            raise Skip(f"taken out by someone else ({n.state}, {held!r}); never rebooted by sigma")
        if n.rebooting or n.started_since(params["planned_at"]):
            return "reboot already requested or done"
        self.slurm.reboot([node], next_state="DOWN", reason=params["reason"])
        return "reboot requested (ASAP, nextstate=DOWN)"

    # ---------- jobs ----------
    def _requeue(self, job_id: str, params: dict, key: str) -> str:
        job = self.slurm.job(int(job_id))
        failed = job is not None and job.state == "FAILED" and params.get("restart_failed")
        if job is None or not (job.active or failed):
            raise Skip("job no longer active")
        if job.restarts > params.get("restarts_before", 0) or job.state == "PENDING":
            return f"already requeued (restarts={job.restarts}, state={job.state})"
        if job.state not in ("RUNNING", "CONFIGURING", "SUSPENDED", "STOPPED") and not failed:
            raise NotYet(f"job is {job.state}")
        saved = self.jit_gate.check(params) if self.jit_gate else ""  # NotYet while the checkpoint may come
        self.slurm.requeue(int(job_id))
        return f"requeued; {saved}" if saved else "requeued"

    def _start_now(self, job_id: str, params: dict, key: str) -> str:
        """Clear the requeue BeginTime once the job is pending again and the bad nodes are out."""
        job = self.slurm.job(int(job_id))
        if job is not None and job.state == "FAILED" and params.get("restart_failed"):
            raise NotYet("the requeue of the failed job is not visible yet")  # until expires_at
        if job is None or not job.active:
            raise Skip("job no longer active")
        if job.state in ("RUNNING", "CONFIGURING") and job.restarts > params.get("restarts_before", 0):
            return "already running again"
        if job.state != "PENDING":
            raise NotYet(f"job is {job.state}, not pending yet")
        avoid = params.get("avoid_nodes") or []
        if avoid:
            wanted = set(avoid)  # a node or two of the whole cluster's answer: no map of every node
            available = {n.name for n in self.slurm.nodes() if n.name in wanted and n.available}
            not_out = [a for a in avoid if a in available]
            if not_out:
                raise NotYet(f"{not_out} not drained yet")
        # A requeued failed job still shows its old reason (NonZeroExitCode) and one requeued off a node that went
        # DOWN none, until the scheduler's next pass over it (seconds, or the 30 s backfill): the requeue has set its
        # BeginTime already, and StartTime=now clears it and wakes the scheduler, rather than waiting for that pass.
        if job.reason not in ("BeginTime", "NonZeroExitCode", "None", ""):
            return f"pending for {job.reason}; no BeginTime to clear"
        self.slurm.start_now(int(job_id))
        return "StartTime=now"

    def _cancel(self, job_id: str, params: dict, key: str) -> str:
        job = self.slurm.job(int(job_id))
        if job is None or not job.active:
            raise Skip("job no longer active")
        self.slurm.cancel(int(job_id))
        return "cancelled"

    def _release(self, job_id: str, params: dict, key: str) -> str:
        job = self.slurm.job(int(job_id))
        if job is None or job.state != "PENDING" or not any(h in job.reason for h in HELD_REASONS):
            raise Skip("job not held")
        self.slurm.release(int(job_id))
        return "released"

    # ---------- reservations and validation ----------
    def _create_reservation(self, name: str, params: dict, key: str) -> str:
        if name in self.slurm.reservations():
            return "already exists"
        self.slurm.create_reservation(name, [params["node"]], duration_min=int(params.get("duration_min", 120)))
        return "created"

    def _delete_reservation(self, name: str, params: dict, key: str) -> str:
        if name not in self.slurm.reservations():
            return "already gone"
        self.slurm.delete_reservation(name)
        return "deleted"

    def _submit_validation(self, node: str, params: dict, key: str) -> str:
        """One validation job per attempt, found again by its unique job name after a crash."""
        name = params["job_name"]
        not_before = params.get("not_before", 0)
        for job in self.slurm.jobs():
            if job.name == name and job.submit_time >= not_before:
                return json.dumps({"job_id": job.job_id, "found": True})
        for rec in self.slurm.accounting(since=params.get("since_date")):
            if rec.name == name and rec.submit_time >= not_before:
                return json.dumps({"job_id": rec.job_id, "found": True})
        script = params["script"]
        if not Path(script).is_file():
            raise Skip(f"validation script {script} does not exist")
        args = [f"--reservation={params['reservation']}", "-w", node, "-N1", f"--job-name={name}", "--no-requeue"]
        if params.get("output"):
            args.append(f"--output={params['output']}")
        job_id = self.slurm.submit(script, *args, script_args=params.get("args") or ())
        return json.dumps({"job_id": job_id, "found": False})

    # ---------- playbooks ----------
    def _ask_node(self, node: str, params: dict, key: str) -> str:
        """The node's sidecar does params['request'] (NotYet until it answers or the deadline passes)."""
        if self.node_requests is None:
            raise Skip("no channel to the nodes' sidecars here")
        return self.node_requests.ask(node, params["request"], key, float(params.get("timeout_s", 300)))

    def _command(self, node: str, params: dict, key: str) -> str:
        sigma_bin = shutil.which("sigma") or str(Path(sys.executable).parent / "sigma")
        argv = [a.replace("{node}", node).replace("{sigma}", sigma_bin) for a in params["argv"]]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=self.command_timeout_s,
                              env={**os.environ, "SIGMA_NODE": node, "SIGMA_ACTION_KEY": key},
                              stdin=subprocess.DEVNULL)
        tail = (proc.stdout + proc.stderr).strip()[-400:]
        if proc.returncode != 0:
            return json.dumps({"ok": False, "returncode": proc.returncode, "output": tail})
        return json.dumps({"ok": True, "returncode": 0, "output": tail})

    def _ticket(self, node: str, params: dict, key: str) -> str:
        """POST the evidence; the Idempotency-Key header lets the receiver drop a repeat after a crash."""
        url = params.get("url")
        if not url:
            return "no webhook configured; ticket recorded in the journal only"
        body = json.dumps(params.get("payload", {})).encode()
        req = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", "Idempotency-Key": key})
        try:
            with urllib.request.urlopen(req, timeout=self.webhook_timeout_s) as resp:
                return f"ticket posted: HTTP {resp.status}"
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"webhook answered HTTP {exc.code}") from None

    def _notify(self, target: str, params: dict, key: str) -> str:
        return "logged"
