"""NVIDIA GPUs through NVML (nvidia-ml-py): utilisation, memory, temperature, power, clocks, ECC counters,
throttle reasons, PCIe and NVLink counters, and Xid events.

No NVML library, no driver or no GPU -> CollectorUnavailable: the sidecar reports the collector as unavailable
(once, and again after `retry_s`), it is not an error. A metric a GPU does not support is skipped for that GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from sigma.telemetry.base import Collector, CollectorParams, CollectorUnavailable, Output, register


@register("nvml")
class NvmlCollector(Collector):
    @dataclass
    class Params(CollectorParams):
        ecc: bool = True  # ECC error counters (volatile and aggregate)
        pcie: bool = True  # PCIe throughput and replay counter
        nvlink: bool = True  # per-link state and error counters
        xid_events: bool = True  # Xid critical errors as events (source 'nvml', kind 'xid')
        max_links: int = 18  # NVLink links probed per GPU

    def __init__(self, section, params, ctx):
        super().__init__(section, params, ctx)
        self.nv = None
        self.handles = []
        self.event_set = None
        self.unsupported: set[tuple[int, str]] = set()

    def _init(self) -> None:
        try:
            import pynvml
        except ImportError as exc:
            raise CollectorUnavailable(f"nvidia-ml-py is not installed: {exc}") from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise CollectorUnavailable(f"NVML cannot start: {exc}") from None
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            pynvml.nvmlShutdown()
            raise CollectorUnavailable(f"NVML finds no GPUs: {exc}") from None
        if count == 0:
            pynvml.nvmlShutdown()
            raise CollectorUnavailable("NVML finds no GPUs")
        self.nv = pynvml
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        if self.params.xid_events:
            try:
                self.event_set = pynvml.nvmlEventSetCreate()
                for h in self.handles:
                    pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, self.event_set)
            except pynvml.NVMLError:
                self.event_set = None  # some GPUs (or containers) do not allow event registration

    def close(self) -> None:
        if self.nv is not None:
            try:
                if self.event_set is not None:
                    self.nv.nvmlEventSetFree(self.event_set)
                self.nv.nvmlShutdown()
            except self.nv.NVMLError:
                pass
            self.nv = None

    def collect(self, out: Output) -> None:
        if self.nv is None:
            self._init()
        nv = self.nv
        out.sample("gpu.count", len(self.handles))
        failures = []
        for i, h in enumerate(self.handles):
            try:
                self._gpu(out, i, h)
            except nv.NVMLError as exc:  # e.g. GPU fallen off the bus: the other GPUs are still reported
                failures.append(f"GPU {i}: {exc}")
                out.event("nvml", "gpu_error", f"GPU {i}: {exc}", "error", {"gpu": str(i), "error": str(exc)})
        if self.event_set is not None:
            self._xid(out)
        if failures:
            raise RuntimeError("; ".join(failures))

    def _gpu(self, out: Output, i: int, h) -> None:
        nv = self.nv
        labels = {"gpu": str(i)}

        def g(name, fn, *args, scale=1.0):
            self._get(out, i, name, labels, fn, h, *args, scale=scale)

        util = self._call(i, "util", nv.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            out.sample("gpu.util_pct", util.gpu, labels)
            out.sample("gpu.mem_util_pct", util.memory, labels)
        mem = self._call(i, "mem", nv.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            out.sample("gpu.mem.used_bytes", mem.used, labels)
            out.sample("gpu.mem.total_bytes", mem.total, labels)
        g("gpu.temp_c", nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU)
        g("gpu.power_w", nv.nvmlDeviceGetPowerUsage, scale=1e-3)
        g("gpu.power_limit_w", nv.nvmlDeviceGetEnforcedPowerLimit, scale=1e-3)
        g("gpu.clock.sm_mhz", nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM)
        g("gpu.clock.mem_mhz", nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_MEM)
        g("gpu.throttle_reasons", nv.nvmlDeviceGetCurrentClocksThrottleReasons)
        g("gpu.perf_state", nv.nvmlDeviceGetPerformanceState)
        if self.params.ecc:
            for kind, kname in ((nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, "corrected"),
                                (nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, "uncorrected")):
                for counter, cname in ((nv.NVML_VOLATILE_ECC, "volatile"), (nv.NVML_AGGREGATE_ECC, "aggregate")):
                    g(f"gpu.ecc.{cname}.{kname}", nv.nvmlDeviceGetTotalEccErrors, kind, counter)
            g("gpu.retired_pages.pending", nv.nvmlDeviceGetRetiredPagesPendingStatus)
        if self.params.pcie:
            g("gpu.pcie.tx_kbps", nv.nvmlDeviceGetPcieThroughput, nv.NVML_PCIE_UTIL_TX_BYTES)
            g("gpu.pcie.rx_kbps", nv.nvmlDeviceGetPcieThroughput, nv.NVML_PCIE_UTIL_RX_BYTES)
            g("gpu.pcie.replay_count", nv.nvmlDeviceGetPcieReplayCounter)
            g("gpu.pcie.link_gen", nv.nvmlDeviceGetCurrPcieLinkGeneration)
            g("gpu.pcie.link_width", nv.nvmlDeviceGetCurrPcieLinkWidth)
        if self.params.nvlink:
            self._nvlink(out, i, h, labels)

    def _nvlink(self, out: Output, i: int, h, labels: dict) -> None:
        nv = self.nv
        for link in range(self.params.max_links):
            if (i, f"nvlink{link}") in self.unsupported:
                break
            try:
                state = nv.nvmlDeviceGetNvLinkState(h, link)
            except nv.NVMLError:
                self.unsupported.add((i, f"nvlink{link}"))
                break
            ll = {**labels, "link": str(link)}
            out.sample("gpu.nvlink.up", int(state), ll)
            for counter, name in ((nv.NVML_NVLINK_ERROR_DL_REPLAY, "replay"),
                                  (nv.NVML_NVLINK_ERROR_DL_RECOVERY, "recovery"),
                                  (nv.NVML_NVLINK_ERROR_DL_CRC_FLIT, "crc_flit"),
                                  (nv.NVML_NVLINK_ERROR_DL_CRC_DATA, "crc_data")):
                self._get(out, i, f"gpu.nvlink.errors.{name}", ll, nv.nvmlDeviceGetNvLinkErrorCounter, h, link,
                          counter, key=f"nvlink{link}.{name}")

    def _xid(self, out: Output) -> None:
        nv = self.nv
        for _ in range(100):
            try:
                data = nv.nvmlEventSetWait_v2(self.event_set, 0)
            except nv.NVMLError_Timeout:
                return
            except nv.NVMLError:
                return
            gpu = next((str(k) for k, h in enumerate(self.handles) if _same(nv, h, data.device)), "?")
            xid = int(data.eventData)
            out.event("nvml", "xid", f"GPU {gpu}: Xid {xid}", "error", {"xid": xid, "gpu": gpu})

    def _call(self, i: int, key: str, fn, *args):
        if (i, key) in self.unsupported:
            return None
        try:
            return fn(*args)
        except self.nv.NVMLError_NotSupported:
            self.unsupported.add((i, key))
            return None

    def _get(self, out: Output, i: int, name: str, labels: dict, fn, *args, scale: float = 1.0,
             key: str | None = None) -> None:
        value = self._call(i, key or name, fn, *args)
        if value is not None:
            out.sample(name, value * scale if scale != 1.0 else value, labels)


def _same(nv, a, b) -> bool:
    try:
        return nv.nvmlDeviceGetUUID(a) == nv.nvmlDeviceGetUUID(b)
    except nv.NVMLError:
        return False
