"""`sigma stack up|down|status`: the whole platform on the local cluster — SLURM, the controller, one sidecar per node.

The controller and the sidecars run as background processes with pid files and logs under the cluster's state
directory, configured exactly as an admin would configure them (a generated controller.yaml, the shipped
telemetry.yaml with per-node placeholders, a key per node from the same code as `sigma keys issue`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

from sigma.cli import CommandError
from sigma.paths import configs_dir, project_root
from sigma.slurm.cluster import ClusterError, LocalCluster, _pid_alive, _read_pid, _stop_pid

CONTROLLER_PORT_OFFSET = 5  # controller listens on port_base + 5


class Stack:
    def __init__(self, cluster: LocalCluster):
        self.cluster = cluster
        self.state = cluster.state_dir
        self.keys_table = self.state / "etc" / "ingest-keys.json"
        self.keys_dir = self.state / "etc" / "keys"
        self.controller_config = self.state / "etc" / "controller.yaml"

    @property
    def controller_url(self) -> str:
        spec = self.cluster.load_spec()
        return f"http://127.0.0.1:{spec.port_base + CONTROLLER_PORT_OFFSET}"

    @property
    def db(self) -> Path:
        return self.state / "controller.db"

    def processes(self) -> list[str]:
        return ["controller"] + [f"sidecar-{n}" for n in self.cluster.node_names()]

    def up(self, *, hang_timeout_s: float | None = None, settings: dict[str, object] | None = None,
           timeout: float = 60.0) -> str:
        """settings: controller config overrides, "section.key" -> value (e.g. "watchdog.recent_window_s": 30).
        Every setting is checked before anything is written. On a running controller the settings are applied to
        its config and it reloads (SIGHUP); what it answers is returned ("" when nothing was running)."""
        overrides = dict(settings or {})
        if hang_timeout_s is not None:
            overrides["watchdog.hang_timeout_s"] = hang_timeout_s
        if self.status().get("controller"):
            return self._reload(overrides, timeout)
        _check(_apply(yaml.safe_load((configs_dir() / "controller.yaml").read_text()), overrides))  # before any start
        self.cluster.up()
        self.provision_keys()
        self._write_controller_config(self._controller_config(overrides))
        self._check_controller_port()
        env = {**os.environ, **self.cluster.env}
        self._start("controller", [sys.executable, "-m", "sigma.cli", "controller", "run",
                                   "--config", str(self.controller_config)], env)
        self._wait_http(f"{self.controller_url}/healthz", timeout)
        for node in self.cluster.node_names():
            self._start(f"sidecar-{node}", [
                sys.executable, "-m", "sigma.cli", "sidecar", "--config", str(configs_dir() / "telemetry.yaml"),
                "--node", node, "--controller", f"{self.controller_url}/v1/ingest",
                "--secret-file", str(self.node_key(node))], env)
        return ""

    def _reload(self, overrides: dict[str, object], timeout: float) -> str:
        """--set on a running platform: the controller's config changes and it reloads, or nothing changes."""
        from sigma.controller.loop import RESTART_KEYS

        if not overrides:
            return "already running; nothing to change"
        current = yaml.safe_load(self.controller_config.read_text()) or {}
        config = _apply(current, overrides)
        restart = sorted({k.split(".")[0] for k in overrides} & set(RESTART_KEYS))
        if restart:
            raise ClusterError(f"--set {', '.join(restart)} needs a restart of the controller, not a reload: "
                               f"`sigma stack down`, then `sigma stack up --set ...`; nothing changed")
        self._write_controller_config(config)
        log = self.state / "log" / "controller.jsonl"
        seen = log.stat().st_size if log.exists() else 0
        os.kill(_read_pid(self._pid_file("controller")), signal.SIGHUP)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if log.exists() and log.stat().st_size > seen:
                with open(log) as f:
                    f.seek(seen)
                    for line in f:
                        try:
                            record = json.loads(line)
                        except ValueError:
                            continue
                        if record.get("event") == "reload":
                            if record.get("result") != "applied":
                                raise ClusterError(f"the controller kept its running config: {record.get('msg')}")
                            return record.get("msg", "reloaded")
            time.sleep(0.2)
        raise ClusterError(f"the controller did not answer the reload within {timeout:.0f}s; "
                           f"see {self.state}/log/controller.out")

    def node_key(self, node: str) -> Path:
        return self.keys_dir / f"{node}.key"

    def provision_keys(self) -> None:
        """A key per node (kept across `up`), as an admin would with `sigma keys issue`."""
        from sigma.security.keys import KeyTable, node_key_text, write_private

        table = KeyTable(self.keys_table).load(missing_ok=True)
        new = []
        for node in self.cluster.node_names():
            if table.for_node(node) and self.node_key(node).exists():
                continue
            if table.for_node(node):  # its key file is gone: a fresh key, the old one revoked
                table.revoke(node)
            new.append(table.issue(node))
        if new:
            table.save()
            for key in new:
                write_private(self.node_key(key.node), node_key_text(key))

    def down(self) -> list[str]:
        stopped = [name for name in reversed(self.processes())
                   if _stop_pid(_read_pid(self._pid_file(name)), "sigma")]
        return stopped

    def status(self) -> dict[str, bool]:
        return {name: _pid_alive(_read_pid(self._pid_file(name)), "sigma") for name in self.processes()}

    def _pid_file(self, name: str) -> Path:
        return self.state / "run" / f"{name}.pid"

    def _controller_config(self, overrides: dict[str, object]) -> dict:
        """The shipped controller config with the stack's own paths and ports, and the overrides."""
        config = yaml.safe_load((configs_dir() / "controller.yaml").read_text())
        spec = self.cluster.load_spec()
        root = project_root()
        config.update(
            db=str(self.db), listen=f"127.0.0.1:{spec.port_base + CONTROLLER_PORT_OFFSET}",
            ingest_keys_file=str(self.keys_table), ingest_secret_file="", log_dir=str(self.state / "log"),
            slurm_conf=str(self.cluster.conf),
            rules=str(root / config.get("rules", "configs/rules")),
            remediation=str(self._write_remediation_config(root / config.get("remediation",
                                                                              "configs/remediation.yaml"))),
        )
        # Four emulated nodes and faults injected minutes apart: a breaker sized for a real cluster (a quarter of
        # the nodes per hour) would stop every second drain here.
        config.setdefault("breaker", {}).update(max_fraction=0.5, window_s=120)
        return _apply(config, overrides)

    def _write_controller_config(self, config: dict) -> None:
        """Checked first, written whole: a bad value is refused naming its key, and the file stays as it was."""
        text = "# generated by `sigma stack up` from configs/controller.yaml\n" + yaml.safe_dump(config, sort_keys=False)
        cfg = _check(config, text)
        tmp = self.controller_config.with_suffix(".yaml.new")
        tmp.write_text(text)
        os.replace(tmp, self.controller_config)
        self._write_health_config(cfg.mode)

    def _write_health_config(self, mode: str) -> None:
        """Observe mode reaches the local cluster's prolog and epilog too (warn only: exit 0, nothing drained)
        through <state>/etc/health.yaml, which `sigma health` reads on the local cluster; act mode removes it."""
        path = self.state / "etc" / "health.yaml"
        if mode != "observe":
            path.unlink(missing_ok=True)
            return
        health = yaml.safe_load((configs_dir() / "health.yaml").read_text())
        for hook in ("prolog", "epilog"):
            health.setdefault(hook, {})["mode"] = "observe"
        path.write_text("# generated by `sigma stack up`: the controller runs in observe mode\n"
                        + yaml.safe_dump(health, sort_keys=False))

    def _check_controller_port(self) -> None:
        """Refuse to start when another checkout's controller holds our port: its /healthz would answer for ours."""
        from sigma.slurm.cluster import _port_free, port_owner

        port = self.cluster.load_spec().port_base + CONTROLLER_PORT_OFFSET
        if not _pid_alive(_read_pid(self._pid_file("controller")), "sigma") and not _port_free(port):
            owner = port_owner(port)
            raise ClusterError(f"controller port {port} is in use"
                               + (f" by the stack under {owner} (`sigma stack down --state-dir {owner}`)"
                                  if owner else " by another program")
                               + "; or bring the cluster up on other ports with `sigma cluster up --port-base N`")

    def _write_remediation_config(self, shipped: Path) -> Path:
        """The shipped playbooks, with validation job logs kept in the state directory."""
        playbooks = yaml.safe_load(shipped.read_text())
        playbooks.setdefault("validation", {})["output_dir"] = str(self.state / "log")
        path = self.state / "etc" / "remediation.yaml"
        path.write_text(f"# generated by `sigma stack up` from {shipped}\n" + yaml.safe_dump(playbooks, sort_keys=False))
        return path

    def _start(self, name: str, argv: list[str], env: dict) -> None:
        if _pid_alive(_read_pid(self._pid_file(name)), "sigma"):
            return
        with open(self.state / "log" / f"{name}.out", "ab") as log:
            proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, cwd=project_root())
        self._pid_file(name).write_text(f"{proc.pid}\n")
        time.sleep(0.2)
        if proc.poll() is not None:
            raise ClusterError(f"{name} exited at start ({proc.returncode}); see {self.state}/log/{name}.out")

    def _wait_http(self, url: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        raise ClusterError(f"controller did not answer {url} within {timeout:.0f}s; "
                           f"see {self.state}/log/controller.out")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stack", help="run the whole platform on the local cluster (controller + sidecars)",
                       description=__doc__.splitlines()[0])
    p.add_argument("action", choices=("up", "down", "status"))
    p.add_argument("--state-dir", type=Path, default=None, help="cluster state directory")
    p.add_argument("--hang-timeout", type=float, default=None, help="controller watchdog hang timeout (s)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", dest="settings",
                   help="up: override a controller setting, e.g. --set mode=observe (repeatable); checked before "
                        "anything is written; on a running platform the controller reloads with it")
    p.add_argument("--with-cluster", action="store_true", help="down: also stop the SLURM cluster")
    p.set_defaults(func=_run)


