"""Per-rank KPI JSON lines, the protocol the node sidecar tails (see docs/train.md, "KPI protocol").

Each rank appends to `$SIGMA_KPI_DIR/job-<SLURM_JOB_ID>/rank-<RANK>.<NODE>.jsonl`. Every line has `ts` (unix
float), `job_id` (int) and `rank` (int); a metrics line adds `step` and any of `loss`, `grad_norm`,
`step_time_s`, `tokens_per_s`, `mfu` (other keys become payload); an event line adds `event` and `message`.
A requeued job keeps its job id, so the resumed run appends to the same files.
"""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import time
from pathlib import Path

DEFAULT_KPI_DIR = "/var/spool/sigma/kpi"
REQUIRED_FIELDS = ("ts", "job_id", "rank")
METRIC_FIELDS = ("loss", "grad_norm", "step_time_s", "tokens_per_s", "mfu")


def job_id_from_env(env=None) -> int:
    """SLURM's job id; under submitit's local executor its job id; 0 for a bare process."""
    env = os.environ if env is None else env
    for key in ("SLURM_ARRAY_JOB_ID", "SLURM_JOB_ID", "SUBMITIT_LOCAL_JOB_ID", "SIGMA_JOB_ID"):
        value = env.get(key, "")
        if value.isdigit():
            return int(value)
    return 0


def node_name(env=None) -> str:
    env = os.environ if env is None else env
    return env.get("SLURMD_NODENAME") or socket.gethostname()


def kpi_path(kpi_dir: str | Path, job_id: int, rank: int, node: str) -> Path:
    return Path(kpi_dir) / f"job-{job_id}" / f"rank-{rank}.{node}.jsonl"


def _clean(value):
    """JSON has no NaN/Inf: write them as strings so every line stays valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


class KpiWriter:
    def __init__(self, rank: int, kpi_dir: str | Path | None = None, job_id: int | None = None,
                 node: str | None = None):
        self.rank = rank
        self.job_id = job_id_from_env() if job_id is None else job_id
        self.node = node or node_name()
        explicit = kpi_dir or os.environ.get("SIGMA_KPI_DIR")
        self.path = kpi_path(explicit or DEFAULT_KPI_DIR, self.job_id, rank, self.node)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except PermissionError:
            if explicit:
                raise
            # No sidecar spool on this machine (e.g. a laptop): keep the KPIs where the user can read them.
            self.path = kpi_path(Path.home() / ".local" / "state" / "sigma" / "kpi", self.job_id, rank, self.node)
            self.path.parent.mkdir(parents=True, exist_ok=True)
        # Line-buffered append: a line is on disk (page cache) as soon as it is written, whole.
        self._file = open(self.path, "a", buffering=1, encoding="utf-8")
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def _write(self, record: dict) -> dict:
        line = {"ts": time.time(), "job_id": self.job_id, "rank": self.rank, **record}
        with self._lock:
            if not self._file.closed:
                self._file.write(json.dumps(_clean(line), separators=(",", ":")) + "\n")
        return line

    def start_heartbeat(self, interval_s: float) -> None:
        """A `heartbeat` event every interval_s from a thread: it goes on while the training loop waits in a
        collective for a stuck peer, and stops when this process is stopped, so a hung rank is the silent one."""
        if interval_s <= 0:
            return

        def beat():
            while not self._stop.wait(interval_s):
                self.event("heartbeat", "alive")

        threading.Thread(target=beat, name="kpi-heartbeat", daemon=True).start()

    def metrics(self, step: int, **values) -> dict:
        return self._write({"step": int(step), **values})

    def event(self, event: str, message: str, **fields) -> dict:
        return self._write({"event": event, "message": message, **fields})

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            self._close()

    def _close(self) -> None:
        if not self._file.closed:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()


def read_kpis(path: str | Path) -> list[dict]:
    """All lines of one KPI file (for tests and tools); a torn last line from a killed writer is skipped."""
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def throughput_stability(values) -> dict | None:
    """Throughput stability of one run (the Sigma paper's Table 11): from per-step throughputs, the worst and the
    average step against the best one (min/peak, mean/peak), the standard deviation, and the coefficient of
    variation (std/mean, comparable across models). Non-positive values are ignored; None with fewer than 2."""
    xs = [float(v) for v in values if v is not None and math.isfinite(v) and v > 0]
    if len(xs) < 2:
        return None
    peak, mean = max(xs), sum(xs) / len(xs)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
    return {"steps": len(xs), "peak": peak, "min": min(xs), "mean": mean, "std": std,
            "min_over_peak": min(xs) / peak, "mean_over_peak": mean / peak, "cv": std / mean}
