"""`sigma site check`: what this host still lacks to run its part of sigma, each with what to do about it.

A node needs the installed tool, its configs, its key, the sidecar unit, a readable kernel-log source, slurm.conf's
lines and a controller it can reach; the head needs the tool, the controller's configs and rules, the key table,
the controller unit, cron and SLURM. Nothing here changes the host; the network is only asked (GET /healthz).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from sigma.paths import BIN, ETC, project_root
from sigma.site.generate import CRON_FILE, KEY_TABLE, NODE_KEY, UNIT_DIR

OK, MISSING, WRONG, NOTE = "ok", "MISSING", "WRONG", "note"


@dataclass
class Finding:
    status: str  # ok, MISSING, WRONG (present but unusable), note (said, not a failure)
    what: str
    detail: str

    @property
    def failed(self) -> bool:
        return self.status in (MISSING, WRONG)


class Host:
    """The host's files under root (/ normally; a node image or a mounted node root otherwise)."""

    def __init__(self, root: str | Path = "/"):
        self.root = Path(root)

    def path(self, absolute: Path | str) -> Path:
        return self.root / Path(absolute).relative_to("/")


def role(host: Host) -> str:
    """head when the controller's config is installed, else node."""
    return "head" if host.path(ETC / "controller.yaml").exists() else "node"


def check(host: Host, which: str, node: str | None = None, timeout_s: float = 3.0) -> list[Finding]:
    node = node or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    out = [installed(host)]
    if which == "head":
        out += head_configs(host)
        out.append(unit(host, "sigma-controller.service"))
        out.append(cron(host))
        out.append(slurm_reachable())
    else:
        telemetry, findings = node_configs(host, node)
        out += findings
        out.append(node_key(host, node))
        out.append(unit(host, "sigma-sidecar.service"))
        out.append(kernel_log_source(host, telemetry))
        out.append(controller_reachable(telemetry, timeout_s))
    out.append(slurm_conf(host))
    return out


def installed(host: Host) -> Finding:
    binary = host.path(BIN)
    if not os.access(binary, os.X_OK):
        return Finding(MISSING, "sigma", f"{BIN} not found: install the wheel into {BIN.parent.parent} "
                                         f"(docs/deploy.md, Install)")
    hooks = [h for h in ("sigma-prolog", "sigma-epilog") if not os.access(binary.parent / h, os.X_OK)]
    if hooks:
        return Finding(WRONG, "sigma", f"{', '.join(hooks)} missing beside {BIN}: reinstall the wheel")
    return Finding(OK, "sigma", f"{BIN}, sigma-prolog and sigma-epilog beside it; the shipped files this sigma "
                                f"runs with: {project_root()}")


def _load(what: str, path: Path, loader) -> tuple[object | None, Finding]:
    if not path.exists():
        return None, Finding(MISSING, what, f"{path} not found: it comes with `sigma site init`'s files "
                                            f"(docs/deploy.md)")
    try:
        return loader(path), Finding(OK, what, str(path))
    except (ValueError, OSError) as exc:  # ConfigError is a ValueError and names file:line [key]
        return None, Finding(WRONG, what, str(exc))


def node_configs(host: Host, node: str) -> tuple[object | None, list[Finding]]:
    from sigma.health.config import load_health_config
    from sigma.telemetry.config import load

    loaded, telemetry = _load("telemetry config", host.path(ETC / "telemetry.yaml"), lambda p: load(p, node=node))
    if loaded is not None:
        telemetry.detail += f" (node {node}, pushes to {loaded.config.push.url})"
    health, found = _load("health config", host.path(ETC / "health.yaml"), load_health_config)
    if health is not None:
        profile = health.profile(node)
        named = any(node in _expand(p.pattern) for p in health.nodes)
        found = Finding(OK if named else WRONG, "health config",
                        f"{found.detail}: {node} is type {profile.type}, {profile.gpus or 0} accelerator(s)" if named
                        else f"{found.detail}: no pattern of `nodes` names {node}; add it to the hostlist")
    return loaded, [telemetry, found]