def _check(config: dict, text: str | None = None):
    """The controller config these settings make, or a ClusterError naming the bad key (nothing is written)."""
    from sigma.config import ConfigError, _Source, from_dict
    from sigma.controller.config import ControllerConfig

    text = text or yaml.safe_dump(config, sort_keys=False)
    try:
        return from_dict(ControllerConfig, config, _Source("sigma stack up --set", text))
    except ConfigError as exc:
        raise ClusterError(f"{exc}; nothing written, nothing started or changed") from None


def _apply(config: dict, overrides: dict[str, object]) -> dict:
    for dotted, value in overrides.items():
        *sections, key = dotted.split(".")
        node = config
        for section in sections:
            node = node.setdefault(section, {})
            if not isinstance(node, dict):
                raise ClusterError(f"--set {dotted}: {section!r} is not a section; nothing written")
        node[key] = value
    return config


def _settings(pairs: list[str]) -> dict[str, object]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CommandError(f"--set {pair!r}: expected SECTION.KEY=VALUE, e.g. watchdog.recent_window_s=30")
        out[key] = yaml.safe_load(value)
    return out


def _run(args) -> int:
    stack = Stack(LocalCluster(args.state_dir))
    if args.action == "up":
        reloaded = stack.up(hang_timeout_s=args.hang_timeout, settings=_settings(args.settings))
        if reloaded:
            print(f"controller already running: {reloaded}")
            return 0
        print(f"controller on {stack.controller_url} (database {stack.db}), sidecars on "
              f"{', '.join(stack.cluster.node_names())}; logs in {stack.state / 'log'}")
        print("tail the controller's decisions with:\n  tail -f " + str(stack.state / "log" / "decisions.log"))
    elif args.action == "down":
        stopped = stack.down()
        if args.with_cluster:
            stopped += stack.cluster.down()
        print(f"stopped: {', '.join(stopped) if stopped else 'nothing was running'}")
    else:
        for name, alive in stack.status().items():
            print(f"  {name:16} {'running' if alive else 'stopped'}")
    return 0

