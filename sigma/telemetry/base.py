"""What every collector shares: its parameters base class, the registry by name, and the Output it fills.

A collector is one module under sigma/telemetry/collectors/ that defines

    @register("host")
    class HostCollector(Collector):
        @dataclass
        class Params(CollectorParams):
            percpu: bool = True  # one series per CPU as well as the total
        def collect(self, out: Output) -> None:
            out.sample("host.load1", 0.5)

The agent builds it from the YAML section of the same name (or `type:`), runs it every `interval_s` in its own
thread, times it, and stores what it put in `out` in one transaction.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import time
from dataclasses import dataclass, field
from typing import ClassVar

REGISTRY: dict[str, type["Collector"]] = {}


class CollectorUnavailable(RuntimeError):
    """The collector cannot run on this node (e.g. no NVML library or no GPU): reported, not an error."""


@dataclass
class CollectorParams:
    enabled: bool = True  # false keeps the section in the file but does not run it
    interval_s: float = 1.0  # seconds between runs of this collector
    type: str = ""  # collector type when the section name is not one (e.g. several logtail sections)

    def __post_init__(self):
        if self.interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {self.interval_s}")


@dataclass
class Context:
    """What collectors may know about the node they run on (paths already have placeholders expanded)."""

    node: str
    node_dir: str
    host_root: str = "/"  # prefix for /proc and /sys reads (fixture trees in tests)
    positions: dict = field(default_factory=dict)  # persisted tail positions, key -> JSON value
    active_jobs: object = None  # callable -> list[int], the job ids running on the node now
    job_owner: object = None  # callable(job_id) -> uid if SLURM runs that job on this node now, else None


class Collector:
    name: ClassVar[str] = ""
    Params: ClassVar[type] = CollectorParams

    def __init__(self, section: str, params, ctx: Context):
        self.section = section
        self.params = params
        self.ctx = ctx

    def collect(self, out: "Output") -> None:
        """Gather one round of records into out; every registered collector overrides this."""
        raise TypeError(f"collector {type(self).__name__} does not define collect()")

    def close(self) -> None:
        """Release handles (files, NVML); called on reload and shutdown."""


def register(name: str):
    def deco(cls):
        if name in REGISTRY:
            raise ValueError(f"collector {name!r} registered twice")
        cls.name = name
        REGISTRY[name] = cls
        return cls
    return deco


def load_collectors() -> dict[str, type[Collector]]:
    """Import every module under sigma.telemetry.collectors so each registers itself."""
    from sigma.telemetry import collectors

    for info in pkgutil.iter_modules(collectors.__path__):
        importlib.import_module(f"{collectors.__name__}.{info.name}")
    return REGISTRY


_LABELS_CACHE: dict[tuple, str] = {}


def labels_json(labels: dict | None) -> str:
    """Canonical JSON for a label set, cached: the same series recur every interval."""
    if not labels:
        return "{}"
    key = tuple(labels.items())
    text = _LABELS_CACHE.get(key)
    if text is None:
        if len(_LABELS_CACHE) > 50_000:
            _LABELS_CACHE.clear()
        text = _LABELS_CACHE[key] = json.dumps({k: str(v) for k, v in sorted(labels.items())},
                                               separators=(",", ":"))
    return text


class Output:
    """Records one collector run produced, plus tail positions to persist in the same transaction."""

    __slots__ = ("ts", "samples", "events", "kpis", "positions")

    def __init__(self, ts: float | None = None):
        self.ts = time.time() if ts is None else ts
        self.samples: list[tuple] = []  # (ts, metric, value, labels_json)
        self.events: list[tuple] = []  # (ts, source, kind, severity, message, fields_json, job_ids_json|None)
        self.kpis: list[tuple] = []  # (ts, job_id, rank, step, loss, step_time_s, tokens_per_s, mfu, grad_norm, payload)
        self.positions: dict[str, str] = {}

    def sample(self, metric: str, value, labels: dict | None = None, ts: float | None = None) -> None:
        self.samples.append((self.ts if ts is None else ts, metric, value, labels_json(labels)))

    def event(self, source: str, kind: str, message: str = "", severity: str = "info", fields: dict | None = None,
              ts: float | None = None, job_ids: list[int] | None = None) -> None:
        self.events.append((self.ts if ts is None else ts, source, kind, severity, message,
                            json.dumps(fields or {}, separators=(",", ":"), default=str),
                            None if job_ids is None else json.dumps(sorted(job_ids))))

    def kpi(self, ts: float, job_id: int, rank: int, step, loss, step_time_s, tokens_per_s, mfu, grad_norm,
            payload: dict) -> None:
        self.kpis.append((ts, job_id, rank, step, loss, step_time_s, tokens_per_s, mfu, grad_norm,
                          json.dumps(payload, separators=(",", ":"), default=str)))

    def position(self, key: str, value) -> None:
        self.positions[key] = json.dumps(value)

    def __len__(self) -> int:
        return len(self.samples) + len(self.events) + len(self.kpis)
