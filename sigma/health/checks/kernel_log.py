"""Kernel-log scan for fatal signatures (Xid by bucket, uncorrectable ECC, hung task, IB link down) since the
node's mark; see sigma/health/kernlog.py for how the mark moves and how an admin clears a fault."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sigma.health import kernlog
from sigma.health.result import ERROR, Result, failed, passed
from sigma.telemetry.logformats import boot_time

CATEGORY = "kernel"


def check_kernel_log(findings: list[kernlog.Finding]) -> Result:
    fatal = [f for f in findings if f.fatal]
    noted = [f.label for f in findings if not f.fatal]
    if not fatal:
        return passed(f"no fatal signatures{f' (non-fatal: {sorted(set(noted))})' if noted else ''}",
                      signatures=[_json(f) for f in findings])
    first = fatal[0]
    where = f" ({first.pci})" if first.pci else ""
    more = f" (+{len(fatal) - 1} more)" if len(fatal) > 1 else ""
    return failed(f"{first.label} {first.description}{where}{more}: {first.line[:200]}", first.category,
                  signatures=[_json(f) for f in findings])


def _json(f: kernlog.Finding) -> dict:
    d = {"kind": f.kind, "category": f.category, "fatal": f.fatal, "line": f.line[:500]}
    if f.xid is not None:
        d.update(xid=f.xid, pci=f.pci)
    return d


@dataclass
class Source:
    kind: str  # journal, kmsg, file; "" when none can be read
    path: str = ""  # the device, the file, or the journal directory ("" = the system journal)
    why: str = ""  # kind "": why each candidate was passed over

    @property
    def mark_source(self) -> str:
        return f"journal:{self.path or 'system'}" if self.kind == "journal" else self.path


def choose_source(ctx, args: dict) -> Source:
    """The node's kernel log as its profile names it: `auto` (the default) chooses as the sidecar does (the
    systemd journal's kernel transport, else /dev/kmsg, else the first readable syslog file: logsources.choose),
    `journal`, `kmsg`, or a file path."""
    from sigma.telemetry import logsources

    configured = ctx.template(ctx.profile.kernel_log or "auto")
    if configured in ("kmsg", "/dev/kmsg"):
        return Source("kmsg", str(ctx.host("/dev/kmsg")))
    if configured not in ("auto", "journal"):
        return Source("file", str(ctx.host(configured)))
    journal_dir = args.get("journal_dir") or ("" if ctx.root == Path("/") else str(ctx.host("/run/log/journal")))
    order = ["journal", "kmsg", "files"] if configured == "auto" else ["journal"]
    found = logsources.choose(order, files=[str(ctx.host(p)) for p in logsources.SYSLOG_FILES],
                              kmsg_path=str(ctx.host("/dev/kmsg")), journal_dir=journal_dir,
                              journal_reader=args.get("journal_reader", "auto"), transports=("kernel",), cursor=None,
                              from_end=True, host_root=str(ctx.root))
    if found.journal is not None:
        found.journal.close()
    return Source(found.kind, found.path, found.why_none())


def scan(ctx, args: dict, source: Source) -> kernlog.Scan:
    from sigma.telemetry import logsources

    fatal_xids = tuple(args.get("fatal_xids", kernlog.DEFAULT_FATAL_XIDS))
    mark = kernlog.load_mark(ctx.state_dir, source.mark_source)
    window = float(args.get("link_boot_window_s", kernlog.LINK_BOOT_WINDOW_S))  # a link down this soon: noted
    booted = boot_time(str(ctx.root))
    if source.kind == "file":
        return kernlog.scan_file(Path(source.path), mark, fatal_xids, int(args.get("max_scan_bytes", 8 << 20)),
                                 booted=booted, link_boot_window_s=window)
    boot_id = ctx.host("/proc/sys/kernel/random/boot_id").read_text().strip()
    if source.kind == "kmsg":
        return kernlog.scan_kmsg(Path(source.path), mark, boot_id, fatal_xids, link_boot_window_s=window)
    boot = boot_id.replace("-", "")  # as the journal writes it
    entries = logsources.journal_since(args.get("journal_reader", "auto"), source.path, boot,
                                       mark.cursor if mark is not None and mark.boot_id == boot_id else None,
                                       int(args.get("max_journal_entries", 5000)))
    return kernlog.scan_journal(source.mark_source, entries, mark, boot_id, fatal_xids, booted=booted,
                                link_boot_window_s=window)


def run(ctx, args: dict) -> Result:
    source = choose_source(ctx, args)
    if not source.kind:
        return Result(ERROR, f"no kernel log can be read ({source.why}); set kernel_log for this node", "tool")
    if source.kind != "journal" and not Path(source.path).exists():
        return Result(ERROR, f"kernel log {source.path} does not exist (set kernel_log for this node)", "tool")
    result = scan(ctx, args, source)
    kernlog.save_mark(ctx.state_dir, result.mark)
    out = check_kernel_log(result.findings)
    out.data.update(lines=result.lines, source=result.mark.source)
    if result.reset:
        out.data["mark_reset"] = result.reset
    return out


def acknowledge(ctx, args: dict) -> kernlog.Scan:
    """After repair: move the mark past everything logged so far; returns what was acknowledged."""
    source = choose_source(ctx, args)
    if not source.kind:
        raise FileNotFoundError(f"no kernel log can be read here: {source.why}")
    result = scan(ctx, args, source)
    kernlog.save_mark(ctx.state_dir, result.end)
    return result
