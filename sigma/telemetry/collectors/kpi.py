"""Job KPIs: tail $SIGMA_KPI_DIR/job-<id>/rank-<rank>.<node>.jsonl files written by any trainer.

Line protocol (one JSON object per line): required `ts` (unix float), `job_id` (int), `rank` (int). A metrics line
has `step` and any of loss, grad_norm, step_time_s, tokens_per_s, mfu (other keys go to `payload`); an event line
has `event` (e.g. nan_loss, start, resume, checkpoint, stop) and `message`. Partial last lines wait for their
newline; rotated or truncated files are followed (see tail.py); malformed lines are counted and reported as
events, never fatal. Files of finished jobs are forgotten once idle for `forget_after_s`.

Who may speak for a job: a file is read only once it is admitted, i.e. SLURM runs its job on this node and the file
belongs to the job's user (same uid), is a regular file and is not world-writable. Until the job shows up the
file waits unread (no line is lost); a file of another user is refused and reported once (`kpi_refused`). Every
line's job_id must be the job of its directory. So nobody can make the controller requeue someone else's job.
"""


from __future__ import annotations

import glob
import json
import logging
import math
import os
import re
import stat
import time
from dataclasses import dataclass

from sigma.telemetry.base import Collector, CollectorParams, Output, register
from sigma.telemetry.joboutput import tell_job
from sigma.telemetry.tail import FileTailer

log = logging.getLogger("sigma.telemetry.kpi")

METRIC_KEYS = ("step", "loss", "step_time_s", "tokens_per_s", "mfu", "grad_norm")
ENVELOPE_KEYS = ("ts", "job_id", "rank", "event", "message")


