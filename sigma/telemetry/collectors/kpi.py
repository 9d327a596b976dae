"""Job KPIs: tail $SIGMA_KPI_DIR/job-<id>/rank-<rank>.<node>.jsonl files written by any trainer.

Line protocol (one JSON object per line): required `ts` (unix float), `job_id` (int), `rank` (int). A metrics line
has `step` and any of loss, grad_norm, step_time_s, tokens_per_s, mfu (other keys go to `payload`); an event line
has `event` (e.g. nan_loss, start, resume, checkpoint, stop) and `message`. Partial last lines wait for their
newline; rotated or truncated files are followed (see tail.py); malformed lines are counted and reported as
events, never fatal. Files of finished jobs are forgotten once idle for `forget_after_s`.

Who may speak for a job: a file is read only once it is admitted, i.e. SLURM runs its job on this node and the file
belongs to the job's user (same uid) and is not world-writable; until the job shows up the file waits unread (no
line is lost), a file of another user is refused and reported once (`kpi_refused`). Every line's job_id must be
the job of its directory. So nobody can make the controller requeue someone else's job with a KPI line.
"""


from __future__ import annotations

import glob
import json
import logging
import math
import os
import time
from dataclasses import dataclass

from sigma.telemetry.base import Collector, CollectorParams, Output, register
from sigma.telemetry.tail import FileTailer

log = logging.getLogger("sigma.telemetry.kpi")

METRIC_KEYS = ("step", "loss", "step_time_s", "tokens_per_s", "mfu", "grad_norm")
ENVELOPE_KEYS = ("ts", "job_id", "rank", "event", "message")


class BadLine(ValueError):
    pass


