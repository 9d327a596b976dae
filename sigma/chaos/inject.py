"""Fault injection at the source, on the local cluster's emulated nodes; every injection is journaled and undoable.

Kinds:
  log        a kernel-log line in the node's kern.log (Xid code, a named signature, or any text)
  hang       SIGSTOP every process of the job on the node (undo: SIGCONT)
  straggler  duty-cycle SIGSTOP/SIGCONT of the job's processes on the node, slowing them by a percentage
  node-death SIGKILL the node's slurmd (undo: start it again)
  nan        ask the job's trainer ranks to produce a NaN loss (the trainer's testing-only fault hook)
  cpu-hog    processes on the CPUs the job's ranks on the node use, busy --percent of each period (undo: stop them)
  page-cache a hot filler file while the job's mapped pages are evicted every period (undo: stop, delete the file)
  io-stall   synced writes saturating the disk while the job's data pages are evicted every period
  gc-pressure  ask the job's trainer ranks on the node to churn objects in reference cycles (fault.gc_trigger)

The journal (<cluster dir>/chaos.jsonl) records each injection with its time so reports can compute latencies.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from sigma.slurm.cluster import LocalCluster
from sigma.telemetry.control import NAN_TRIGGER

KINDS = ("log", "hang", "straggler", "node-death", "nan", "cpu-hog", "page-cache", "io-stall", "gc-pressure")
NOISE_KINDS = ("cpu-hog", "page-cache", "io-stall")  # background processes of sigma.chaos.noise

# Xid texts as NVIDIA's driver prints them after the code (the rest of the catalogue's codes get a generic text).
XID_TEXT = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address",
    31: "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2d_2c000000",
    43: "Ch 00000010",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to remap a row",
    74: "NVLink: fatal error detected on link 3(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate",
    94: "Contained: CE User Channel (0x9). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
    119: "Timeout after 6s of waiting for RPC response from GPU1 GSP! Expected function 76 (GSP_RM_CONTROL)",
    154: "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
}
# Short names kept for scripts written before signatures were rule ids.
ALIASES = {"ecc": "gpu-xid-repair", "hung-task": "kernel-hung-task", "ib-down": "ib-port-down",
           "lost-carrier": "nic-lost-carrier"}


@dataclass(frozen=True)
class Signature:
    name: str  # the rule id (or an alias)
    rule_id: str
    line: str  # the message, without an envelope
    target: str  # kernel, dcgm, job or service
    ident: str = "kernel"  # the program a service's line names (a service target's example carries it)


def catalogue_signatures(rules_dir: str | Path | None = None) -> dict[str, Signature]:
    """Every enabled log rule of the catalogue with an example line, by rule id (plus the short aliases).

    Read with libyaml, without the loader's validation: every `sigma` command lists these names, and the
    controller (`sigma controller rules --check`) is where the catalogue is validated."""
    import yaml

    from sigma.paths import project_root
    from sigma.rules.catalogue import TARGET_BY_KIND
    from sigma.telemetry.logformats import parse

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    out: dict[str, Signature] = {}
    for path in sorted(Path(rules_dir or project_root() / "configs" / "rules").glob("*.y*ml")):
        for rule in (yaml.load(path.read_text(), Loader=loader) or {}).get("rules") or []:
            log, examples = rule.get("log"), rule.get("examples")
            if not isinstance(log, dict) or not examples or rule.get("enabled") is False:
                continue
            if log.get("max_uptime_s") is not None:
                continue  # a line only a booting node writes: a line injected into a running one is another fault
            kinds = log.get("kinds") or []
            target = next((TARGET_BY_KIND[k] for k in kinds if k in TARGET_BY_KIND), "kernel")
            example = parse(examples[0])
            out[rule["id"]] = Signature(rule["id"], rule["id"], example.message, target,
                                        example.ident if target == "service" else "kernel")
    for alias, rule_id in ALIASES.items():
        if rule_id in out:
            out[alias] = replace(out[rule_id], name=alias)
    return out


class _Signatures(dict):
    """SIGNATURES, read from the catalogue the first time it is used."""

    def _load(self):
        if not super().__len__():
            self.update(catalogue_signatures())

    def __iter__(self):
        self._load()
        return super().__iter__()

    def __len__(self):
        self._load()
        return super().__len__()

    def __contains__(self, key):
        self._load()
        return super().__contains__(key)

    def __getitem__(self, key):
        self._load()
        return super().__getitem__(key)

    def keys(self):
        self._load()
        return super().keys()


SIGNATURES: dict[str, Signature] = _Signatures()


class ChaosError(RuntimeError):
    """An injection that cannot be done as asked (unknown node or kind, no job processes, ...)."""


@dataclass
class Injection:
    kind: str
    node: str
    ts: float = field(default_factory=time.time)
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    job_id: int | None = None
    params: dict = field(default_factory=dict)
    undone_ts: float | None = None


def xid_line(code: int) -> str:
    return f"NVRM: Xid (PCI:0000:3b:00): {code}, pid=4242, name=python, {XID_TEXT.get(code, 'Xid event')}"


def kernel_log_line(node: str, message: str, now: float | None = None, ident: str = "kernel") -> str:
    """A kernel line (or another program's) as Debian 12's rsyslog writes it: an RFC 3339 stamp to the microsecond,
    so the platform's fault time is the injection's own (a whole-second RFC 3164 stamp would be up to 1 s off)."""
    from sigma.telemetry.logformats import render

    return render(message, "rfc3339", ts=time.time() if now is None else now, host=node,
                  uptime=time.monotonic(), ident=ident) + "\n"


class Chaos:
    def __init__(self, cluster: LocalCluster):
        self.cluster = cluster
        self.journal = cluster.state_dir / "chaos.jsonl"

    # ---------- journal ----------
    def injections(self) -> list[Injection]:
        if not self.journal.exists():
            return []
        latest: dict[str, Injection] = {}
        for line in self.journal.read_text().splitlines():
            if line.strip():
                inj = Injection(**json.loads(line))
                latest[inj.id] = inj  # later lines (undo) supersede earlier ones
        return list(latest.values())

    def _record(self, inj: Injection) -> Injection:
        with self.journal.open("a") as f:
            f.write(json.dumps(asdict(inj)) + "\n")
        return inj

    def get(self, injection_id: str) -> Injection:
        for inj in self.injections():
            if inj.id == injection_id:
                return inj
        raise ChaosError(f"no injection {injection_id!r} in {self.journal}")

    # ---------- inject ----------
    def inject(self, kind: str, node: str, *, job_id: int | None = None, xid: int | None = None,
               signature: str | None = None, percent: float = 50.0, period_s: float = 1.0,
               line: str | None = None, workers: int = 1, size_mb: int = 256, objects: int = 20000) -> Injection:
        if node not in self.cluster.node_names():
            raise ChaosError(f"unknown node {node!r}; nodes: {', '.join(self.cluster.node_names())}")
        if kind == "log":
            return self._inject_log(node, xid, signature, job_id, line)
        if kind in ("hang", "straggler", "nan") + NOISE_KINDS + ("gc-pressure",):
            pids = job_pids(self.cluster, node, job_id)
            if not pids:
                raise ChaosError(f"no processes of {'job ' + str(job_id) if job_id else 'any job'} on {node}")
            if kind in NOISE_KINDS:
                return self._inject_noise(kind, node, job_id, pids, workers, size_mb, period_s, percent)
            if kind == "gc-pressure":
                return self._inject_gc(node, job_id, pids, objects)
            if kind == "hang":
                _signal_all(pids, signal.SIGSTOP)
                return self._record(Injection("hang", node, job_id=job_id, params={"pids": pids}))
            if kind == "nan":
                return self._inject_nan(node, job_id, pids)
            return self._inject_straggler(node, job_id, pids, percent, period_s)
        if kind == "node-death":
            pid = _slurmd_pid(self.cluster, node)
            if pid is None:
                raise ChaosError(f"slurmd of {node} is not running")
            os.kill(pid, signal.SIGKILL)
            return self._record(Injection("node-death", node, params={"slurmd_pid": pid}))
        raise ChaosError(f"unknown kind {kind!r}; kinds: {', '.join(KINDS)}")

    def _inject_log(self, node: str, xid: int | None, signature: str | None, job_id: int | None = None,
                    text: str | None = None) -> Injection:
        if sum(x is not None for x in (xid, signature, text)) != 1:
            raise ChaosError("a log injection needs exactly one of --xid CODE, --signature NAME or --line TEXT "
                             f"(signatures: {', '.join(sorted(SIGNATURES))})")
        if signature is not None and signature not in SIGNATURES:
            raise ChaosError(f"unknown signature {signature!r}; known: {', '.join(sorted(SIGNATURES))}")
        if text is not None and (not text.strip() or "\n" in text):
            raise ChaosError("--line must be one non-empty line of text")
        if signature is not None:
            sig = SIGNATURES[signature]
        elif xid is not None:
            sig = Signature(f"xid-{xid}", "", xid_line(xid), "kernel")
        else:  # any message, e.g. a signature no rule knows yet
            sig = Signature("line", "", text, "kernel")
        if sig.target == "job":
            job_id = job_id or self._only_job(node)
            path = Path(self.cluster.env["SIGMA_KPI_DIR"]) / f"job-{job_id}" / f"chaos.{node}.log"
            path.parent.mkdir(parents=True, exist_ok=True)
            line = sig.line + "\n"  # job output has no syslog envelope
        elif sig.target == "service":  # the emulated node's syslog ({service_log}), as rsyslog writes it
            path = self.cluster.service_log(node)
            line = kernel_log_line(node, sig.line, ident=sig.ident)
        else:
            path = self.cluster.kernel_log(node) if sig.target == "kernel" else \
                self.cluster.node_dir(node) / "dcgm-health.log"
            line = kernel_log_line(node, sig.line) if sig.target == "kernel" else \
                f"{time.strftime('%Y-%m-%d %H:%M:%S')} ERROR {sig.line}\n"
        with path.open("a") as f:
            f.write(line)
        return self._record(Injection("log", node, job_id=job_id if sig.target == "job" else None,
                                      params={"xid": xid, "signature": signature, "text": text, "rule": sig.rule_id,
                                              "path": str(path), "line": line}))

    def _only_job(self, node: str) -> int:
        jobs = {_environ(pid).get("SLURM_JOB_ID") for pid in job_pids(self.cluster, node)} - {None}
        if len(jobs) != 1:
            raise ChaosError(f"a job-output signature needs one job on {node}; found {sorted(jobs)}: pass --job")
        return int(jobs.pop())

    def _inject_nan(self, node: str, job_id: int | None, pids: list[int]) -> Injection:
        jobs = {_environ(pid).get("SLURM_JOB_ID") for pid in pids} - {None}
        if len(jobs) != 1:
            raise ChaosError(f"nan needs one job on {node}; found {sorted(jobs)}: pass --job")
        job = int(jobs.pop())
        job_dir = Path(os.environ.get("SIGMA_KPI_DIR", self.cluster.env["SIGMA_KPI_DIR"])) / f"job-{job}"
        refusal = nan_hook_missing(job_dir, job)
        if refusal:
            raise ChaosError(refusal)
        trigger = job_dir / NAN_TRIGGER
        trigger.parent.mkdir(parents=True, exist_ok=True)
        trigger.write_text(f"{time.time()}\n")
        return self._record(Injection("nan", node, job_id=job, params={"trigger": str(trigger)}))

    def _one_job(self, kind: str, node: str, pids: list[int]) -> int:
        jobs = {_environ(pid).get("SLURM_JOB_ID") for pid in pids} - {None}
        if len(jobs) != 1:
            raise ChaosError(f"{kind} needs one job on {node}; found {sorted(jobs)}: pass --job")
        return int(jobs.pop())

    def _inject_gc(self, node: str, job_id: int | None, pids: list[int], objects: int) -> Injection:
        if objects < 1:
            raise ChaosError(f"--objects must be positive, not {objects}")
        job = self._one_job("gc-pressure", node, pids)
        trigger = Path(self.cluster.env["SIGMA_KPI_DIR"]) / f"job-{job}" / f"inject-gc.{node}"  # that node's ranks
        trigger.parent.mkdir(parents=True, exist_ok=True)
        trigger.write_text(f"{objects}\n")
        return self._record(Injection("gc-pressure", node, job_id=job,
                                      params={"trigger": str(trigger), "objects": objects}))

    def _inject_noise(self, kind: str, node: str, job_id: int | None, pids: list[int], workers: int,
                      size_mb: int, period_s: float, percent: float) -> Injection:
        if workers < 1 or size_mb < 1 or period_s <= 0:
            raise ChaosError("--workers and --size-mb must be positive and --period above 0")
        job = self._one_job(kind, node, pids)
        run = lambda *args: subprocess.Popen(
            [sys.executable, "-m", "sigma.chaos.noise", kind, *map(str, args)], start_new_session=True,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid
        params: dict = {"pids": pids, "period_s": period_s}
        if kind == "cpu-hog":
            if not 0 < percent <= 100:
                raise ChaosError(f"--percent must be above 0 and at most 100, not {percent}")
            cpus = sorted(set().union(*(_affinity(p) for p in pids)))
            params.update(cpus=cpus, workers=workers, percent=percent,
                          noise_pids=[run(",".join(map(str, cpus)), percent / 100, period_s) for _ in range(workers)])
        else:
            path = self.cluster.node_dir(node) / f"chaos-{kind}.{uuid.uuid4().hex[:6]}"
            params.update(file=str(path), size_mb=size_mb, noise_pids=[run(path, size_mb, period_s, *pids)])
        return self._record(Injection(kind, node, job_id=job, params=params))

    def _inject_straggler(self, node, job_id, pids, percent, period_s) -> Injection:
        if not 0 < percent < 100:
            raise ChaosError(f"--percent must be between 0 and 100, not {percent}")
        proc = subprocess.Popen(
            [sys.executable, "-m", "sigma.chaos.inject", "--duty-cycle", str(percent / 100), str(period_s),
             *map(str, pids)], start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        return self._record(Injection("straggler", node, job_id=job_id,
                                      params={"pids": pids, "percent": percent, "period_s": period_s,
                                              "cycler_pid": proc.pid}))

    # ---------- undo ----------
    def undo(self, injection_id: str) -> Injection:
        inj = self.get(injection_id)
        if inj.undone_ts is not None:
            return inj
        if inj.kind == "log":  # the file is rewritten without the line: the sidecar never ships the others again
            log = Path(inj.params.get("path") or self.cluster.kernel_log(inj.node))
            if log.exists():
                log.write_text(log.read_text().replace(inj.params["line"], "", 1))
        elif inj.kind == "hang":
            _signal_all(inj.params["pids"], signal.SIGCONT)
        elif inj.kind == "straggler":
            _signal_all([inj.params["cycler_pid"]], signal.SIGTERM)
            # the cycler finishes its period and continues the pids itself; wait for it, or it could stop them
            # again after this returns (and a fault injected next on the same processes would be undone by it)
            _wait_gone(inj.params["cycler_pid"], timeout=2 * inj.params.get("period_s", 1.0) + 1.0)
            _signal_all(inj.params["pids"], signal.SIGCONT)
        elif inj.kind == "node-death":
            if _slurmd_pid(self.cluster, inj.node) is None:
                subprocess.run(["slurmd", "-N", inj.node], env={**os.environ, **self.cluster.env}, check=True,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               timeout=30)
        elif inj.kind in ("nan", "gc-pressure"):
            Path(inj.params["trigger"]).unlink(missing_ok=True)
        elif inj.kind in NOISE_KINDS:
            _signal_all(inj.params["noise_pids"], signal.SIGTERM)
            for pid in inj.params["noise_pids"]:
                _wait_gone(pid, timeout=10.0)
            if inj.params.get("file"):
                Path(inj.params["file"]).unlink(missing_ok=True)
        inj.undone_ts = time.time()
        return self._record(inj)


def nan_hook_missing(job_dir: Path, job: int) -> str:
    """Why `chaos nan` cannot work on this job ('' when it can): the NaN is made by the trainer's testing-only fault
    hook, which the newest start event of each rank names (`fault_hooks: ["nan"]`); a trainer without one would
    ignore the trigger and nothing would happen."""
    starts = []
    for path in sorted(job_dir.glob("rank-*.jsonl")):
        newest = None
        try:
            with path.open(encoding="utf-8", errors="replace") as f:
                for line in f:
                    if '"start"' in line:
                        with contextlib.suppress(ValueError):
                            record = json.loads(line)
                            if isinstance(record, dict) and record.get("event") == "start":
                                newest = record
        except OSError:
            continue
        if newest is not None:
            starts.append(newest)
    if any("nan" in (s.get("fault_hooks") or []) for s in starts):
        return ""
    how = ("sigma train: fault.nan_trigger=true; sigma.kpi: Run(fault_hooks=True); the integrations: "
           "SigmaCallback(fault_hooks=True)")
    if not starts:
        return (f"job {job} has no NaN fault hook: its trainer wrote no KPI start event under {job_dir} (it does not "
                f"report to the platform), so nothing would make the NaN; a trainer offers the hook with {how}")
    return (f"job {job}'s trainer has no NaN fault hook (its start event names none), so nothing would make the NaN; "
            f"start it with the testing-only hook: {how}")


# ---------- process helpers ----------

def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def _affinity(pid: int) -> set[int]:
    try:
        return os.sched_getaffinity(pid)
    except OSError:
        return set()


def job_pids(cluster: LocalCluster, node: str, job_id: int | None = None) -> list[int]:
    """Processes of SLURM jobs running on an emulated node (found by their job environment)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        env = _environ(int(proc.name))
        if (env.get("SLURMD_NODENAME") == node and "SLURM_JOB_ID" in env
                and "SLURM_SCRIPT_CONTEXT" not in env  # prolog/epilog, not the job
                and env.get("SLURM_CONF") == str(cluster.conf)
                and (job_id is None or env.get("SLURM_JOB_ID") == str(job_id))):
            try:
                if b"slurmstepd" in (proc / "cmdline").read_bytes():
                    continue
            except OSError:
                continue
            pids.append(int(proc.name))
    return sorted(pids)


def _slurmd_pid(cluster: LocalCluster, node: str) -> int | None:
    try:
        pid = int((cluster.state_dir / "run" / f"slurmd-{node}.pid").read_text().split()[0])
        os.kill(pid, 0)
        stat = Path(f"/proc/{pid}/stat").read_text()
        return None if ") Z" in stat else pid
    except (OSError, ValueError, IndexError):
        return None


def _wait_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:  # our child: reaped
                return
        except ChildProcessError:  # not our child (another process injected it)
            try:
                if ") Z" in Path(f"/proc/{pid}/stat").read_text():
                    return
            except OSError:
                return
        time.sleep(0.05)


def _signal_all(pids, sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def duty_cycle(fraction_stopped: float, period_s: float, pids: list[int]) -> None:
    """Stop pids for fraction_stopped of every period until terminated; always leave them running."""
    running = True

    def stop(*_):
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    try:
        while running and any(Path(f"/proc/{p}").exists() for p in pids):
            _signal_all(pids, signal.SIGSTOP)
            time.sleep(period_s * fraction_stopped)
            _signal_all(pids, signal.SIGCONT)
            time.sleep(period_s * (1 - fraction_stopped))
    finally:
        _signal_all(pids, signal.SIGCONT)


if __name__ == "__main__" and len(sys.argv) > 3 and sys.argv[1] == "--duty-cycle":
    duty_cycle(float(sys.argv[2]), float(sys.argv[3]), [int(p) for p in sys.argv[4:]])