class BadLine(ValueError):
    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason  # a short code `sigma jobs` counts by: not-json, ts-units, ts, ids, job, fields


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
        self.misnamed: set[str] = set()  # files in a job directory whose name no sidecar reads (reported once)
        self.order: dict[str, dict] = {}  # path -> {"ranks", "step", "reported"}: what the file said so far
        self.told: set[int] = set()  # jobs whose output got the one warning line

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
                    self._line(out, raw, job_id, path)
                except BadLine as exc:
                    malformed_run += 1
                    if reported < self.params.max_reports_per_file:
                        reported += 1
                        out.event("sidecar", "kpi_malformed", f"{os.path.basename(path)}: {exc}", "warning",
                                  {"file": path, "offset": tailer.offset, "reason": exc.reason,
                                   "line": raw[:200].decode("utf-8", "replace")},
                                  job_ids=[job_id] if job_id is not None else None)
                        self._tell(job_id, f"KPI lines of this job are refused ({exc}); see `sigma jobs --job "
                                           f"{job_id}`")
            out.position(f"kpi:{path}", tailer.position)
        self._misnamed(out)
        for path, seen in list(self.last_growth.items()):
            if now - seen > self.params.forget_after_s:
                self.tailers.pop(path).close()
                del self.last_growth[path]
                self.order.pop(path, None)
        self.malformed_total += malformed_run
        out.sample("sidecar.kpi.files", len(self.tailers))
        out.sample("sidecar.kpi.malformed_lines_total", self.malformed_total)
        out.sample("sidecar.kpi.refused_files", len(self.refused))
        out.sample("sidecar.kpi.pending_files", self.pending)

    def _misnamed(self, out: Output) -> None:
        """A .jsonl file in a job directory that no sidecar reads (`rank-0.jsonl`, `metrics.jsonl`): said once,
        for jobs that run here, with the name it should have."""
        pattern = os.path.join(glob.escape(self.params.dir), "job-*", "*.jsonl")
        for path in glob.glob(pattern):
            if path in self.misnamed or _RANK_FILE.fullmatch(os.path.basename(path)):
                continue
            job_id = _job_of(path)
            if job_id is None or (self.ctx.job_owner is not None and self.ctx.job_owner(job_id) is None):
                continue
            self.misnamed.add(path)
            message = (f"KPI file {path} is not read: a rank's file must be named rank-<RANK>.<NODE>.jsonl, here "
                       f"rank-<RANK>.{self.params.node_name}.jsonl")
            log.warning("%s", message)
            out.event("sidecar", "kpi_misnamed", message, "warning", {"file": path, "reason": "file-name"},
                      job_ids=[job_id])
            self._tell(job_id, message)

    def _check_order(self, out: Output, path: str, job_id: int, d: dict) -> None:
        """Several ranks in one file, or steps going back without a (re)start between: kept, said once a file."""
        seen = self.order.setdefault(path, {"ranks": set(), "step": None, "reported": set()})
        seen["ranks"].add(d["rank"])
        if d.get("event") in ("start", "resume"):
            seen["step"] = None
        problem = None
        if len(seen["ranks"]) > 1 and "ranks" not in seen["reported"]:
            problem = ("ranks", f"{os.path.basename(path)} carries lines of ranks {sorted(seen['ranks'])}: write one "
                                f"file per rank (rank-<RANK>.<NODE>.jsonl); the lines are kept, but a silent rank "
                                f"cannot be told apart from the others")
        step = d.get("step") if "event" not in d else None
        if isinstance(step, int):
            if seen["step"] is not None and step < seen["step"] and "order" not in seen["reported"]:
                problem = ("order", f"{os.path.basename(path)}: step {step} after step {seen['step']} with no start or "
                                    f"resume event between (two runs writing one file, or lines out of order); kept")
            seen["step"] = step if seen["step"] is None else max(seen["step"], step)
        if problem:
            seen["reported"].add(problem[0])
            out.event("sidecar", "kpi_ranks_mixed" if problem[0] == "ranks" else "kpi_out_of_order", problem[1],
                      "warning", {"file": path, "reason": problem[0]}, job_ids=[job_id])

    def _tell(self, job_id: int | None, message: str) -> None:
        """One warning line in the job's own output, the first time its KPIs are refused on this node."""
        if job_id is None or job_id in self.told or self.ctx.job_owner is None:
            return
        self.told.add(job_id)
        tell_job(job_id, self.params.node_name, f"sigma sidecar on {self.params.node_name}: {message}")

    def _admit(self, out: Output, path: str, job_id: int | None) -> bool:
        """Read this file? Only when SLURM runs its job here and the file belongs to the job's user."""
        owner_of = self.ctx.job_owner
        try:
            st = os.lstat(path)  # a symlink's target could be any file of the job's user (or root's)
        except OSError:
            return False
        if self.admitted.get(path) == st.st_ino and stat.S_ISREG(st.st_mode):
            return True
        if owner_of is None:  # no SLURM view at all (the collector used outside a sidecar): nothing to check
            self.admitted[path] = st.st_ino
            return True
        uid = owner_of(job_id) if job_id is not None else None
        if uid is None:  # the job does not run here (yet): the file waits unread
            self.pending += 1
            return False
        if not stat.S_ISREG(st.st_mode):
            reason = "is not a regular file (a symlink?)"
        elif st.st_uid != uid:
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
                      {"file": path, "job_id": job_id, "file_uid": st.st_uid, "job_uid": uid, "reason": "owner"},
                      job_ids=[job_id])
            self._tell(job_id, f"KPI file {path} refused: it {reason}")
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

    def _line(self, out: Output, raw: bytes, file_job: int | None = None, path: str | None = None) -> None:
        try:
            d = json.loads(raw)
        except ValueError as exc:
            raise BadLine(f"not JSON: {exc}", "not-json") from None
        if not isinstance(d, dict):
            raise BadLine("a KPI line must be a JSON object", "not-json")
        ts, job_id, rank = d.get("ts"), d.get("job_id"), d.get("rank")
        if not _number(ts):
            raise BadLine(f"'ts' must be a unix time number, got {ts!r}", "ts")
        now = time.time()
        if math.isfinite(ts) and now * 100 < ts < now * 1e7:
            raise BadLine(f"'ts' {ts!r} looks like {'milli' if ts < now * 1e4 else 'micro'}seconds: write unix "
                          f"seconds (time.time(), e.g. {now:.1f})", "ts-units")
        if not math.isfinite(ts) or not 0 < ts <= now + self.params.max_future_s:
            raise BadLine(f"'ts' {ts!r} is not a plausible unix time (finite, after 1970, at most "
                          f"{self.params.max_future_s:.0f} s ahead)", "ts")
        if type(job_id) is not int or type(rank) is not int:
            raise BadLine(f"'job_id' and 'rank' must be integers, got {job_id!r} and {rank!r}", "ids")
        if file_job is not None and job_id != file_job:
            raise BadLine(f"'job_id' {job_id} in a file of job {file_job}", "job")
        if path is not None:
            self._check_order(out, path, job_id, d)
        if "event" in d:
            event = d["event"]
            if not isinstance(event, str) or not event:
                raise BadLine(f"'event' must be a non-empty string, got {event!r}", "fields")
            fields = {k: v for k, v in d.items() if k not in ENVELOPE_KEYS}
            fields["rank"] = rank
            severity = "error" if event in ("nan_loss", "crash", "error") else "info"
            out.event("kpi", event, str(d.get("message", "")), severity, fields, ts=float(ts), job_ids=[job_id])
            return
        if "step" not in d:
            raise BadLine("a line needs 'step' (metrics) or 'event'", "fields")
        values = {}
        for key in METRIC_KEYS:
            v = d.get(key)
            if v is not None and not _number(v):
                raise BadLine(f"{key!r} must be a number, got {v!r}", "fields")
            values[key] = v
        if values["step"] is not None and not isinstance(values["step"], int):
            raise BadLine(f"'step' must be an integer, got {values['step']!r}", "fields")
        for key in ("loss", "grad_norm"):  # NaN/inf losses are data (collapse detection), stored as text payload
            v = values[key]
            if isinstance(v, float) and not math.isfinite(v):
                values[key] = None
                d.setdefault("nonfinite", {})[key] = repr(v)
        payload = {k: v for k, v in d.items() if k not in METRIC_KEYS and k not in ENVELOPE_KEYS}
        out.kpi(float(ts), job_id, rank, values["step"], values["loss"], values["step_time_s"],
                values["tokens_per_s"], values["mfu"], values["grad_norm"], payload)


_RANK_FILE = re.compile(r"rank-\d+\..+\.jsonl")  # any node's file (a shared KPI directory holds every node's)


def _job_of(path: str) -> int | None:
    name = os.path.basename(os.path.dirname(path))
    return int(name[4:]) if name.startswith("job-") and name[4:].isdigit() else None


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
