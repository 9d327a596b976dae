"""The figures as a terminal table (policy and baseline side by side) and as PNG plots."""

from __future__ import annotations

from pathlib import Path


def _fmt(v, pct=False):
    if v is None:
        return "-"
    return f"{100 * v:.1f} %" if pct else (f"{v:,.1f}" if isinstance(v, float) else str(v))


def rows(out: dict) -> list[tuple[str, list[str]]]:
    arms = list(out["arms"].values())
    get = lambda f: [f(a) for a in arms]  # noqa: E731
    stat = lambda key, s="median": get(lambda a: _fmt((a[key] or {}).get(s)))  # noqa: E731
    table = [
        ("faults (on nodes already out)", get(lambda a: f"{a['faults']} ({a['faults_on_nodes_already_out']})")),
        ("available utilisation", get(lambda a: _fmt(a["utilisation"]["available"], True))),
        ("allocated utilisation", get(lambda a: _fmt(a["utilisation"]["allocated"], True))),
        ("effective utilisation", get(lambda a: _fmt(a["utilisation"]["effective"], True))),
        ("effective training time", get(lambda a: _fmt(a["effective_training_time"], True))),
        ("job interruptions", get(lambda a: str(a["job_interruptions"]))),
        ("job MTBF (h)", get(lambda a: _fmt(a["job_mtbf_h"]))),
        ("job time to failure, median (h)", get(lambda a: _fmt((a["job_time_to_failure_s"].get("median") or 0) / 3600))),
        ("job recovery, median (s)", stat("job_recovery_s")),
        ("job recovery, p90 (s)", stat("job_recovery_s", "p90")),
        ("job recovery, p99 (s)", stat("job_recovery_s", "p99")),
        ("fault detected, median (s)", stat("fault_detect_s")),
        ("fault detected, p99 (s)", stat("fault_detect_s", "p99")),
        ("fault -> back in service, median (s)", stat("fault_out_of_service_s")),
        ("fault -> back in service, p99 (s)", stat("fault_out_of_service_s", "p99")),
        ("  beyond the repair by hand, median (s)", stat("fault_overhead_s")),
        ("  beyond the repair by hand, p99 (s)", stat("fault_overhead_s", "p99")),
    ]
    for stage in ("detect", "triage", "repair", "validate", "total"):
        table.append((f"node recycle: {stage}, median (s)", get(lambda a: _fmt(a["node_recycle_s"][stage].get("median")))))
    table += [
        ("automation ratio", get(lambda a: _fmt(a["automation"].get("ratio"), True))),
        ("escalations to people", get(lambda a: str(a["escalations"]))),
    ]
    return table


def table(out: dict) -> None:
    from rich.table import Table

    from sigma.cli import console

    t = Table(title=f"{out['nodes']} nodes x {out['gpus_per_node']} = {out['accelerators']} accelerators, "
                    f"{out['days']:g} days from {out['start']}, failures {out['failures']}, seed {out['seed']}")
    t.add_column("figure")
    for arm in out["arms"]:
        t.add_column("sigma policy" if arm == "policy" else "no automation (manual)", justify="right")
    for name, values in rows(out):
        t.add_row(name, *values)
    c = console()
    c.print(t)
    for note in out["notes"]:
        c.print(f"note: {note}")
    for arm, a in out["arms"].items():
        for line in timeline_lines(arm, a.get("timelines") or []):
            c.print(line, markup=False, highlight=False)
    c.print(f"cpu {out.get('cpu_s', '-')} s")


def timeline_lines(arm: str, timelines: list[dict]) -> list[str]:
    """Each picked fault: why it was picked, then every step after the fault, as offsets from it."""
    from sigma.simulate.timeline import duration

    if not timelines:
        return []
    lines = [f"\n{arm} arm: the slowest faults, step by step"]
    for t in timelines:
        lines.append(f"- {t['why']}: {t['node']} {t['kind']}{' (' + t['detail'] + ')' if t['detail'] else ''} at "
                     f"{t['start']} [{t['origin']}], out of service {duration(t['out_s'])}"
                     f"{'' if t['back'] else ' (not back by the end)'}"
                     + (f"; in remediation: {', '.join(f'{k} {duration(v)}' for k, v in t['states_s'].items())}"
                        if t["states_s"] else ""))
        for offset, text in t["events"]:
            lines.append(f"    +{duration(offset):>12}  {text}")
    return lines


def plots(out: dict, directory: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    fig, ax = plt.subplots(figsize=(9, 4))
    for arm, a in out["arms"].items():
        s = a["series"]
        if not s:
            continue
        t0 = s[0][0]
        days = [(p[0] - t0) / 86400.0 for p in s]
        style = "-" if arm == "policy" else "--"
        ax.step(days, [p[3] / out["nodes"] for p in s], style, where="post", label=f"{arm}: training")
        ax.step(days, [p[1] / out["nodes"] for p in s], style, where="post", alpha=0.5, label=f"{arm}: available")
    ax.set_xlabel("day")
    ax.set_ylabel("share of nodes")
    ax.set_title("utilisation over time")
    ax.legend(loc="lower left", fontsize=8)
    paths.append(directory / "utilisation.png")
    fig.savefig(paths[-1], dpi=100, bbox_inches="tight")
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 4))
    values = [v / 60.0 for a in out["arms"].values() for v in a["recovery"]]
    bins = np.linspace(0.0, max(values) * 1.02, 41) if values else 10
    for arm, a in out["arms"].items():
        if a["recovery"]:
            ax.hist([v / 60.0 for v in a["recovery"]], bins=bins, alpha=0.6, label=arm)
    ax.set_xlabel("job recovery: fault -> first step after restart (min)")
    ax.set_ylabel("interruptions")
    if values:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no job was interrupted", ha="center", transform=ax.transAxes)
    paths.append(directory / "recovery.png")
    fig.savefig(paths[-1], dpi=100, bbox_inches="tight")
    plt.close(fig)
    return paths
