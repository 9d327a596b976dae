"""`sigma report --html FILE`: the report as one self-contained page an admin can open or mail.

Plots are drawn with matplotlib (no display needed) and embedded as base64 PNG, styles are inline: the file
needs nothing else. It shows utilisation over time, each node's time out of service with its incidents,
the job recovery and node recycle time distributions, and the automation ratio, above the same tables as
the text report.
"""

from __future__ import annotations

import base64
import html
import io
import json
import sqlite3
import time
from collections import defaultdict

from sigma.controller.report.metrics import IN_SERVICE

OUT_FLAGS = {"DRAIN", "NOT_RESPONDING", "MAINTENANCE", "RESERVED", "REBOOT_REQUESTED"}
STYLE = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f4f4f4}td.l,th.l{text-align:left}img{max-width:100%;border:1px solid #eee}
.kpi{display:inline-block;margin:0 2em .5em 0}.kpi b{display:block;font-size:1.6em}.muted{color:#777}
"""


def render(conn: sqlite3.Connection, rep: dict, title: str = "Sigma cluster report") -> str:
    """The page for report(conn, ...) = rep; plots read the same window from conn."""
    since, until = rep["since"], rep["until"]
    end = _data_end(conn, since, until)  # plots end with the data, not at an idle "now"
    u, j, r, a = rep["utilisation"], rep["jobs"], rep["recycling"], rep["automation"]
    pct = lambda k: f"{100 * u[k]:.1f} %" if k in u else "-"
    sec = lambda d, k="median": f"{d[k]:.1f} s" if d.get("count") else "-"
    ratio = "-" if a["ratio"] is None else f"{a['ratio']:.2f}"
    parts = [
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{_e(title)}</title><style>{STYLE}</style>"
        f"</head><body><h1>{_e(title)}</h1>",
        f"<p class='muted'>{_ts(since)} .. {_ts(until)} ({(until - since) / 3600:.2f} h), generated "
        f"{_ts(time.time())} from the controller database</p>",
        "<div>" + "".join(f"<span class='kpi'>{_e(k)}<b>{_e(v)}</b></span>" for k, v in (
            ("available", pct("available")), ("allocated", pct("allocated")), ("effective", pct("effective")),
            ("interruptions", str(j["interruptions"])), ("recovery (median)", sec(j["recovery_s"])),
            ("node recycle (mean)", sec(r["total_s"], "mean")), ("automation ratio", ratio))) + "</div>",
        "<h2>Utilisation over time</h2>", _img(plot_utilisation(conn, since, end), "utilisation over time"),
        "<h2>Incidents per node</h2>", _img(plot_incidents(conn, since, end), "incident timeline per node"),
        "<h2>Recovery and recycle times</h2>", _img(plot_durations(rep), "recovery and recycle time distributions"),
        _table(["interruptions", "MTBF", "time to failure (median)", "recovery (median)",
                "after decision (median)"],
               [[j["interruptions"], f"{j['mtbf_s']:.0f} s" if j["mtbf_s"] else "-", sec(j["time_to_failure_s"]),
                 sec(j["recovery_s"]), sec(j["recovery_after_decision_s"])]]),
        _table(["cycles", "detect", "triage", "repair", "validate", "total"],
               [[len(r["cycles"])] + [sec(r[k], "mean") for k in ("detect_s", "triage_s", "repair_s",
                                                                   "validate_s", "total_s")]],
               caption="node recycling (mean)"),
        "<h2>Automation</h2>", _img(plot_automation(a), "automation ratio"),
        f"<p>automation ratio {ratio}: {a['automatic']} incident(s) handled end to end without a person, "
        f"{a['manual']} needed one.</p>",
        "<h2>Throughput stability per job</h2>",
        _table(["job", "steps", "peak tokens/s", "min/peak", "mean/peak", "std", "cv"],
               [[j["job_id"], j["steps"], f"{j['peak']:.4g}", f"{j['min_over_peak']:.3f}",
                 f"{j['mean_over_peak']:.3f}", f"{j['std']:.4g}", f"{j['cv']:.3f}"]
                for j in rep.get("stability", [])],
               caption="step throughput, each step at its slowest rank (sigma noise --job J says why)"),
        "<h2>Incidents</h2>",
        _table(["rule", "status", "count", "detect latency"],
               [[i["rule"], i["status"], i["count"],
                 f"{i['detect_latency_s']:.1f} s" if i["detect_latency_s"] is not None else "-"]
                for i in rep["incidents"]], left=2),
        "</body></html>",
    ]
    return "\n".join(parts)


# ---------- plots ----------

def _data_end(conn: sqlite3.Connection, since: float, until: float) -> float:
    last = [conn.execute(f"SELECT MAX({col}) FROM {table} WHERE {col} <= ?", (until,)).fetchone()[0]
            for table, col in (("node_snapshots", "ts"), ("lifecycle_transitions", "ts"), ("incidents", "opened_at"))]
    last = [t for t in last if t is not None and t > since]
    return max(last) if last else until


def _figure(height: float = 3.0):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, height), dpi=100)
    return fig, ax


def _minutes(ts: float, since: float) -> float:
    return (ts - since) / 60.0


def plot_utilisation(conn: sqlite3.Connection, since: float, until: float) -> bytes:
    """Share of nodes in service and allocated over time (a node keeps its last snapshot until the next one)."""
    current: dict[str, tuple[bool, bool]] = {}  # node -> (in service, running jobs)
    times, avail, alloc = [], [], []
    for s in conn.execute("SELECT ts, node, state, flags, alloc_cpus, jobs FROM node_snapshots WHERE ts <= ?"
                          " ORDER BY ts", (until,)):
        current[s["node"]] = (s["state"] in IN_SERVICE and not OUT_FLAGS & set(s["flags"].split(",")),
                              s["alloc_cpus"] > 0 or bool(json.loads(s["jobs"])))
        if s["ts"] < since:
            continue
        if times and times[-1] == _minutes(s["ts"], since):  # one tick's snapshots: keep the last tally
            times.pop(), avail.pop(), alloc.pop()
        times.append(_minutes(s["ts"], since))
        avail.append(100 * sum(up for up, _ in current.values()) / len(current))
        alloc.append(100 * sum(busy for _, busy in current.values()) / len(current))
    fig, ax = _figure()
    if times:
        ax.step(times, avail, where="post", label="nodes in service", color="#2a7")
        ax.fill_between(times, alloc, step="post", alpha=0.35, label="nodes running jobs", color="#37c")
    else:
        ax.text(0.5, 0.5, "no node snapshots in this window", ha="center", transform=ax.transAxes)
    ax.set_ylim(0, 105)
    ax.set_ylabel("% of nodes")
    ax.set_xlabel("minutes since window start")
    ax.legend(loc="lower left")
    return _png(fig)


def plot_incidents(conn: sqlite3.Connection, since: float, until: float) -> bytes:
    """Per node: time out of service (lifecycle transitions) and a marker at every incident, by rule."""
    out_spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    opened: dict[str, float] = {}
    for t in conn.execute("SELECT node, ts, to_state FROM lifecycle_transitions WHERE ts <= ? ORDER BY id",
                          (until,)):
        if t["to_state"] == "resumed":
            if t["node"] in opened:
                out_spans[t["node"]].append((opened.pop(t["node"]), t["ts"]))
        else:
            opened.setdefault(t["node"], t["ts"])
    for node, start in opened.items():
        out_spans[node].append((start, until))
    incidents = conn.execute("SELECT node, opened_at, rule_id FROM incidents WHERE opened_at >= ? AND opened_at <= ?"
                             " AND node IS NOT NULL ORDER BY opened_at", (since, until)).fetchall()
    nodes = sorted({i["node"] for i in incidents} | set(out_spans), key=_natural)
    fig, ax = _figure(max(1.8, 0.45 * len(nodes) + 1.2))
    if not nodes:
        ax.text(0.5, 0.5, "no incidents in this window", ha="center", transform=ax.transAxes)
    rows = {n: k for k, n in enumerate(nodes)}
    for node, spans in out_spans.items():
        bars = [(_minutes(max(a, since), since), (min(b, until) - max(a, since)) / 60) for a, b in spans if b > since]
        ax.broken_barh(bars, (rows[node] - 0.3, 0.6), color="#e99", label=None)
    palette = ["#c22", "#d80", "#62a", "#06a", "#383", "#a3a", "#555"]
    colours: dict[str, str] = {}
    for i in incidents:
        first = i["rule_id"] not in colours
        c = colours.setdefault(i["rule_id"], palette[len(colours) % len(palette)])
        ax.plot([_minutes(i["opened_at"], since)], [rows[i["node"]]], marker="v", color=c, markersize=9,
                linestyle="none", label=i["rule_id"] if first else None)
    ax.set_yticks(range(len(nodes)), nodes)
    ax.set_ylim(-0.7, max(0.7, len(nodes) - 0.3))
    ax.set_xlim(0, max(1e-3, _minutes(until, since)))
    ax.set_xlabel("minutes since window start (shaded: out of service)")
    if incidents:
        ax.legend(loc="upper left", fontsize=8, ncol=4)
    return _png(fig)


def plot_durations(rep: dict) -> bytes:
    """Job recovery times, and each node recycle split into detect / triage / repair / validate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.2), dpi=100)
    rec = [x["recovery_s"] for x in rep["jobs"]["recoveries"] if x["recovery_s"] is not None]
    if rec:
        left.hist(rec, bins=min(20, max(3, len(rec))), color="#37c")
    else:
        left.text(0.5, 0.5, "no job recovered in this window", ha="center", transform=left.transAxes)
    left.set_title("job recovery: fault -> first step after resume", fontsize=10)
    left.set_xlabel("seconds")
    left.set_ylabel("interruptions")
    cycles = [c for c in rep["recycling"]["cycles"] if "total_s" in c]
    parts = ("detect_s", "triage_s", "repair_s", "validate_s")
    colours = ("#c22", "#d80", "#62a", "#2a7")
    bottom = [0.0] * len(cycles)
    for part, colour in zip(parts, colours):
        values = [c.get(part, 0.0) for c in cycles]
        right.barh(range(len(cycles)), values, left=bottom, color=colour, label=part[:-2])
        bottom = [b + v for b, v in zip(bottom, values)]
    right.set_yticks(range(len(cycles)), [f"{c['node']} #{c['cycle']}" for c in cycles])
    if not cycles:
        right.text(0.5, 0.5, "no node came back in this window", ha="center", transform=right.transAxes)
    right.set_title("node recycle time", fontsize=10)
    right.set_xlabel("seconds")
    if cycles:
        right.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return _png(fig)