@register("kpi")
class KpiCollector(Collector):
    @dataclass
    class Params(CollectorParams):
        dir: str = "{kpi_dir}"  # the KPI directory ($SIGMA_KPI_DIR, default /var/spool/sigma/kpi)
        node_name: str = "{node}"  # only files named rank-*.<node_name>.jsonl belong to this node
        forget_after_s: float = 3600.0  # stop tracking a file idle this long (its position is kept)
        max_reports_per_file: int = 10  # malformed-line events per file and run; the rest only counted
        max_future_s: float = 300.0  # a line's ts further ahead of this node's clock than this is malformed

    def __init__(self, section, params, ctx):
        super().__init__(section, params, ctx)
        self.tailers: dict[str, FileTailer] = {}
        self.last_growth: dict[str, float] = {}
        self.malformed_total = 0
        self.admitted: dict[str, int] = {}  # path -> inode admitted (a new file at the path is checked again)
        self.refused: dict[str, tuple] = {}  # path -> the stat that was refused (reported once per change)
        self.pending = 0

    def close(self) -> None:
        for t in self.tailers.values():
            t.close()

    def files(self) -> list[str]:
        return sorted(glob.glob(os.path.join(glob.escape(self.params.dir), "job-*",
                                             f"rank-*.{glob.escape(self.params.node_name)}.jsonl")))

    def collect(self, out: Output) -> None:
        now = time.monotonic()
        malformed_run = 0
        self.pending = 0
        for path in self.files():
            job_id = _job_of(path)
            if not self._admit(out, path, job_id):
                continue
            tailer = self.tailers.get(path)
            if tailer is None:
                tailer = self.tailers[path] = FileTailer(path, self.ctx.positions.get(f"kpi:{path}"))
                self.last_growth[path] = now
            lines = tailer.read_lines()
            if lines:
                self.last_growth[path] = now
            reported = 0
            for raw in lines:
                if not raw.strip():
                    continue
                try:
                    self._line(out, raw, job_id)
                except BadLine as exc:
                    malformed_run += 1
                    if reported < self.params.max_reports_per_file:
                        reported += 1
                        out.event("sidecar", "kpi_malformed", str(exc), "warning",
                                  {"file": path, "offset": tailer.offset, "line": raw[:200].decode("utf-8", "replace")})
            out.position(f"kpi:{path}", tailer.position)
        for path, seen in list(self.last_growth.items()):
            if now - seen > self.params.forget_after_s:
                self.tailers.pop(path).close()
                del self.last_growth[path]
        self.malformed_total += malformed_run
        out.sample("sidecar.kpi.files", len(self.tailers))
        out.sample("sidecar.kpi.malformed_lines_total", self.malformed_total)
        out.sample("sidecar.kpi.refused_files", len(self.refused))
        out.sample("sidecar.kpi.pending_files", self.pending)

    def _admit(self, out: Output, path: str, job_id: int | None) -> bool:
        """Read this file? Only when SLURM runs its job here and the file belongs to the job's user."""
        owner_of = self.ctx.job_owner
        try:
            st = os.stat(path)
        except OSError:
            return False
        if self.admitted.get(path) == st.st_ino:
            return True
        if owner_of is None:  # no SLURM view at all (the collector used outside a sidecar): nothing to check
            self.admitted[path] = st.st_ino
            return True
        uid = owner_of(job_id) if job_id is not None else None
        if uid is None:  # the job does not run here (yet): the file waits unread
            self.pending += 1
            return False
        if st.st_uid != uid:
            reason = f"belongs to uid {st.st_uid}, but job {job_id} runs as uid {uid}"
        elif st.st_mode & 0o002:
            reason = "is writable by every user"
        else:
            self.admitted[path] = st.st_ino
            self.refused.pop(path, None)
            return True
        seen = (st.st_ino, st.st_uid, st.st_mode)
        if self.refused.get(path) != seen:
            self.refused[path] = seen
            log.warning("KPI file %s refused: it %s; its lines are ignored", path, reason)
            out.event("sidecar", "kpi_refused", f"KPI file {path} refused: it {reason}", "warning",
                      {"file": path, "job_id": job_id, "file_uid": st.st_uid, "job_uid": uid}, job_ids=[job_id])
        return False

    def active_jobs(self, within_s: float) -> set[int]:
        """Jobs whose KPI files for this node grew within the last within_s seconds (for job tagging)."""
        now = time.monotonic()
        jobs = set()
        for path, seen in self.last_growth.items():
            if now - seen <= within_s:
                job = os.path.basename(os.path.dirname(path))[4:]
                if job.isdigit():
                    jobs.add(int(job))
        return jobs

    def _line(self, out: Output, raw: bytes, file_job: int | None = None) -> None:
        try:
            d = json.loads(raw)
        except ValueError as exc:
            raise BadLine(f"not JSON: {exc}") from None
        if not isinstance(d, dict):
            raise BadLine("a KPI line must be a JSON object")
        ts, job_id, rank = d.get("ts"), d.get("job_id"), d.get("rank")
        if not _number(ts):
            raise BadLine(f"'ts' must be a unix time number, got {ts!r}")
        if not math.isfinite(ts) or not 0 < ts <= time.time() + self.params.max_future_s:
            raise BadLine(f"'ts' {ts!r} is not a plausible unix time (finite, after 1970, at most "
                          f"{self.params.max_future_s:.0f} s ahead)")
        if type(job_id) is not int or type(rank) is not int:
            raise BadLine(f"'job_id' and 'rank' must be integers, got {job_id!r} and {rank!r}")
        if file_job is not None and job_id != file_job:
            raise BadLine(f"'job_id' {job_id} in a file of job {file_job}")
        if "event" in d:
            event = d["event"]
            if not isinstance(event, str) or not event:
                raise BadLine(f"'event' must be a non-empty string, got {event!r}")
            fields = {k: v for k, v in d.items() if k not in ENVELOPE_KEYS}
            fields["rank"] = rank
            severity = "error" if event in ("nan_loss", "crash", "error") else "info"
            out.event("kpi", event, str(d.get("message", "")), severity, fields, ts=float(ts), job_ids=[job_id])
            return
        if "step" not in d:
            raise BadLine("a line needs 'step' (metrics) or 'event'")
        values = {}
        for key in METRIC_KEYS:
            v = d.get(key)
            if v is not None and not _number(v):
                raise BadLine(f"{key!r} must be a number, got {v!r}")
            values[key] = v
        if values["step"] is not None and not isinstance(values["step"], int):
            raise BadLine(f"'step' must be an integer, got {values['step']!r}")
        for key in ("loss", "grad_norm"):  # NaN/inf losses are data (collapse detection), stored as text payload
            v = values[key]
            if isinstance(v, float) and not math.isfinite(v):
                values[key] = None
                d.setdefault("nonfinite", {})[key] = repr(v)
        payload = {k: v for k, v in d.items() if k not in METRIC_KEYS and k not in ENVELOPE_KEYS}
        out.kpi(float(ts), job_id, rank, values["step"], values["loss"], values["step_time_s"],
                values["tokens_per_s"], values["mfu"], values["grad_norm"], payload)


def _job_of(path: str) -> int | None:
    name = os.path.basename(os.path.dirname(path))
    return int(name[4:]) if name.startswith("job-") and name[4:].isdigit() else None


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
