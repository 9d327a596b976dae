"""The one interface to SLURM: queries with typed results and the actions the controller may take."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from sigma.slurm import formats
from sigma.slurm.command import DEFAULT_TIMEOUT_S, SlurmError, run
from sigma.slurm.types import SIGMA_REASON_PREFIX, AccountingRecord, Job, Node

NEXT_STATES = ("RESUME", "DOWN", "DRAIN")
REQUEUE_SETTLE_S = 1.1  # see start_now: one second of slurmctld's clock, and a margin
REQUEUE_COMPLETING_TIMEOUT_S = 60.0  # start_now waits this long for a requeue to complete (KillWait is 30 s)
NOTHING_FOUND = 9003  # sacct's "Nothing found with query" is an empty answer, not a failure


class Slurm:
    """SLURM commands against one cluster (SLURM_CONF=conf when given, else the environment's)."""

    def __init__(self, conf: str | Path | None = None, timeout: float = DEFAULT_TIMEOUT_S):
        self.env = {"SLURM_CONF": str(conf)} if conf else {}
        self.timeout = timeout
        self._requeued_at: dict[int, float] = {}
        self._family = None

    @property
    def family(self) -> formats.FamilyBase:
        """The JSON format family of this cluster's Slurm, from `scontrol --version` on first use."""
        if self._family is None:
            argv = ("scontrol", "--version")
            out = self._run(*argv)
            try:
                release = formats.parse_release(out)
            except ValueError as exc:
                raise SlurmError(argv, 0, str(exc)) from None
            self._family = formats.family_for(release, argv)
        return self._family

    @property
    def version(self) -> str:
        """This cluster's Slurm release as its clients report it, e.g. 24.11.5."""
        return self.family.release

    def _run(self, *argv: str, timeout: float | None = None, input: str | None = None) -> str:
        return run(argv, env=self.env, timeout=timeout or self.timeout, input=input).stdout

    def _json(self, argv: Sequence[str], key: str):
        """Run a --json query; return its records under key, each with where it came from."""
        out = self._run(*argv)
        try:
            data = json.loads(out)
        except json.JSONDecodeError as exc:
            raise SlurmError(argv, 0, f"unparsable JSON ({exc}): {out[:200]!r}") from None
        if not isinstance(data, dict):
            raise SlurmError(argv, 0, f"JSON that is not an object: {out[:200]!r}")
        errors = [e for e in data.get("errors") or () if e.get("error_number") != NOTHING_FOUND]
        if errors:
            raise SlurmError(argv, 0, f"SLURM reported errors: {errors}")
        family = self.family
        return family.top(data, family.source(argv, data), key)

    # ---------- queries ----------
    def nodes(self) -> list[Node]:
        family = self.family
        return [family.node(r) for r in self._json(family.nodes_argv, "nodes")]

    def node(self, name: str) -> Node:
        for n in self.nodes():
            if n.name == name:
                return n
        raise SlurmError(self.family.nodes_argv, 0, f"no node named {name!r}")

    def jobs(self, job_ids: Iterable[int] = ()) -> list[Job]:
        """Jobs slurmctld still knows, finished ones included (until MinJobAge), optionally only job_ids."""
        wanted = {int(j) for j in job_ids}
        family = self.family
        jobs = [family.job(r) for r in self._json(family.jobs_argv, "jobs")]
        return [j for j in jobs if not wanted or j.job_id in wanted]

    def job(self, job_id: int) -> Job | None:
        found = self.jobs([job_id])
        return found[0] if found else None

    def accounting(self, job_ids: Iterable[int] = (), since: str | None = None,
                   duplicates: bool = False) -> list[AccountingRecord]:
        argv = list(self.family.accounting_argv)
        ids = ",".join(str(j) for j in job_ids)
        if ids:
            argv += ["-j", ids]
        if since:
            argv += ["--starttime", since]
        if duplicates:
            argv.append("--duplicates")
        records = self._json(argv, "jobs")
        text_argv = self.family.exit_codes_argv(argv)
        return self.family.runs(records, self._run(*text_argv) if text_argv else None)

    # ---------- node actions ----------
    def drain(self, nodes: Sequence[str], reason: str) -> None:
        """Drain with a reason that always starts with 'sigma:' so we can tell our drains from an admin's."""
        self._update_nodes(nodes, "State=DRAIN", f"Reason={sigma_reason(reason)}")

    def resume(self, nodes: Sequence[str], *, force: bool = False) -> None:
        """Resume nodes we drained or set down (idempotent: available nodes are skipped).

        Refuses a node whose reason an admin set, unless force=True: never undo somebody else's drain.
        """
        current = {n.name: n for n in self.nodes()}
        unknown = [n for n in nodes if n not in current]
        if unknown:
            raise SlurmError(["scontrol", "update", "State=RESUME"], 0, f"no such nodes: {unknown}")
        foreign = [n for n in nodes if current[n].reason and not current[n].drained_by_sigma]
        if foreign and not force:
            raise SlurmError(["scontrol", "update", "State=RESUME"], 0,
                             f"refusing to resume {foreign}: their drain reason was not set by sigma")
        todo = [n for n in nodes if current[n].drained or current[n].state == "down"]
        if todo:
            self._update_nodes(todo, "State=RESUME")

    def set_down(self, nodes: Sequence[str], reason: str) -> None:
        """`scontrol update State=DOWN`: what slurmctld does to a silent node after SlurmdTimeout. It ends the job
        steps still on the node at once (a requeued job left COMPLETING there can start elsewhere). A DRAIN flag
        set before stays (checked on Slurm 22.05): when slurmd registers again the node is drained, not in service,
        whatever ReturnToService says."""
        self._update_nodes(nodes, "State=DOWN", f"Reason={sigma_reason(reason)}")

    def reboot(self, nodes: Sequence[str], *, next_state: str = "DOWN", reason: str = "", asap: bool = True) -> None:
        """`scontrol reboot [ASAP] nextstate=... reason=... NODES`: reboot once idle, then enter next_state."""
        if next_state.upper() not in NEXT_STATES:
            raise ValueError(f"next_state must be one of {NEXT_STATES}, not {next_state!r}")
        argv = ["scontrol", "reboot"] + (["ASAP"] if asap else []) + [f"nextstate={next_state.upper()}"]
        if reason:
            argv.append(f"reason={sigma_reason(reason)}")
        self._run(*argv, ",".join(nodes))

    def _update_nodes(self, nodes: Sequence[str], *settings: str) -> None:
        if not nodes:
            raise ValueError("no nodes given")
        self._run("scontrol", "update", f"NodeName={','.join(nodes)}", *settings)

    # ---------- job actions ----------
    def submit(self, script: str | Path, *sbatch_args: str, wrap: str | None = None,
               script_args: Sequence[str] = ()) -> int:
        """sbatch a script file (with script_args after it) or --wrap a command; return the job id."""
        argv = ["sbatch", "--parsable", *sbatch_args]
        argv += ["--wrap", wrap] if wrap is not None else [str(script), *script_args]
        out = self._run(*argv).strip()
        match = re.match(r"^(\d+)", out)
        if not match:
            raise SlurmError(argv, 0, f"sbatch printed no job id: {out!r}")
        return int(match.group(1))

    def requeue(self, job_id: int, *, hold: bool = False) -> None:
        self._run("scontrol", "requeuehold" if hold else "requeue", str(job_id))
        self._requeued_at[int(job_id)] = time.time()

    def release(self, job_id: int) -> None:
        self._run("scontrol", "release", str(job_id))

    def start_now(self, job_id: int, requeued_at: float | None = None,
                  completing_timeout: float = REQUEUE_COMPLETING_TIMEOUT_S) -> None:
        """Clear the ~2-minute BeginTime SLURM puts on a requeued job so it can start at once.

        Only once the requeue has completed: while the old run's processes end, the job is pending and COMPLETING
        (["PENDING", "COMPLETING"] from 23.02 on, COMPLETING in 22.05), and when they have ended slurmctld sets the
        BeginTime anew, undoing a StartTime=now given before (reported on 24.11 and 26.05: 161 s to the first
        step instead of 12 s). So wait, up to completing_timeout, until the job is no longer COMPLETING.

        slurmd revokes the previous run's credential with one-second resolution; a relaunch whose credential is
        created in the same second as the revocation is killed ("Job credential revoked") and the job is lost.
        Both times are slurmctld's `time(NULL)`: the revocation time is stamped on the kill message it builds while
        handling the requeue, the credential's on its creation at the relaunch. So once a full second has passed
        since the requeue returned, a relaunch's credential is of a later second, whatever the clocks of this host
        and the nodes say: never start sooner than REQUEUE_SETTLE_S after the requeue (known from requeue() or
        requeued_at). A job requeued by someone else (submitit's timeout hook, a failed prolog) was requeued before
        its caller saw it pending, so waiting REQUEUE_SETTLE_S from now is enough.
        """
        requeued_at = requeued_at or self._requeued_at.get(int(job_id)) or time.time()
        deadline = time.monotonic() + completing_timeout
        while (job := self.job(job_id)) is not None and job.state == "COMPLETING":
            if time.monotonic() > deadline:
                raise SlurmError(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], 0,
                                 f"job {job_id} still COMPLETING after {completing_timeout:.0f} s: its requeue has not "
                                 f"finished, and a BeginTime cleared now would be set again when it does")
            time.sleep(0.2)
        time.sleep(max(0.0, requeued_at + REQUEUE_SETTLE_S - time.time()))
        self._run("scontrol", "update", f"JobId={job_id}", "StartTime=now")

    def cancel(self, job_id: int, signal: str | None = None) -> None:
        self._run("scancel", *([f"--signal={signal}"] if signal else []), str(job_id))

    # ---------- reservations ----------
    def create_reservation(self, name: str, nodes: Sequence[str], *, duration_min: int = 60,
                           users: str = "root", flags: str = "MAINT,IGNORE_JOBS") -> None:
        self._run("scontrol", "create", "reservation", f"ReservationName={name}", "StartTime=now",
                  f"Duration={duration_min}", f"Nodes={','.join(nodes)}", f"Users={users}", f"Flags={flags}")

    def delete_reservation(self, name: str) -> None:
        self._run("scontrol", "delete", f"ReservationName={name}")

    def reservations(self) -> list[str]:
        out = self._run("scontrol", "-o", "show", "reservation")
        return re.findall(r"ReservationName=(\S+)", out)


def sigma_reason(reason: str) -> str:
    reason = " ".join(reason.split())
    return reason if reason.startswith(SIGMA_REASON_PREFIX) else f"{SIGMA_REASON_PREFIX} {reason}"