def _expand(pattern: str) -> list[str]:
    from sigma.slurm.types import expand_hostlist

    return expand_hostlist(pattern)


def node_key(host: Host, node: str) -> Finding:
    from sigma.security.keys import KeyFileError, read_node_key

    path = host.path(NODE_KEY)
    try:
        key = read_node_key(path)
    except KeyFileError as exc:
        status = MISSING if not path.exists() else WRONG
        return Finding(status, "ingest key", f"{exc}: unpack this node's bundle (`tar -xpf {node}.tar -C /`)")
    if key.key_id is None:
        return Finding(NOTE, "ingest key", f"{path} is a shared secret: any node holding it can post as any other")
    if not key.key_id.startswith(f"{node}-"):
        return Finding(WRONG, "ingest key", f"{path} holds key {key.key_id}, another node's: install {node}'s own")
    return Finding(OK, "ingest key", f"{path}: key {key.key_id}")


def unit(host: Host, name: str) -> Finding:
    path = host.path(UNIT_DIR / name)
    if not path.exists():
        return Finding(MISSING, name, f"{UNIT_DIR / name} not found")
    starts = [line for line in path.read_text().splitlines() if line.startswith("ExecStart=")]
    if not starts or not starts[0].startswith(f"ExecStart={BIN} "):
        return Finding(WRONG, name, f"{UNIT_DIR / name} does not start {BIN}: {starts[0] if starts else 'no ExecStart'}")
    state = _systemd_state(name) if host.root == Path("/") else ""
    return Finding(OK if state in ("", "active") else WRONG, name,
                   f"{UNIT_DIR / name}" + (f"; systemd: {state}" if state else "; systemd not asked (not running)")
                   + ("" if state in ("", "active") else f": systemctl enable --now {name}"))


def _systemd_state(name: str) -> str:
    if not Path("/run/systemd/system").is_dir() or not shutil.which("systemctl"):
        return ""
    proc = subprocess.run(["systemctl", "is-active", name], capture_output=True, text=True, timeout=10)
    return proc.stdout.strip() or "unknown"


def cron(host: Host) -> Finding:
    path = host.path(CRON_FILE)
    if not path.exists():
        return Finding(MISSING, "cron", f"{CRON_FILE} not found (nightly `sigma rules learn`)")
    return Finding(OK, "cron", f"{CRON_FILE}")


def kernel_log_source(host: Host, telemetry) -> Finding:
    """The kernel log the sidecar would read now: a node where none can be read misses its kernel's faults."""
    from sigma.telemetry.logsources import choose_now

    if telemetry is None:
        return Finding(NOTE, "kernel log", "not judged: the telemetry config does not load")
    for section, (kind, params) in telemetry.collectors.items():
        if kind == "logtail" and params.enabled and params.source != "files" and params.log_name == "kernel":
            found = choose_now(params, str(host.root))
            if not found.kind:
                return Finding(MISSING, "kernel log", f"{section}: none can be read ({found.why_none()}): kernel "
                                                      f"faults (Xid, ECC, link down) would go unseen")
            return Finding(OK, "kernel log", f"{section}: {found.describe()}")
    return Finding(NOTE, "kernel log", "no collector chooses the kernel log (source: auto) in telemetry.yaml")


def controller_reachable(telemetry, timeout_s: float) -> Finding:
    if telemetry is None:
        return Finding(NOTE, "controller", "not asked: the telemetry config does not load")
    url = telemetry.config.push.url
    if not url:
        return Finding(WRONG, "controller", "push.url is empty: the sidecar would push nowhere")
    probe = url.split("/v1/", 1)[0] + "/healthz"
    try:
        with urllib.request.urlopen(probe, timeout=timeout_s) as reply:
            ok = json.loads(reply.read() or b"{}").get("ok") is True
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return Finding(MISSING, "controller", f"{probe} does not answer: {getattr(exc, 'reason', exc)}")
    return Finding(OK if ok else WRONG, "controller", f"{probe} answers" if ok else f"{probe}: not sigma's answer")


