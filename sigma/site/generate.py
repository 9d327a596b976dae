"""`sigma site init`: a site's files from a few answers, laid out as they go onto the hosts (docs/deploy.md).

    OUT/site.yaml                     the answers (run init again with more nodes: existing keys are kept)
    OUT/head/...                      copy onto the head node as it is: `cp -a OUT/head/. /`
        etc/sigma/controller.yaml, remediation.yaml, learn.yaml, rules/   the shipped files with the site's values
        etc/sigma/ingest-keys.json, keys/<node>.key                       the key table and each node's key (0600)
        etc/systemd/system/sigma-controller.service, etc/cron.d/sigma
    OUT/node/...                      what every node gets (for review):
        etc/sigma/telemetry.yaml (push.url: the controller), health.yaml (the nodes' hardware),
        etc/systemd/system/sigma-sidecar.service
    OUT/nodes/<node>.tar              one bundle per node, unpacked on that node (`tar -xpf <node>.tar -C /`):
        node/'s files and etc/sigma/ingest.secret, the node's own key (0600)
    OUT/slurm.conf                    the lines the site's slurm.conf needs
"""

from __future__ import annotations

import io
import shutil
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from sigma import __version__
from sigma.paths import BIN, ETC, LOG_DIR, VAR_LIB, project_root
from sigma.security.keys import KeyTable, node_key_text, read_private, write_private
from sigma.site.yamledit import set_values
from sigma.slurm.types import expand_hostlist

NODE_KEY = ETC / "ingest.secret"  # telemetry.yaml's push.secret_file
KEY_TABLE = ETC / "ingest-keys.json"
HEAD_KEYS = ETC / "keys"
UNIT_DIR = Path("/etc/systemd/system")
CRON_FILE = Path("/etc/cron.d/sigma")


@dataclass
class Answers:
    controller: str  # host name (or address) of the head node the sidecars push to
    nodes: str  # the compute nodes, a SLURM hostlist (gpu[001-064])
    gpus: int  # accelerators per node (0: none; NVML is then not required)
    port: int = 8470  # the controller's ingest and /metrics port
    observe: bool = True  # first rollout: the controller, prolog and epilog record what they would do and
    # change nothing in SLURM (docs/rollout.md)

    def __post_init__(self):
        if not self.controller or any(c.isspace() or c in "/:@" for c in self.controller):
            raise ValueError(f"controller {self.controller!r}: give the head node's host name or address")
        self.node_names = expand_hostlist(self.nodes)  # ValueError naming a malformed hostlist
        if not self.node_names:
            raise ValueError("nodes: the hostlist names no node")
        if self.gpus < 0 or not 0 < self.port < 65536:
            raise ValueError(f"gpus {self.gpus}, port {self.port}: out of range")

    @property
    def mode(self) -> str:
        return "observe" if self.observe else "act"

    @property
    def url(self) -> str:
        return f"http://{self.controller}:{self.port}/v1/ingest"


