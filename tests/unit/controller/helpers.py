"""Build a controller over a fresh database, a FakeSlurm and a hand-driven clock."""

from __future__ import annotations

import json

from sigma.controller.config import BreakerConfig, ControllerConfig, Playbook, RemediationConfig, ValidationConfig
from sigma.controller.db import open_db
from sigma.controller.act.decisionlog import DecisionLog
from sigma.controller.loop import Controller
from sigma.paths import configs_dir
from sigma.rules.loader import load_rules

from tests.unit.controller.fakes import FakeSlurm


class Clock:
    def __init__(self, t=1_000_000.0):
        self.t = t

    def __call__(self):
        return self.t

    def advance(self, s):
        self.t += s


def make_controller(tmp_path, *, slurm=None, clock=None, rules=None, cfg=None, remediation=None, conn=None):
    clock = clock or Clock()
    slurm = slurm or FakeSlurm()
    script = tmp_path / "validate.sbatch"
    script.write_text("#!/bin/sh\nexit 0\n")
    cfg = cfg or ControllerConfig(db=str(tmp_path / "c.db"), log_dir=str(tmp_path / "log"),
                                  breaker=BreakerConfig(max_nodes=2, max_fraction=0.5))
    remediation = remediation or RemediationConfig(
        max_failures=2, ack_kernel_log=False, validation=ValidationConfig(script=str(script), timeout_s=600),
        playbooks=[Playbook(name="reboot", kind="reboot", categories=["gpu-reset", "hang"], timeout_s=300),
                   Playbook(name="manual", kind="manual")])
    ctl = Controller(cfg, conn=conn or open_db(cfg.db), slurm=slurm,
                     rules=rules if rules is not None else load_rules(configs_dir() / "rules"),
                     remediation=remediation, log=DecisionLog(cfg.log_dir), clock=clock, root=tmp_path)
    return ctl, slurm, clock


def add_event(conn, node, ts, *, source="log", kind="xid", message="", fields=None, severity="info", job_ids=()):
    with conn:
        conn.execute("INSERT INTO events (node, ts, source, kind, severity, message, fields, job_ids) VALUES"
                     " (?,?,?,?,?,?,?,?)", (node, ts, source, kind, severity, message, json.dumps(fields or {}),
                                            json.dumps(list(job_ids))))


def add_kpi(conn, node, ts, job_id, rank, step, tokens_per_s=1000.0, step_time_s=1.0, loss=2.0, payload=None):
    with conn:
        conn.execute("INSERT INTO kpis (node, ts, job_id, rank, step, loss, step_time_s, tokens_per_s, payload) VALUES"
                     " (?,?,?,?,?,?,?,?,?)", (node, ts, job_id, rank, step, loss, step_time_s, tokens_per_s,
                                              json.dumps(payload or {})))


def xid79(conn, node, ts):
    add_event(conn, node, ts, kind="xid", fields={"xid": 79},
              message="NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.")
