"""Control files: how the controller's requests reach a job's trainer ranks on this node.

The sidecar gets the controller's requests on the ingest reply and writes them, atomically, next to the job's KPI
files; trainers poll them between steps (sigma/train/jit.py, and any trainer through sigma.kpi). Files, not a socket: any
trainer can read them, and a trainer never runs a network service. This module is the one both sides import (the
sidecar writes, trainers read): it needs nothing beyond the standard library.

    <kpi dir>/job-<id>/checkpoint-request.<node>.json   {"id": 17, "job_id": 42, "deadline": 1763942400.5}
"""

from __future__ import annotations

import json
import os
from pathlib import Path

REQUEST_NAME = "checkpoint-request.{node}.json"
NAN_TRIGGER = "inject-nan"  # `sigma chaos nan` creates it in the job's KPI directory; a trainer's fault hook consumes it


def request_path(kpi_dir: str | Path, job_id: int, node: str) -> Path:
    return Path(kpi_dir) / f"job-{int(job_id)}" / REQUEST_NAME.format(node=node)


def _handed_on(path: Path, request_id: int) -> bool:
    """The control file already holds this request (an unreadable or half-written one does not count)."""
    try:
        return json.loads(path.read_text()).get("id") == request_id
    except (OSError, ValueError, AttributeError):
        return False


def write_checkpoint_requests(kpi_dir: str | Path, node: str, requests: list[dict]) -> list[str]:
    """Write each request's control file (temp file + rename, so a rank never reads half of one); return the
    problems (a request without a job id, a job directory that cannot be written), one line each."""
    problems = []
    for req in requests:
        try:
            path = request_path(kpi_dir, req["job_id"], node)
            body = json.dumps({"id": int(req["id"]), "job_id": int(req["job_id"]),
                               "deadline": float(req.get("deadline") or 0)})
        except (KeyError, TypeError, ValueError) as exc:
            problems.append(f"checkpoint request {req!r} malformed: {exc}")
            continue
        if _handed_on(path, int(req["id"])):
            continue  # the request rides on every ack until it is answered
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(body)
            os.replace(tmp, path)
        except OSError as exc:
            problems.append(f"cannot write {path}: {exc}")
    return problems


def read_request(path: Path, now: float, since: float | None = None) -> tuple[int, float]:
    """(request id, deadline) in a control file; (0, 0.0) when there is none, it is unreadable, its deadline
    passed (the controller has requeued by then) or it was written before `since` (this run's start: a request
    handed to an earlier run of the job, whose answer is what this run resumed from)."""
    try:
        if since is not None and path.stat().st_mtime < since:
            return 0, 0.0
        req = json.loads(path.read_text())
        deadline = float(req.get("deadline") or 0)
        return (int(req["id"]), deadline) if not deadline or now < deadline else (0, 0.0)
    except FileNotFoundError:
        return 0, 0.0
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return 0, 0.0  # a half-written or foreign file is no request; the sidecar writes by rename
