"""The numerics table: one row per component kind (its worst instance), like the paper's Table 9."""

from __future__ import annotations

from sigma.train.numerics.check import METRICS, CheckResult

ORDER = ("embedding", "attention", "q_norm", "k_norm", "rope", "router", "experts", "shared_expert", "moe_combine",
         "dense_ffn", "residual", "norm", "output_head", "loss")


def rows(result: CheckResult) -> list[dict]:
    by_kind: dict[str, list] = {}
    for unit in result.units.values():
        by_kind.setdefault(unit.kind, []).append(unit)
    out = []
    for kind in sorted(by_kind, key=lambda k: ORDER.index(k) if k in ORDER else len(ORDER)):
        units = by_kind[kind]
        worst = min(units, key=lambda u: (not u.flagged, u.first_step or 0, min(u.cos.values())))
        flagged = [u for u in units if u.flagged]
        culprit = [u for u in flagged if u.name in result.culprits]
        verdict = "ok" if not flagged else ("FAIL" if culprit else "fail (inside)")
        out.append({"module": kind, "worst": worst.name, "instances": len(units), "flagged": len(flagged),
                    **{f"{m}_cos": min(u.cos[m] for u in units) for m in METRICS},
                    **{f"{m}_rel": max(u.rel[m] for u in units) for m in METRICS},
                    "flips": max(u.flips for u in units),
                    "first_step": min((u.first_step for u in flagged), default=None),
                    "verdict": verdict, "subop": worst.subop if worst.flagged else None})
    return out


def render(result: CheckResult) -> str:
    head = (f"{'module':<14} {'out cos':>9} {'out rel':>9} {'grad cos':>9} {'grad rel':>9} {'param cos':>9} "
            f"{'param rel':>9} {'flips':>6} {'first':>5}  verdict   worst instance / first diverging sub-operation")
    lines = [head, "-" * len(head)]
    for r in rows(result):
        first = "-" if r["first_step"] is None else str(r["first_step"])
        flips = f"{100 * r['flips']:.1f}%" if r["module"] == "router" else ""
        where = r["worst"] + (f" / {r['subop']}" if r["subop"] else "")
        lines.append(f"{r['module']:<14} {r['out_cos']:>9.6f} {r['out_rel']:>9.2e} {r['grad_cos']:>9.6f} "
                     f"{r['grad_rel']:>9.2e} {r['param_cos']:>9.6f} {r['param_rel']:>9.2e} {flips:>6} {first:>5}  "
                     f"{r['verdict']:<9} {where if r['flagged'] else ''}")
    limits = ", ".join(f"{k}: cos >= {c}, rel <= {r:g}" for k, (c, r) in result.thresholds.items())
    culprits = sorted({result.units[n].kind for n in result.culprits})
    lines += ["", f"thresholds ({result.dtype} on {result.device}): {limits}",
              "verdict: " + ("PASS: every component agrees with the reference" if not culprits else
                             f"FAIL: {', '.join(culprits)} diverge(s) from the reference"),
              f"({result.seconds:.1f} s)"]
    return "\n".join(lines)