def head_configs(host: Host) -> list[Finding]:
    from sigma.controller.config import load_controller_config, load_remediation_config, resolve, unknown_rule_ids
    from sigma.rules.loader import load_rules
    from sigma.security.keys import KeyTable

    cfg, ctl = _load("controller config", host.path(ETC / "controller.yaml"), load_controller_config)
    out = [ctl]
    if cfg is None:
        return out
    mode = "observe mode: records what it would do" if cfg.observing else "acting"
    ctl.detail += f" ({mode}; listens on {cfg.listen})"
    rcfg, rem = _load("playbooks", host.path(resolve(cfg.remediation)), load_remediation_config)
    rules, kb = _load("rules", host.path(resolve(cfg.rules)), load_rules)
    if rules is not None:
        kb.detail += f": {len(rules)} rules"
        if rcfg is not None:
            problems = unknown_rule_ids(cfg, rcfg, {r.id for r in rules}, host.path(ETC / "controller.yaml"))
            if problems:
                kb = Finding(WRONG, "rules", "; ".join(str(p) for p in problems))
    table, keys = _load("key table", host.path(cfg.ingest_keys_file or KEY_TABLE), lambda p: KeyTable(p).load())
    if table is not None:
        keys.detail += f": keys for {len({k.node for k in table.keys})} node(s)"
    return out + [rem, kb, keys]


def slurm_reachable() -> Finding:
    from sigma.slurm.client import Slurm
    from sigma.slurm.command import SlurmError

    try:
        nodes = Slurm().nodes()
    except (SlurmError, OSError) as exc:
        said = (getattr(exc, "stderr", "") or str(exc)).strip().splitlines()
        return Finding(MISSING, "SLURM", f"the SLURM commands do not answer here: {said[-1] if said else exc}")
    return Finding(OK, "SLURM", f"{len(nodes)} node(s) known to slurmctld")


# slurm.conf keys sigma needs (docs/deploy.md, slurm.conf), with how to tell them right
SLURM_LINES = {
    "prolog": lambda v: v == str(BIN.parent / "sigma-prolog"),
    "epilog": lambda v: v == str(BIN.parent / "sigma-epilog"),
    "schedulerparameters": lambda v: "nohold_on_prolog_fail" in v.split(","),
    "jobrequeue": lambda v: v == "1",
    "rebootprogram": bool,
}


def slurm_conf(host: Host) -> Finding:
    """slurm.conf as this host reads it: $SLURM_CONF or /etc/slurm/slurm.conf, else slurmd's configless cache."""
    candidates = [os.environ.get("SLURM_CONF", ""), "/etc/slurm/slurm.conf", "/run/slurm/conf/slurm.conf",
                  "/var/spool/slurmd/conf-cache/slurm.conf"]
    path = next((host.path(c) for c in candidates if c and host.path(c).exists()), None)
    if path is None:
        return Finding(MISSING, "slurm.conf", "no slurm.conf here (looked at $SLURM_CONF, /etc/slurm, slurmd's "
                                              "configless cache)")
    values = read_slurm_conf(path)
    wrong = [f"{key}={values.get(key, '(unset)')}" for key, right in SLURM_LINES.items()
             if not right(values.get(key, ""))]
    if wrong:
        return Finding(WRONG, "slurm.conf", f"{path}: {'; '.join(wrong)}: add `sigma site init`'s slurm.conf lines")
    return Finding(OK, "slurm.conf", f"{path}: Prolog, Epilog, nohold_on_prolog_fail, JobRequeue, RebootProgram")


def read_slurm_conf(path: Path, depth: int = 0) -> dict[str, str]:
    """key (lower case) -> value of slurm.conf's single-valued lines, following Include lines."""
    values: dict[str, str] = {}
    for line in path.read_text(errors="replace").splitlines():
        line = line.split("#", 1)[0].strip()
        if line.lower().startswith("include ") and depth < 8:
            included = Path(line.split(None, 1)[1])
            included = included if included.is_absolute() else path.parent / included
            if included.exists():
                values.update(read_slurm_conf(included, depth + 1))
            continue
        key, sep, value = line.partition("=")
        if sep and " " not in key.strip():
            values[key.strip().lower()] = value.split()[0] if value.split() else ""
    return values