def generate(answers: Answers, out: Path) -> list[str]:
    """Write (or refresh) the site's files under out; return what was done, one line each.

    A config the site already has under out keeps its edits: only the answers' values are set in it again (the
    controller's URL, its port). Written the first time from the shipped file, it also gets the site's paths and
    the first rollout's observe mode, which the admins change later by hand."""
    head, node = out / "head", out / "node"
    etc = head / ETC.relative_to("/")
    header = f"# {{}} for this site: the shipped file of sigma {__version__} with the site's values " \
             f"(sigma site init, {time.strftime('%Y-%m-%d')}).\n"
    configs = {  # path -> (what it is, values set every time, values set only in a new file)
        etc / "controller.yaml": ("controller policy", {"listen": f"0.0.0.0:{answers.port}"}, {
            "rules": str(ETC / "rules"), "remediation": str(ETC / "remediation.yaml"), "mode": answers.mode,
            "db": str(VAR_LIB / "controller.db"), "log_dir": str(LOG_DIR), "ingest_keys_file": str(KEY_TABLE)}),
        # validation job output on the node that runs it: the controller's working directory (/) is no place for it
        etc / "remediation.yaml": ("remediation playbooks", {}, {"validation.output_dir": str(VAR_LIB)}),
        etc / "learn.yaml": ("rule learning settings", {}, {}),
        node / "etc/sigma/telemetry.yaml": ("telemetry sidecar config",
                                            {"push.url": answers.url, "push.secret_file": str(NODE_KEY)}, {}),
        node / "etc/sigma/health.yaml": ("node health config", {}, {
            "baseline_file": str(ETC / "health-baselines.json"), "prolog.mode": answers.mode,
            "epilog.mode": answers.mode, "nodes": [node_profile(answers)]}),
    }
    texts = {}
    for path, (what, always, initially) in configs.items():
        shipped = project_root() / "configs" / path.name
        if path.exists():
            texts[path] = set_values(path.read_text(), always, str(path))
        else:
            texts[path] = header.format(what) + set_values(shipped.read_text(), {**initially, **always}, str(shipped))
    validate(texts, answers.node_names[0])  # before anything is written

    def write(path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    for path, text in texts.items():
        write(path, text)
    if not (etc / "rules").exists():  # the site's knowledge base: promoted rules are added to it, never replaced
        shutil.copytree(project_root() / "configs" / "rules", etc / "rules")
    for unit, where in (("sigma-controller.service", head), ("sigma-sidecar.service", node)):
        write(where / UNIT_DIR.relative_to("/") / unit, (project_root() / "daemons" / unit).read_text())
    if not (head / CRON_FILE.relative_to("/")).exists():
        write(head / CRON_FILE.relative_to("/"), cron_text())
    done = [f"{head}/: the head node's files (controller config, rules, playbooks, unit, cron)"]

    table = KeyTable(etc / KEY_TABLE.name).load(missing_ok=True)
    new = [table.issue(n) for n in answers.node_names if not table.for_node(n)]
    table.save()
    for key in new:
        write_private(etc / "keys" / f"{key.node}.key", node_key_text(key))
    done.append(f"keys: {len(new)} issued, {len(answers.node_names) - len(new)} kept")

    common = {str(p.relative_to(node)): p.read_bytes() for p in sorted(node.rglob("*")) if p.is_file()}
    bundles = out / "nodes"
    for name in answers.node_names:
        secret = read_private(etc / "keys" / f"{name}.key", "node key")
        write_bundle(bundles / f"{name}.tar", {**common, str(NODE_KEY.relative_to("/")): secret})
    done.append(f"{node}/: what every node gets; {bundles}/: one bundle per node ({len(answers.node_names)}), "
                f"the same files and the node's own key")

    write(out / "slurm.conf", slurm_conf_lines())
    write(out / "site.yaml", "# sigma site init's answers\n" + yaml.safe_dump(asdict(answers), sort_keys=False))
    done.append(f"{out / 'slurm.conf'}: the lines the site's slurm.conf needs")
    return done


def validate(texts: dict[Path, str], node_name: str) -> None:
    """Load every config as the daemons will (from a scratch copy): a shipped file that no longer takes the site's
    values, or a site's edit that no longer loads, is an error here, not on the hosts."""
    from sigma.controller.config import load_controller_config, load_remediation_config
    from sigma.health.config import load_health_config
    from sigma.rules.learn.config import load_learn_config
    from sigma.telemetry.config import load

    loaders = {"controller.yaml": load_controller_config, "remediation.yaml": load_remediation_config,
               "learn.yaml": load_learn_config, "health.yaml": lambda p: load_health_config(p).profile(node_name),
               "telemetry.yaml": lambda p: load(p, node=node_name)}
    with tempfile.TemporaryDirectory() as scratch:
        for path, text in texts.items():
            copy = Path(scratch) / path.name
            copy.write_text(text)
            try:
                loaders[path.name](copy)
            except ValueError as exc:  # ConfigError names the copy's file:line [key]: say which file it is
                raise ValueError(str(exc).replace(str(copy), str(path))) from None


def node_profile(answers: Answers) -> dict:
    """health.yaml's profile of the site's nodes: what every node must show (unset keys follow `defaults`)."""
    return {"pattern": answers.nodes, "type": f"gpu-{answers.gpus}x" if answers.gpus else "cpu",
            "gpus": answers.gpus}


def write_bundle(path: Path, files: dict[str, bytes]) -> None:
    """A tar of files owned by root, unpacked with `tar -xpf BUNDLE -C /`; the key is mode 0600, so is the tar."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        dirs = sorted({str(Path(name).parents[i]) for name in files for i in range(len(Path(name).parents) - 1)})
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, time.time()
            tar.addfile(info)
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), time.time()
            info.mode = 0o600 if name == str(NODE_KEY.relative_to("/")) else 0o644
            tar.addfile(info, io.BytesIO(data))
    write_private(path, buf.getvalue())


def cron_text() -> str:
    return (f"# sigma: learn rules from the last week's confirmed incidents, every night at 03:15 (docs/rules.md)\n"
            f"15 3 * * * root {BIN} rules learn --since 7d --config {ETC / 'controller.yaml'} "
            f">> {LOG_DIR / 'learn-rules.log'} 2>&1\n")


def slurm_conf_lines() -> str:
    hooks = BIN.parent
    return f"""# sigma (docs/deploy.md): add to slurm.conf on every host (or the controller's, when configless), then
# `scontrol reconfigure`. SchedulerParameters is one line: add nohold_on_prolog_fail to the site's own options.
Prolog={hooks / 'sigma-prolog'}
Epilog={hooks / 'sigma-epilog'}
SchedulerParameters=nohold_on_prolog_fail
JobRequeue=1
# remediation reboots a node with `scontrol reboot ASAP nextstate=DOWN`: SLURM needs the site's RebootProgram
# (and a ResumeTimeout longer than a reboot), e.g.
#RebootProgram=/usr/sbin/reboot
"""

