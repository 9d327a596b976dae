"""Failure and repair-time models fitted to outage records: Weibull and lognormal by maximum likelihood (as the
field-failure literature does, e.g. Schroeder & Gibson on this LANL data), per system and pooled, each checked on
systems it was not fitted on (leave one system out, Kolmogorov-Smirnov distance)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sigma.simulate.trace import Outage, merge_overlaps

FAMILIES = ("weibull", "lognormal")


@dataclass(frozen=True)
class Dist:
    family: str  # weibull | lognormal
    a: float  # weibull: shape k; lognormal: mu of log(x)
    b: float  # weibull: scale lambda; lognormal: sigma of log(x)
    n: int = 0  # observations fitted
    loglik: float = float("nan")

    @property
    def aic(self) -> float:
        return 4.0 - 2.0 * self.loglik

    @property
    def mean(self) -> float:
        if self.family == "weibull":
            return self.b * math.gamma(1.0 + 1.0 / self.a)
        return math.exp(self.a + self.b ** 2 / 2.0)

    @property
    def median(self) -> float:
        return self.b * math.log(2.0) ** (1.0 / self.a) if self.family == "weibull" else math.exp(self.a)

    def cdf(self, x: np.ndarray) -> np.ndarray:
        x = np.maximum(np.asarray(x, dtype=float), 1e-12)
        if self.family == "weibull":
            return 1.0 - np.exp(-((x / self.b) ** self.a))
        return 0.5 * (1.0 + _erf((np.log(x) - self.a) / (self.b * math.sqrt(2.0))))

    def sample(self, rng: np.random.Generator, size: int | None = None):
        if self.family == "weibull":
            return self.b * rng.weibull(self.a, size)
        return rng.lognormal(self.a, self.b, size)

    def scaled(self, factor: float) -> "Dist":
        """The same shape with every value multiplied by factor."""
        if self.family == "weibull":
            return Dist("weibull", self.a, self.b * factor, self.n, self.loglik)
        return Dist("lognormal", self.a + math.log(factor), self.b, self.n, self.loglik)

    def to_dict(self) -> dict:
        names = ("shape", "scale") if self.family == "weibull" else ("mu", "sigma")
        return {"family": self.family, names[0]: round(self.a, 6), names[1]: round(self.b, 6), "n": self.n,
                "mean": round(self.mean, 3), "median": round(self.median, 3), "aic": round(self.aic, 2)}


def _erf(z: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[float])(z)


def fit(x, family: str, w=None) -> Dist:
    """Maximum-likelihood fit of positive values; w: per-value weights (default 1; the log-likelihood reported is
    the weighted one, scaled to the number of values)."""
    x = np.asarray(x, dtype=float)
    if len(x) < 3 or np.any(x <= 0):
        raise ValueError(f"need at least 3 positive values to fit, got {len(x)}")
    w = np.ones_like(x) if w is None else np.asarray(w, dtype=float) * len(x) / np.sum(w)
    lx = np.log(x)
    if family == "lognormal":
        mu = float(np.average(lx, weights=w))
        sigma = max(float(np.sqrt(np.average((lx - mu) ** 2, weights=w))), 1e-9)
        ll = float(np.sum(w * (-lx - np.log(sigma * math.sqrt(2 * math.pi)) - (lx - mu) ** 2 / (2 * sigma ** 2))))
        return Dist("lognormal", mu, sigma, len(x), ll)
    if family != "weibull":
        raise ValueError(f"unknown family {family!r}; valid: {', '.join(FAMILIES)}")
    # Newton on the profile equation for the shape k (the scale follows in closed form); scaled for stability
    s = x / x.max()
    ls = np.log(s)
    mean_ls = float(np.average(ls, weights=w))
    k = 1.2 / max(ls.std(), 1e-6)
    for _ in range(100):
        sk = w * s ** k
        a, b, c = sk.sum(), (sk * ls).sum(), (sk * ls * ls).sum()
        g = b / a - 1.0 / k - mean_ls
        dg = (c * a - b * b) / (a * a) + 1.0 / k ** 2
        step = g / dg
        k = max(k - step, k / 10)
        if abs(step) < 1e-10 * k:
            break
    lam = float((np.average(s ** k, weights=w)) ** (1.0 / k) * x.max())
    z = x / lam
    ll = float(np.sum(w * (math.log(k / lam) + (k - 1) * np.log(z) - z ** k)))
    return Dist("weibull", float(k), lam, len(x), ll)


def best(x, w=None) -> Dist:
    """The family with the lower AIC."""
    return min((fit(x, f, w) for f in FAMILIES), key=lambda d: d.aic)


def ks(d: Dist, x) -> float:
    """Kolmogorov-Smirnov distance between the fitted CDF and the empirical one of x."""
    x = np.sort(np.asarray(x, dtype=float))
    n = len(x)
    f = d.cdf(x)
    return float(max(np.max(np.arange(1, n + 1) / n - f), np.max(f - np.arange(n) / n)))


def uptimes_h(outages: list[Outage]) -> np.ndarray:
    """Per node: hours from one repair to the node's next failure (overlapping records folded first)."""
    merged, _ = merge_overlaps(outages)
    last_end: dict[int, float] = {}
    out = []
    for o in merged:
        if o.node in last_end:
            gap = o.start - last_end[o.node]
            if gap > 0:
                out.append(gap / 3600.0)
        last_end[o.node] = o.end if o.end is not None else o.start
    return np.asarray(out)


