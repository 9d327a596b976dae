"""Kernel-log scan for fatal signatures (Xid by bucket, uncorrectable ECC, hung task, IB link down) since the
node's mark; see sigma/health/kernlog.py for how the mark moves and how an admin clears a fault."""

from __future__ import annotations

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


def source_path(ctx) -> tuple[str, Path]:
    """("kmsg" | "file", host path) for the node's configured kernel log."""
    configured = ctx.template(ctx.profile.kernel_log or "kmsg")
    if configured in ("kmsg", "/dev/kmsg"):
        return "kmsg", ctx.host("/dev/kmsg")
    return "file", ctx.host(configured)


def scan(ctx, args: dict) -> kernlog.Scan:
    kind, path = source_path(ctx)
    fatal_xids = tuple(args.get("fatal_xids", kernlog.DEFAULT_FATAL_XIDS))
    mark = kernlog.load_mark(ctx.state_dir, str(path))
    window = float(args.get("link_boot_window_s", kernlog.LINK_BOOT_WINDOW_S))
    if kind == "kmsg":
        boot_id = ctx.host("/proc/sys/kernel/random/boot_id").read_text().strip()
        return kernlog.scan_kmsg(path, mark, boot_id, fatal_xids, link_boot_window_s=window)
    return kernlog.scan_file(path, mark, fatal_xids, int(args.get("max_scan_bytes", 8 << 20)),
                             booted=boot_time(str(ctx.host("/"))), link_boot_window_s=window)


def run(ctx, args: dict) -> Result:
    kind, path = source_path(ctx)
    if not path.exists():
        return Result(ERROR, f"kernel log {path} does not exist (set kernel_log for this node)", "tool")
    result = scan(ctx, args)
    kernlog.save_mark(ctx.state_dir, result.mark)
    out = check_kernel_log(result.findings)
    out.data.update(lines=result.lines, source=result.mark.source)
    if result.reset:
        out.data["mark_reset"] = result.reset
    return out


def acknowledge(ctx, args: dict) -> kernlog.Scan:
    """After repair: move the mark past everything logged so far; returns what was acknowledged."""
    result = scan(ctx, args)
    kernlog.save_mark(ctx.state_dir, result.end)
    return result
