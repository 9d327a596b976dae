"""Typed controller policy (configs/controller.yaml) and remediation playbooks (configs/remediation.yaml)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sigma.config import ConfigError, _Source, load_config, load_yaml
from sigma.controller.retention import RetentionConfig
from sigma.paths import project_root


@dataclass
class BreakerConfig:
    max_nodes: int = 8  # more nodes than this with the same signature in the window: escalate, do not drain
    max_fraction: float = 0.25  # ... or more than this fraction of the cluster (at least one node may drain)
    window_s: float = 3600.0  # window the breakers count over
    wave_max_nodes: int = 16  # global limit: more nodes than this out of service in the window, whatever rule,
    # watchdog or isolation asks, and every further one is escalated to a person instead of drained
    wave_max_fraction: float = 0.5  # ... or more than this fraction of the cluster (at least one node may drain)


@dataclass
class WatchdogConfig:
    enabled: bool = True  # run the KPI watchdog
    hang_timeout_s: float = 120.0  # no step progress for this long is a hang (NCCL would wait 30 minutes)
    startup_grace_s: float = 300.0  # a job that never reported a step is not hung before this long
    recent_window_s: float = 30.0  # throughput of the last this many seconds ...
    baseline_window_s: float = 900.0  # ... against the job's own earlier throughput over this window
    drop_fraction: float = 0.2  # recent below (1 - this) x baseline is a throughput drop (a 30 % straggler is one)
    min_points: int = 5  # KPI rows needed on each side before judging throughput
    history_jobs: int = 20  # finished jobs of the same model config used as historical baseline
    crash_loop_restarts: int = 3  # a job restarted this many times ...
    crash_loop_window_s: float = 3600.0  # ... within this window is crash-looping: stop auto-requeueing it
    jitter_window_s: float = 120.0  # step throughput stability judged over this window ...
    jitter_cv: float = 0.25  # ... std above this share of the mean is jitter (notify; 0 turns it off)
    process_hang: bool = True  # a job that writes no KPI lines: judge a hang from its processes (sidecar jobprocs)


@dataclass
class IsolationConfig:
    enabled: bool = True  # look for a culprit node when a job is anomalous and no rule names one
    window_s: float = 120.0  # telemetry/KPI window scored against peers
    history_s: float = 3600.0  # each node's own healthy history for the temporal score
    min_score: float = 6.0  # combined robust z-score the top node must reach (the floor of the calibrated threshold)
    dominance: float = 1.5  # ... and exceed the runner-up by this factor
    rounds: int = 2  # consecutive rounds the same node must be the dominant outlier before acting
    budget_per_1000_node_days: float = 1.0  # false drains allowed: the action threshold is calibrated on the
    # cluster's healthy rounds to keep within it; before its history supports that, a verdict only notifies
    comparable_ratio: float = 1.0  # a metric is judged against the peers where a node's deviation from them is
    # spread less than this times its own series, else against the node's own history alone
    verify_after_s: float = 600.0  # the requeued job must recover within this long of its restart
    recover_fraction: float = 0.8  # recovered = throughput back to this fraction of the pre-fault baseline


@dataclass
class IngestConfig:
    max_connections: int = 4096  # open HTTP connections in all (one kept-alive per sidecar; size for the cluster)
    max_unauthenticated: int = 64  # connections that have not sent an authenticated request yet
    header_timeout_s: float = 10.0  # a new connection's first request must be complete within this
    idle_timeout_s: float = 75.0  # an authenticated keep-alive connection may idle this long between requests
    body_timeout_s: float = 30.0  # an authenticated request's body must arrive within this
    max_body_bytes: int = 64 * 1024 * 1024  # largest batch accepted (a full sidecar batch is under 1 MB)


@dataclass
class ControllerConfig:
    db: str = "/var/lib/sigma/controller.db"  # controller SQLite database (ingest writes, controller decides)
    rules: str = "configs/rules"  # knowledge base: a directory of rule files or one file
    rule_overrides: str = "/etc/sigma/rules.d"  # the site's changes to shipped rules (sigma.rules.overrides):
    # a directory of YAML files or one file; nothing there = none
    remediation: str = "configs/remediation.yaml"  # remediation playbooks
    listen: str = "0.0.0.0:8470"  # ingest + /metrics HTTP address (host:port; port 0 picks a free one)
    ingest_keys_file: str = "/etc/sigma/ingest-keys.json"  # per-node ingest keys (`sigma keys`); "" = none
    ingest_secret_file: str = ""  # a secret shared by all sidecars (flagged: any node can post as any other)
    log_dir: str = "/var/log/sigma"  # controller.jsonl (JSON lines) and decisions.log (one line per decision)
    poll_s: float = 1.0  # detection and remediation tick
    slurm_conf: str = ""  # SLURM_CONF for the SLURM commands; empty = the environment's
    mode: Literal["act", "observe"] = "act"  # observe: record what would be done (drains, requeues, remediation),
    # change nothing in SLURM (a first rollout; docs/rollout.md); act: do it
    act_rules: list[str] = field(default_factory=list)  # rule ids that act even in observe mode (enabled one by one)
    shadow_rules: list[str] = field(default_factory=list)  # rule ids that only observe even in act mode
    shadow: bool = False  # older spelling of mode: observe (kept so that older configs mean what they meant)
    adopt_drain_reasons: list[str] = field(default_factory=lambda: ["Prolog error", "Epilog error"])  # SLURM's
    # drains after our own prolog/epilog health checks: taken over (re-drained as sigma) when a rule confirms them
    max_action_attempts: int = 5  # a failing action is retried this many times
    snapshot_every_s: float = 10.0  # how often node states are recorded for utilisation
    jit_checkpoint_timeout_s: float = 30.0  # before a requeue, wait this long for the job's just-in-time
    # checkpoint of its current step (asked of its healthy nodes through their sidecars); 0 requeues at once
    breaker: BreakerConfig = field(default_factory=BreakerConfig)  # circuit breaker for drains
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)  # KPI watchdog
    isolation: IsolationConfig = field(default_factory=IsolationConfig)  # peer/temporal isolation
    ingest: IngestConfig = field(default_factory=IngestConfig)  # HTTP limits against abuse (docs/security.md)
    retention: RetentionConfig = field(default_factory=RetentionConfig)  # database pruning and downsampling

    def __post_init__(self):
        if self.shadow:
            self.mode = "observe"
        clash = set(self.act_rules) & set(self.shadow_rules)
        if clash:
            raise ValueError(f"rule {sorted(clash)[0]!r} is in both act_rules and shadow_rules")

    @property
    def observing(self) -> bool:
        return self.mode == "observe"

    def rule_acts(self, rule_id: str, rule_shadow: bool = False) -> bool:
        """Whether a finding of this rule may change SLURM: in act mode unless the rule is in shadow (its own
        `shadow: true` or shadow_rules); in observe mode only the rules of act_rules."""
        if rule_shadow or rule_id in self.shadow_rules:
            return False
        return not self.observing or rule_id in self.act_rules

    def mode_line(self) -> str:
        """One line saying what the controller may do, for its start line, `sigma nodes` and `sigma controller rules`."""
        if self.observing:
            acting = f"; acting rules: {', '.join(self.act_rules)}" if self.act_rules else ""
            return (f"OBSERVE mode: records what it would do (drain, requeue, remediate) and changes nothing in SLURM"
                    f"{acting}")
        shadowed = f"; observing only: {', '.join(self.shadow_rules)}" if self.shadow_rules else ""
        return f"ACT mode: drains, requeues and remediates{shadowed}"


@dataclass
class Playbook:
    name: str  # playbook name (journal and log)
    kind: Literal["reboot", "command", "ticket", "manual"]  # what remediation does
    rules: list[str] = field(default_factory=list)  # rule ids this playbook handles
    categories: list[str] = field(default_factory=list)  # rule categories this playbook handles
    command: list[str] = field(default_factory=list)  # kind command: argv ('{node}' is replaced)
    webhook: str = ""  # kind ticket: URL the evidence is POSTed to (empty: journal only)
    timeout_s: float = 900.0  # reboot/command must finish within this long, else it counts as a failure
    then: str = ""  # once this playbook's repair failed (validation, timeout), retry with that playbook instead
    # (a reboot that did not bring the node back healthy: a part for hands to replace, not another reboot)


@dataclass
class ValidationConfig:
    script: str = "sbatch/validate-node.sbatch"  # comprehensive validation job (relative to the project root)
    args: list[str] = field(default_factory=list)  # arguments after the script (e.g. --check NAME to narrow it)
    timeout_s: float = 1800.0  # validation job must finish within this long
    reservation_minutes: int = 120  # maintenance reservation length
    output_dir: str = ""  # validation job stdout directory (empty: SLURM's default)


@dataclass
class RemediationConfig:
    max_failures: int = 3  # K: failed remediation/validation cycles before escalating to admins
    escalation_webhook: str = ""  # ticket URL for escalations (empty: journal + log only)
    default_playbook: str = "manual"  # playbook for rules no entry names
    ack_kernel_log: bool = True  # after a repair, before validation, the node's sidecar acknowledges the node's
    # kernel log (`sigma health log-ack` there, asked through the ingest reply): the repaired fault's lines must
    # not fail the validation
    ack_timeout_s: float = 300.0  # ... and must answer within this long, else the repair counts as failed
    after_repair: list[str] = field(default_factory=list)  # a site's own argv, run on the head after a successful
    # repair, before validation ({sigma}, {node} replaced; [] = nothing)
    validation: ValidationConfig = field(default_factory=ValidationConfig)  # return-to-service validation
    playbooks: list[Playbook] = field(default_factory=lambda: [Playbook(name="manual", kind="manual")])  # in order

    def __post_init__(self):
        names = [p.name for p in self.playbooks]
        if self.default_playbook not in names:
            raise ValueError(f"default_playbook {self.default_playbook!r} is not one of the playbooks {names}")
        for p in self.playbooks:
            if p.then and p.then not in names:
                raise ValueError(f"playbook {p.name!r}: then {p.then!r} is not one of the playbooks {names}")

    def playbook_for(self, rule_id: str, category: str, action: str) -> Playbook:
        by_name = {p.name: p for p in self.playbooks}
        for p in self.playbooks:  # a playbook naming the rule wins
            if rule_id in p.rules:
                return p
        forced = {"drain+reboot": "reboot", "drain+ticket": "ticket"}.get(action)
        candidates = [p for p in self.playbooks if forced is None or p.kind == forced]
        for p in candidates:  # then one for the rule's category (of the kind the action demands)
            if category and category in p.categories:
                return p
        if forced:
            return candidates[0] if candidates else Playbook(name=forced, kind=forced)
        return by_name[self.default_playbook]


def resolve(path: str, base: Path | None = None) -> Path:
    """Relative paths in configs are relative to the project root (where configs/ and sbatch/ live)."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else (base or project_root()) / p