def repairs_h(outages: list[Outage]) -> np.ndarray:
    """Outage durations in hours (records with a zero duration carry no repair time and are not fitted)."""
    return np.asarray([o.repair_s / 3600.0 for o in outages if o.repair_s])


@dataclass
class FailureModel:
    """Per-node time to failure and repair time, and the mix of fault kinds, as fitted (or given)."""

    name: str
    uptime_h: Dist
    repair_h: Dist
    kinds: dict[str, float]  # fault kind -> share

    def to_dict(self) -> dict:
        return {"name": self.name, "uptime_h": self.uptime_h.to_dict(), "repair_h": self.repair_h.to_dict(),
                "kinds": {k: round(v, 4) for k, v in self.kinds.items()}}


def kind_mix(outages: list[Outage]) -> dict[str, float]:
    counts: dict[str, int] = {}
    for o in outages:
        counts[o.kind] = counts.get(o.kind, 0) + 1
    total = sum(counts.values())
    return {k: counts[k] / total for k in sorted(counts)}


def model_from(name: str, outages: list[Outage]) -> FailureModel:
    return FailureModel(name, best(uptimes_h(outages)), best(repairs_h(outages)), kind_mix(outages))


def pooled_model(name: str, systems: dict[int, list[Outage]], chosen: list[int]) -> FailureModel:
    """One model over several systems, each system weighing the same: fitted on every record, one busy system
    (LANL system 2 has 7,104 of the 9,192 records) would otherwise be the model."""
    ups, rep, wu, wr, kinds = [], [], [], [], {}
    for s in chosen:
        u, r = uptimes_h(systems[s]), repairs_h(systems[s])
        ups.append(u), rep.append(r), wu.append(np.full(len(u), 1.0 / max(len(u), 1)))
        wr.append(np.full(len(r), 1.0 / max(len(r), 1)))
        for k, share in kind_mix(systems[s]).items():
            kinds[k] = kinds.get(k, 0.0) + share / len(chosen)
    return FailureModel(name, best(np.concatenate(ups), np.concatenate(wu)),
                        best(np.concatenate(rep), np.concatenate(wr)), dict(sorted(kinds.items())))


def fit_systems(systems: dict[int, list[Outage]], pooled: list[int]) -> dict:
    """Per system and pooled fits, and the held-out check: for each pooled system, the fit on all the *other*
    systems scored on it (KS distance), beside the system's own fit; nothing is tuned to one system."""
    out = {"systems": {}, "pooled_systems": pooled, "held_out": {}}
    for s, recs in sorted(systems.items()):
        up, rep = uptimes_h(recs), repairs_h(recs)
        entry = {"outages": len(recs), "nodes": len({o.node for o in recs})}
        for label, x in (("uptime_h", up), ("repair_h", rep)):
            if len(x) >= 3:
                entry[label] = {f: {**fit(x, f).to_dict(), "ks": round(ks(fit(x, f), x), 4)} for f in FAMILIES}
        out["systems"][s] = entry
    out["pooled"] = pooled_model("lanl", systems, pooled).to_dict()
    for s in pooled:
        rest = [o for t in pooled if t != s for o in systems[t]]
        out["held_out"][s] = {label: scored(fn(rest), None, fn(systems[s]))
                              for label, fn in (("uptime_h", uptimes_h), ("repair_h", repairs_h))
                              if len(fn(systems[s])) >= 3}
    return out


def scored(train, weights, held) -> dict:
    """Per family: the KS distance on `held` of the fit on `train` as is ("others"), of its shape at held's own
    median ("others_shape": the level is the failure rate, which a site knows from its own records; does the
    *shape* carry over?), and of held's own fit ("own", the floor)."""
    row = {}
    for f in FAMILIES:
        others, own = fit(train, f, weights), fit(held, f)
        shape = others.scaled(float(np.median(held)) / others.median)
        row[f] = {"others": round(ks(others, held), 4), "others_shape": round(ks(shape, held), 4),
                  "own": round(ks(own, held), 4)}
    return row


def across_fleets(systems: dict[int, list[Outage]], pooled: list[int], name: str, other: list[Outage]) -> dict:
    """The failure model checked across fleets, both ways: fitted on the LANL clusters (each system weighing the
    same, as `--failures lanl` does) and scored on another fleet's trace; fitted on that trace and scored on each
    LANL system."""
    out: dict = {"lanl_to_" + name: {}, name + "_to_lanl": {}}
    for label, fn in (("uptime_h", uptimes_h), ("repair_h", repairs_h)):
        parts = [fn(systems[s]) for s in pooled]
        x = np.concatenate(parts)
        w = np.concatenate([np.full(len(p), 1.0 / max(len(p), 1)) for p in parts])
        held = fn(other)
        out["lanl_to_" + name][label] = scored(x, w, held)
        out[name + "_to_lanl"][label] = {s: scored(held, None, fn(systems[s])) for s in pooled
                                         if len(fn(systems[s])) >= 3}
    out[name] = {"outages": len(other), "nodes": len({o.node for o in other}),
                 "uptime_h": best(uptimes_h(other)).to_dict(), "repair_h": best(repairs_h(other)).to_dict()}
    return out