def plot_automation(a: dict) -> bytes:
    fig, ax = _figure(1.4)
    total = a["automatic"] + a["manual"]
    if total:
        ax.barh([0], [a["automatic"]], color="#2a7", label=f"automatic ({a['automatic']})")
        ax.barh([0], [a["manual"]], left=[a["automatic"]], color="#d80", label=f"needed a person ({a['manual']})")
        ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=9)
    else:
        ax.text(0.5, 0.5, "nothing needed handling in this window", ha="center", transform=ax.transAxes)
    ax.set_yticks([])
    ax.set_xlabel("incidents")
    fig.tight_layout()
    return _png(fig)


# ---------- html helpers ----------

def _png(fig) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _img(png: bytes, alt: str) -> str:
    return f"<img alt='{_e(alt)}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"


def _table(header: list[str], rows: list[list], caption: str = "", left: int = 0) -> str:
    """left: how many leading columns are text (left-aligned)."""
    cls = lambda k: " class='l'" if k < left else ""
    head = "".join(f"<th{cls(k)}>{_e(h)}</th>" for k, h in enumerate(header))
    body = "".join("<tr>" + "".join(f"<td{cls(k)}>{_e(v)}</td>" for k, v in enumerate(row)) + "</tr>"
                   for row in rows)
    cap = f"<caption>{_e(caption)}</caption>" if caption else ""
    return f"<table>{cap}<tr>{head}</tr>{body}</table>"


def _e(value) -> str:
    return html.escape(str(value))


def _ts(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _natural(name: str):
    import re

    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]