def load_controller_config(path: str | Path) -> ControllerConfig:
    return load_config(ControllerConfig, path)


def load_remediation_config(path: str | Path) -> RemediationConfig:
    return load_config(RemediationConfig, path)


def unknown_rule_ids(cfg: ControllerConfig, rcfg: RemediationConfig, rule_ids: set[str],
                     controller_path: str | Path | None = None) -> list[ConfigError]:
    """Rule ids the policy (act_rules, shadow_rules) or the playbooks (rules) name but the knowledge base lacks: a typo there
    would silently never match. Each error names the file, line and key."""
    def source(path: str | Path | None, fallback: str) -> _Source:
        if path and Path(path).exists():
            return load_yaml(path)[1]
        return _Source(fallback, "")

    out = []
    ctl_src = source(controller_path, "controller config")
    for key in ("act_rules", "shadow_rules"):
        for i, rule_id in enumerate(getattr(cfg, key)):
            if rule_id not in rule_ids:
                out.append(ConfigError(ctl_src.where((key, i)), f"no rule {rule_id!r} in the knowledge base"))
    rem_src = source(resolve(cfg.remediation) if cfg.remediation else None, cfg.remediation or "remediation")
    for i, playbook in enumerate(rcfg.playbooks):
        for j, rule_id in enumerate(playbook.rules):
            if rule_id not in rule_ids:
                out.append(ConfigError(rem_src.where(("playbooks", i, "rules", j)),
                                       f"playbook {playbook.name!r} names no rule of the knowledge base: {rule_id!r}"))
    return out
