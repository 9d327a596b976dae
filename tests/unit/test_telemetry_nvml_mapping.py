"""How the NVML collector maps NVML answers to rows, with a stand-in for the pynvml module (no GPU in CI).
The same collector runs against real NVML in tests/unit/test_telemetry_collectors.py::test_nvml_reports_gpus
(marked gpu, skipped without a driver)."""

from __future__ import annotations

import json
import sys
import types
from collections import namedtuple

import pytest

from tests.unit.telemetry_helpers import make, samples


def fake_nvml(lost_gpu: list) -> types.ModuleType:
    nv = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    class NotSupported(NVMLError):
        pass

    class Timeout(NVMLError):
        pass

    class GpuIsLost(NVMLError):
        pass

    nv.NVMLError, nv.NVMLError_NotSupported, nv.NVMLError_Timeout = NVMLError, NotSupported, Timeout
    for i, name in enumerate(["NVML_TEMPERATURE_GPU", "NVML_CLOCK_SM", "NVML_CLOCK_MEM",
                              "NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED",
                              "NVML_VOLATILE_ECC", "NVML_AGGREGATE_ECC", "NVML_PCIE_UTIL_TX_BYTES",
                              "NVML_PCIE_UTIL_RX_BYTES", "NVML_NVLINK_ERROR_DL_REPLAY",
                              "NVML_NVLINK_ERROR_DL_RECOVERY", "NVML_NVLINK_ERROR_DL_CRC_FLIT",
                              "NVML_NVLINK_ERROR_DL_CRC_DATA", "nvmlEventTypeXidCriticalError"]):
        setattr(nv, name, i)
    Util = namedtuple("Util", "gpu memory")
    Mem = namedtuple("Mem", "used total free")
    Event = namedtuple("Event", "device eventData")
    events = [Event("h1", 79)]

    def check(h):
        if h in lost_gpu:
            raise GpuIsLost("GPU is lost")

    def power(h):
        check(h)
        if h == "h1":
            raise NotSupported("not supported")
        return 250_000

    def wait(event_set, timeout):
        if events:
            return events.pop(0)
        raise Timeout("timeout")

    def nvlink_state(h, link):
        if link >= 2:
            raise NVMLError("invalid argument")
        return 1

    nv.nvmlInit = nv.nvmlShutdown = lambda: None
    nv.nvmlDeviceGetCount = lambda: 2
    nv.nvmlDeviceGetHandleByIndex = lambda i: f"h{i}"
    nv.nvmlEventSetCreate = lambda: "set"
    nv.nvmlEventSetFree = lambda s: None
    nv.nvmlDeviceRegisterEvents = lambda h, kind, s: None
    nv.nvmlEventSetWait_v2 = wait
    nv.nvmlDeviceGetUUID = lambda h: f"GPU-{h}"
    nv.nvmlDeviceGetUtilizationRates = lambda h: (check(h), Util(87, 40))[1]
    nv.nvmlDeviceGetMemoryInfo = lambda h: Mem(30 << 30, 80 << 30, 50 << 30)
    nv.nvmlDeviceGetTemperature = lambda h, s: 71
    nv.nvmlDeviceGetPowerUsage = power
    nv.nvmlDeviceGetEnforcedPowerLimit = lambda h: 700_000
    nv.nvmlDeviceGetClockInfo = lambda h, c: 1980 if c == nv.NVML_CLOCK_SM else 2619
    nv.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: 4
    nv.nvmlDeviceGetPerformanceState = lambda h: 0
    nv.nvmlDeviceGetTotalEccErrors = lambda h, kind, counter: 3 if kind == nv.NVML_MEMORY_ERROR_TYPE_CORRECTED else 0
    nv.nvmlDeviceGetRetiredPagesPendingStatus = lambda h: 0
    nv.nvmlDeviceGetPcieThroughput = lambda h, c: 1000
    nv.nvmlDeviceGetPcieReplayCounter = lambda h: 2
    nv.nvmlDeviceGetCurrPcieLinkGeneration = lambda h: 5
    nv.nvmlDeviceGetCurrPcieLinkWidth = lambda h: 16
    nv.nvmlDeviceGetNvLinkState = nvlink_state
    nv.nvmlDeviceGetNvLinkErrorCounter = lambda h, link, counter: 10 * link + counter
    return nv


def test_nvml_rows_unsupported_metrics_xid_and_a_lost_gpu(monkeypatch):
    lost: list = []
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(lost))
    from sigma.telemetry.base import Output

    c = make("nvml")
    out = Output(ts=1.0)
    c.collect(out)
    got = samples(out)
    g0, g1 = (("gpu", "0"),), (("gpu", "1"),)
    assert got[("gpu.count", ())] == 2
    assert got[("gpu.util_pct", g0)] == 87 and got[("gpu.mem.total_bytes", g1)] == 80 << 30
    assert got[("gpu.power_w", g0)] == 250.0 and ("gpu.power_w", g1) not in got  # not supported: skipped
    assert got[("gpu.ecc.volatile.corrected", g0)] == 3 and got[("gpu.throttle_reasons", g0)] == 4
    links = sorted(dict(labels)["link"] for (m, labels) in got if m == "gpu.nvlink.up" and dict(labels)["gpu"] == "0")
    assert links == ["0", "1"]
    xids = [(e[1], e[2], json.loads(e[5])) for e in out.events]
    assert xids == [("nvml", "xid", {"xid": 79, "gpu": "1"})]

    lost.append("h0")  # GPU 0 falls off the bus: reported, GPU 1 still measured, the run counts as failed
    out = Output(ts=2.0)
    with pytest.raises(RuntimeError, match="GPU 0: GPU is lost"):
        c.collect(out)
    got = samples(out)
    assert ("gpu.util_pct", g0) not in got and got[("gpu.util_pct", g1)] == 87
    assert [(e[2], json.loads(e[5])["gpu"]) for e in out.events] == [("gpu_error", "0")]
    c.close()
