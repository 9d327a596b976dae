"""Accelerator inventory and health through NVML: count, uncorrectable ECC, retired pages / row-remap failure,
pending Xid events, throttle reasons, persistence mode, temperature.

Without NVML the check is skipped, unless the node's profile expects accelerators: then it fails.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from sigma.health.result import Result, failed, passed, skipped

CATEGORY = "gpu"

# Throttle reasons that mean the hardware is protecting itself (not idle clocks or application limits).
BAD_THROTTLE = {0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake"}


@dataclass
class GpuFacts:
    index: int
    name: str = ""
    pci: str = ""
    ecc_uncorrected: int | None = None  # volatile uncorrectable ECC count
    retired_pending: bool | None = None  # page retirement waiting for a reset
    remap_failure: bool | None = None  # row remapping failed (the GPU needs replacing)
    remap_pending: bool | None = None
    throttle_reasons: int | None = None
    persistence: bool | None = None
    temperature_c: float | None = None
    xids: list[int] = field(default_factory=list)  # critical Xid events pending on the NVML event set

    def needs_reset(self) -> bool:
        return bool(self.retired_pending or self.remap_pending)


@dataclass
class NvmlFacts:
    available: bool
    reason: str = ""  # why NVML is not available
    driver: str = ""
    gpus: list[GpuFacts] = field(default_factory=list)


def check_accelerators(nv: NvmlFacts, expected: int | None, max_temp_c: float = 85.0,
                       require_persistence: bool = True) -> Result:
    if not nv.available:
        if expected:
            return failed(f"expected {expected} GPUs but NVML is unavailable: {nv.reason}")
        return skipped(f"no NVML on this node ({nv.reason})")
    problems: list[tuple[str, str]] = []  # (category, message)
    if expected is not None and len(nv.gpus) != expected:
        problems.append(("gpu", f"{len(nv.gpus)} GPUs visible, expected {expected}"))
    for g in nv.gpus:
        tag = f"GPU{g.index} {g.pci}".strip()
        if g.ecc_uncorrected:
            problems.append(("gpu-memory", f"{tag}: {g.ecc_uncorrected} uncorrectable ECC errors"))
        if g.remap_failure:
            problems.append(("gpu-memory", f"{tag}: row remapping failure"))
        if g.needs_reset():
            problems.append(("gpu-memory", f"{tag}: retired pages / row remap pending (needs a GPU reset)"))
        for xid in g.xids:
            problems.append(("gpu", f"{tag}: pending Xid {xid}"))
        if g.throttle_reasons:
            bad = [name for bit, name in BAD_THROTTLE.items() if g.throttle_reasons & bit]
            if bad:
                problems.append(("gpu", f"{tag}: clocks throttled ({', '.join(bad)})"))
        if require_persistence and g.persistence is False:
            problems.append(("gpu", f"{tag}: persistence mode off"))
        if g.temperature_c is not None and g.temperature_c > max_temp_c:
            problems.append(("gpu", f"{tag}: temperature {g.temperature_c:.0f} C > {max_temp_c:.0f} C"))
    data = {"gpus": len(nv.gpus), "driver": nv.driver, "names": sorted({g.name for g in nv.gpus})}
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        return failed(problems[0][1] + more, problems[0][0], problems=[m for _, m in problems], **data)
    return passed(f"{len(nv.gpus)} GPUs healthy ({', '.join(data['names'])}, driver {nv.driver})", **data)


def gather(xid_wait_ms: int = 100) -> NvmlFacts:
    """Read NVML; every per-device query that the device does not support is left None."""
    try:
        import pynvml as nv
    except ImportError as exc:
        return NvmlFacts(False, f"pynvml not importable: {exc}")
    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:
        return NvmlFacts(False, str(exc))
    try:
        driver = _str(nv.nvmlSystemGetDriverVersion())
        count = nv.nvmlDeviceGetCount()
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        gpus = []
        for i, h in enumerate(handles):
            g = GpuFacts(i, _str(_try(nv.nvmlDeviceGetName, h) or ""),
                         _str(getattr(_try(nv.nvmlDeviceGetPciInfo, h), "busId", "") or ""))
            g.ecc_uncorrected = _try(nv.nvmlDeviceGetTotalEccErrors, h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                     nv.NVML_VOLATILE_ECC)
            pending = _try(nv.nvmlDeviceGetRetiredPagesPendingStatus, h)
            g.retired_pending = None if pending is None else bool(pending)
            remap = _try(nv.nvmlDeviceGetRemappedRows, h)  # (corrected, uncorrected, pending, failure)
            if remap is not None:
                g.remap_pending, g.remap_failure = bool(remap[2]), bool(remap[3])
            reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                nv.nvmlDeviceGetCurrentClocksThrottleReasons
            g.throttle_reasons = _try(reasons, h)
            mode = _try(nv.nvmlDeviceGetPersistenceMode, h)
            g.persistence = None if mode is None else mode == nv.NVML_FEATURE_ENABLED
            g.temperature_c = _try(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
            gpus.append(g)
        _pending_xids(nv, handles, gpus, xid_wait_ms)
        return NvmlFacts(True, driver=driver, gpus=gpus)
    finally:
        _try(nv.nvmlShutdown)


def _pending_xids(nv, handles, gpus, wait_ms: int) -> None:
    """Critical Xid events delivered while we listen (NVML only reports events after registration)."""
    evset = _try(nv.nvmlEventSetCreate)
    if evset is None:
        return
    try:
        for h in handles:
            _try(nv.nvmlDeviceRegisterEvents, h, nv.nvmlEventTypeXidCriticalError, evset)
        while True:
            try:
                ev = nv.nvmlEventSetWait(evset, wait_ms)
            except nv.NVMLError:
                break  # timeout: nothing (more) pending
            index = _try(nv.nvmlDeviceGetIndex, ev.device)
            if index is not None and index < len(gpus):
                gpus[index].xids.append(int(ev.eventData))
    finally:
        _try(nv.nvmlEventSetFree, evset)


def _try(fn, *args):
    try:
        return fn(*args)
    except Exception:  # NVMLError_NotSupported and friends: the field stays unknown
        return None


def _str(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def nvml_facts(ctx, args: dict) -> NvmlFacts:
    return ctx.fact("nvml", lambda: gather(int(args.get("xid_wait_ms", 100))))


def run(ctx, args: dict) -> Result:
    nv = nvml_facts(ctx, args)
    result = check_accelerators(nv, ctx.profile.gpus or None, float(ctx.profile.max_gpu_temp_c or 85.0),
                                bool(args.get("require_persistence", True)))
    if nv.available:
        result.data["gpu_facts"] = [asdict(g) for g in nv.gpus]
    return result
