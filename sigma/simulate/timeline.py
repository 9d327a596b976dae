"""Per-fault timelines: everything that happened to a node from its fault until it was back in service (detection,
each decision, the remediation's states, reboots, tickets, validation jobs), so the slowest faults of a run can be
read step by step, and the time each spent in each remediation state."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field


@dataclass
class Episode:
    node: str
    kind: str
    detail: str
    origin: str
    start: float
    hands_on_until: float = 0.0  # when the repairs by hand of its faults end, as recorded (start: none needed)
    events: list[tuple[float, str]] = field(default_factory=list)
    out_at: float | None = None  # the node left service (drained, down or reserved)
    back_at: float | None = None  # ... and came back
    detected_at: float | None = None  # the controller had what names the node / a person noticed
    shown_at: float | None = None  # a fault only a job shows: when a job first met it (idle until then)
    states: dict[str, float] = field(default_factory=dict)  # seconds in each remediation state
    _state: tuple[str, float] | None = None

    def overhead_s(self, end: float) -> float:
        """Out of service beyond the repair by hand its faults needed (as recorded): what detection, triage,
        reboots, tickets and validation added, the part automation can change."""
        return (self.back_at if self.back_at is not None else end) - max(self.hands_on_until,
                                                                          self.shown_at or self.start)

    def out_s(self, end: float) -> float:
        """Fault until back in service (the end of the run if it never came back), from when it could first be
        seen: a fault only a job shows sat on an idle node, in service, until a job met it."""
        return (self.back_at if self.back_at is not None else end) - (self.shown_at or self.start)

    @property
    def detect_s(self) -> float | None:
        """From when the fault could first be seen (a job met it, for one only a job shows) to its detection."""
        if self.detected_at is None:
            return None
        return self.detected_at - (self.shown_at if self.shown_at is not None else self.start)

    def to_dict(self, end: float) -> dict:
        return {"node": self.node, "kind": self.kind, "detail": self.detail, "origin": self.origin,
                "start": _iso(self.start), "out_s": round(self.out_s(end), 1), "back": self.back_at is not None,
                "detect_s": None if self.detect_s is None else round(self.detect_s, 1),
                "latent_s": None if self.shown_at is None else round(self.shown_at - self.start, 1),
                "states_s": {k: round(v, 1) for k, v in self.states.items()},
                "events": [[round(t - self.start, 1), text] for t, text in self.events]}


class Timelines:
    """The engine tells it what happens to nodes; a node's episode runs from a fault on it until it is back."""

    def __init__(self, clock):
        self.clock = clock
        self.open: dict[str, Episode] = {}  # node -> its episode under way
        self.all: list[Episode] = []
        self._closed: dict[str, Episode] = {}  # node -> its episode that ended this instant (its last notes)

    def fault(self, node: str, kind: str, detail: str, origin: str, text: str, hands_on_s: float = 0.0) -> Episode:
        """A fault starts an episode, or joins the one under way (the node not yet back from an earlier fault)."""
        ep = self.open.get(node)
        if ep is not None:
            ep.events.append((self.clock(), f"another fault before it is back in service: {text}"))
            self.hands_on(node, self.clock() + hands_on_s)
            return ep
        ep = Episode(node, kind, detail, origin, self.clock(), self.clock() + hands_on_s)
        self.open[node] = ep
        self.all.append(ep)
        ep.events.append((ep.start, text))
        return ep

    def note(self, node: str, text: str) -> None:
        ep = self.open.get(node) or self._closed.get(node)
        if ep is not None and (ep.back_at is None or ep.back_at == self.clock()):
            ep.events.append((self.clock(), text))

    def hands_on(self, node: str, until: float) -> None:
        ep = self.open.get(node)
        if ep is not None:
            ep.hands_on_until = max(ep.hands_on_until, until)

    def shown(self, node: str) -> None:
        ep = self.open.get(node)
        if ep is not None and ep.shown_at is None:
            ep.shown_at = self.clock()
            ep.hands_on_until += ep.shown_at - ep.start  # nobody could start the repair before

    def detected(self, node: str, text: str) -> None:
        ep = self.open.get(node)
        if ep is not None:
            if ep.detected_at is None:
                ep.detected_at = self.clock()
            ep.events.append((self.clock(), text))

    def state(self, node: str, to_state: str, terminal: bool) -> None:
        """A remediation state change: time in the state left is added up (a cycle can visit a state again)."""
        ep = self.open.get(node)
        if ep is None:
            return
        now = self.clock()
        if ep._state is not None:
            name, since = ep._state
            ep.states[name] = ep.states.get(name, 0.0) + now - since
        ep._state = None if terminal else (to_state, now)

    def service(self, node: str, in_service: bool) -> None:
        """The node's schedulable state as SLURM shows it (not drained, responding, outside a reservation)."""
        ep = self.open.get(node)
        if ep is None:
            return
        if ep.out_at is None:
            if not in_service:
                ep.out_at = self.clock()
                ep.events.append((ep.out_at, "out of service"))
            return
        if in_service:
            ep.back_at = self.clock()
            ep.events.append((ep.back_at, "back in service"))
            self.state(node, "", terminal=True)
            self._closed[node] = self.open.pop(node)

    def slowest(self, n: int, end: float) -> list[dict]:
        """The n faults longest out of service, then the slowest detection, the longest a fault only a job shows
        sat on an idle node, and the longest validation, if they are not among them (each says why it was picked)."""
        if n <= 0 or not self.all:
            return []
        picked: dict[int, str] = {}
        for ep in sorted(self.all, key=lambda e: -e.out_s(end))[:n]:
            picked[id(ep)] = "longest out of service"
        detected = [e for e in self.all if e.detected_at is not None]
        for why, key, pool in (("slowest detection", lambda e: e.detect_s, detected),
                               ("longest latent on an idle node", lambda e: (e.shown_at or e.start) - e.start,
                                self.all),
                               ("longest validation", lambda e: e.states.get("validating", 0.0), self.all)):
            if pool:
                worst = max(pool, key=key)
                if key(worst) > 0:
                    picked.setdefault(id(worst), why)
        by_id = {id(e): e for e in self.all}
        return [{"why": why, **by_id[i].to_dict(end)} for i, why in picked.items()]


def duration(s: float) -> str:
    """A span as people read it: 1.2 s, 14 min 3 s, 6 h 12 min, 22 d 3 h."""
    s = float(s)
    if abs(s) < 60:
        return f"{s:.1f} s"
    m = int(round(s)) // 60
    if m < 60:
        return f"{m} min {int(round(s)) % 60} s"
    h = m // 60
    if h < 48:
        return f"{h} h {m % 60} min"
    return f"{h // 24} d {h % 24} h"


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
