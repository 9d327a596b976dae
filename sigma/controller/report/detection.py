"""What each node's detection can see, as its sidecar last said: which kernel log it reads, or that it reads none.

The sidecar reports its kernel log once per change and once a day (events kernel_log_source, info, and
kernel_log_unavailable, error); the newest of the two per node is the node's state. A node that never said either
(an older sidecar, or none running) is unknown, not healthy.
"""

from __future__ import annotations

import json

KINDS = ("kernel_log_source", "kernel_log_unavailable")


def kernel_logs(conn) -> dict[str, dict]:
    """node -> {"ok": bool, "source": journal|kmsg|file|none, "detail": the sidecar's words, "since": ts}."""
    rows = conn.execute(
        "SELECT e.node, e.ts, e.kind, e.message, e.fields FROM events e JOIN (SELECT node, MAX(ts) AS ts FROM events"
        " WHERE source = 'sidecar' AND kind IN (?, ?) GROUP BY node) newest ON e.node = newest.node AND"
        " e.ts = newest.ts WHERE e.source = 'sidecar' AND e.kind IN (?, ?) ORDER BY e.node, e.id", KINDS + KINDS)
    out = {}
    for node, ts, kind, message, fields in rows:
        try:
            f = json.loads(fields or "{}")
        except ValueError:
            f = {}
        reasons = f.get("reasons") if isinstance(f.get("reasons"), dict) else {}
        out[node] = {"ok": kind == "kernel_log_source", "source": f.get("source") or "none", "since": ts,
                     "detail": "; ".join(f"{k}: {v}" for k, v in reasons.items()) or message}
    return out


def describe(state: dict | None) -> str:
    """One cell for `sigma nodes`: 'ok: journal', or 'DEGRADED: no kernel log (...)', or 'unknown'."""
    if state is None:
        return "unknown (no kernel-log report from its sidecar)"
    if state["ok"]:
        return f"ok: kernel log from {state['source']}"
    return f"DEGRADED: no kernel log ({state['detail']})"
