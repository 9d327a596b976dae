"""`sigma sidecar`: the per-node telemetry daemon."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sidecar", help="run the node telemetry sidecar (collect, store, push)",
                       description="Run the collectors declared in the telemetry config, keep their data in the "
                                   "node-local SQLite store and push it to the controller. SIGHUP reloads the "
                                   "config; SIGTERM stops after pushing the backlog.")
    p.add_argument("--config", default=None, help="telemetry YAML (default /etc/sigma/telemetry.yaml, else the shipped one)")
    p.add_argument("--node", default=None, help="node name (default: config `node`, else the short hostname)")
    p.add_argument("--node-dir", default=None,
                   help="node directory for {node_dir} (default $SIGMA_NODE_DIR, $SIGMA_CLUSTER_DIR/nodes/NODE on "
                        "the local cluster, else /var/lib/sigma)")
    p.add_argument("--controller", default=None, help="override push.url, e.g. http://head:8470/v1/ingest")
    p.add_argument("--secret-file", default=None, help="override push.secret_file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (dotted, YAML value), e.g. collectors.host.interval_s=5")
    p.add_argument("--check", action="store_true", help="only check the config and print the collectors")
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(func=_sidecar)


def _sidecar(args) -> int:
    import logging

    from sigma.cli import CommandError
    from sigma.config import ConfigError
    from sigma.paths import config_file
    from sigma.security.keys import KeyFileError

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = args.config or str(config_file("telemetry.yaml"))
    overrides = list(args.set)
    if args.controller is not None:
        overrides.append(f"push.url={args.controller}")
    if args.secret_file is not None:
        overrides.append(f"push.secret_file={args.secret_file}")
    try:
        if args.check:
            from sigma.telemetry.config import load

            loaded = load(config, args.node, args.node_dir, overrides)
            print(f"node {loaded.config.node}; store {loaded.config.store.path}; push {loaded.config.push.url}")
            blind = []
            for section, (kind, params) in loaded.collectors.items():
                state = f"every {params.interval_s:g} s" if params.enabled else "disabled"
                print(f"  {section} ({kind}): {state}")
                if kind == "logtail" and params.enabled and params.source != "files":
                    found, name = _kernel_log(params, loaded.config.host_root), params.log_name
                    skipped = f" (not {found.why_none()})" if found.reasons else ""
                    print(f"    {name} log: {found.describe()}{skipped}" if found.kind else
                          f"    NO {name.upper()} LOG: {name}-log fault detection would be OFF ({found.why_none()})")
                    if not found.kind and name == "kernel":  # services' lines only notify: a gap, not an error
                        blind.append(section)
            if blind:
                print(f"error: no kernel log for {', '.join(blind)}: make one readable (docs/telemetry.md, "
                      f"Kernel log) or detection on this node is degraded")
                return 1
            return 0
        from sigma.telemetry.agent import Sidecar

        sidecar = Sidecar(config, node=args.node, node_dir=args.node_dir, overrides=overrides)
    except (ConfigError, KeyFileError) as exc:
        raise CommandError(str(exc)) from None
    return sidecar.run()


def _kernel_log(params, host_root: str):
    from sigma.telemetry.logsources import choose_now

    return choose_now(params, host_root)
