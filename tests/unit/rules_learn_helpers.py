"""A controller database with hours of telemetry from four nodes, and faults written into it at their source rows.

Everything goes through the real schema (sigma.controller.db migrations) and the real label table; the learner
reads it exactly as it reads a production database.
"""

from __future__ import annotations

import json
import random

from sigma.controller.db import open_db
from sigma.rules.learn.history import add_label

NODES = ["node1", "node2", "node3", "node4"]
T0 = 1_700_000_000.0
NOISE = ["usb 1-1: reset high-speed USB device number {n} using xhci_hcd",
         "EXT4-fs error (device sda1): ext4_lookup:1611: inode #{n}: comm ls: deleted inode referenced",
         "mce: [Hardware Error]: Machine check events logged",
         "perf: interrupt took too long ({n} > 2500), lowering kernel.perf_event_max_sample_rate"]
NVME = "nvme0: controller fatal status 0x{code:x}, resetting controller (CSTS=0x3)"
EDAC = "EDAC MC0: 1 CE memory read error on CPU_SrcID#0_Ha#0_Chan#{n}_DIMM#0 (channel:{n} page:0x{n:x})"


def kernel(node: str, msg: str) -> str:
    return f"Nov 14 22:13:20 {node} kernel: [ 1234.567890] {msg}"


class FakeHistory:
    """Writes rows as the sidecars would (events with job_ids, samples per node), hours of it."""

    def __init__(self, path, hours: float = 3.0, seed: int = 0):
        self.conn = open_db(path)
        self.rng = random.Random(seed)
        self.end = T0 + hours * 3600
        with self.conn:
            for node in NODES:
                ce = 0.0
                t = T0
                while t < self.end:
                    ce += self.rng.choice([0, 0, 0, 1])
                    self.sample(node, t, "host.cpu.util", 40 + 20 * self.rng.random())
                    self.sample(node, t, "gpu.dram.ce", ce)
                    if self.rng.random() < 0.08:
                        self.event(node, t + 1, self.rng.choice(NOISE).format(n=self.rng.randint(1, 9)))
                    t += 30.0

    def sample(self, node, ts, metric, value, jobs=()):
        self.conn.execute("INSERT INTO samples (node, ts, metric, value, labels, job_ids) VALUES (?,?,?,?,?,?)",
                          (node, ts, metric, value, "{}", json.dumps(list(jobs))))

    def event(self, node, ts, message, kind="kernel_error", jobs=()):
        self.conn.execute("INSERT INTO events (node, ts, source, kind, severity, message, fields, job_ids)"
                          " VALUES (?,?,?,?,?,?,?,?)",
                          (node, ts, "log", kind, "warning", kernel(node, message), "{}", json.dumps(list(jobs))))

    def nvme_fault(self, node: str, ts: float, label: bool = True) -> None:
        with self.conn:
            self.event(node, ts, NVME.format(code=self.rng.choice([3, 7, 19])))
        if label:
            add_label(self.conn, node=node, fault_ts=ts, verdict="fault", cause="nvme controller reset",
                      category="disk")

    def scrub_job(self, ts: float, job: int, node: str) -> None:
        """A job during which one node's memory patrol scrub counts corrected errors: its counter leads its
        peers, with no error message, and nothing is wrong with the node."""
        self.edac_job(ts, job, node, message=False, label=False)

    def edac_job(self, ts: float, job: int, bad: str | None, message: bool = True, label: bool = True) -> None:
        """A job on every node logs the same corrected-error message (user code, all nodes); a bad DIMM also
        makes its node's DRAM error counter climb far above its peers'."""
        level = self.rng.uniform(50, 400)  # how hard this job's code hits memory: the same on every node
        with self.conn:
            for i, node in enumerate(NODES):
                # the job's stretch of the node's counter replaces what the background wrote there
                self.conn.execute("DELETE FROM samples WHERE node = ? AND metric = 'gpu.dram.ce' AND ts BETWEEN ? AND ?",
                                  (node, ts - 400, ts + 400))
                base = self.conn.execute("SELECT MAX(value) FROM samples WHERE node = ? AND metric = 'gpu.dram.ce'"
                                         " AND ts < ?", (node, ts)).fetchone()[0] or 0.0
                rate = level + self.rng.uniform(0, 10) + (150 if node == bad else 0)
                for k in range(6):
                    self.sample(node, ts - 240 + 40 * k, "gpu.dram.ce", base + rate * k / 5, jobs=[job])
                self.conn.execute("UPDATE samples SET value = value + ? WHERE node = ? AND metric = 'gpu.dram.ce'"
                                  " AND ts > ?", (rate, node, ts + 400))  # a counter never goes back
                self.event(node, ts - 5 - i, EDAC.format(n=i) if message else "usb 1-1: new device", jobs=[job])
        if bad and label:
            add_label(self.conn, node=bad, fault_ts=ts, verdict="fault", cause="dimm fault", category="memory")
