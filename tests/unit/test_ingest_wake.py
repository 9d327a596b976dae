"""A stored batch with a warning-or-worse event wakes the detection loop at once; routine events (heartbeats,
info lines) and duplicates do not; without a wake the loop keeps its period and still stops at once."""

from __future__ import annotations

import threading
import time

from sigma.controller.daemon import wait_next
from sigma.controller.ingest.batch import Ingest
from sigma.telemetry import wire

SECRET = b"s" * 32


def _push(ingest, seq, severity):
    ts = time.time()
    body = wire.encode_binary_batch("node1", seq, ts, [(ts, "gpu.temp_c", 50.0, '{"gpu":"0"}', "[7]")],
                                    [[ts, "log", "xid", severity, "NVRM: Xid 79", "{}", "[7]"]], [])
    caller = ingest.authenticate(wire.auth_headers(None, SECRET, "node1", body), len(body))
    return ingest.receive(caller, body)


def test_an_error_event_wakes_the_loop_and_an_info_one_does_not(tmp_path):
    ingest = Ingest(tmp_path / "c.db", SECRET)
    assert _push(ingest, 1, "info")[0] == 200 and not ingest.wake.is_set()
    assert _push(ingest, 2, "error")[0] == 200 and ingest.wake.is_set()
    ingest.wake.clear()
    assert _push(ingest, 2, "error")[1]["duplicate"] and not ingest.wake.is_set()  # stored before: seen before
    ingest.close()


def test_wait_next_returns_on_a_wake_and_on_stop_and_otherwise_waits_its_period():
    stop, wake = threading.Event(), threading.Event()
    t0 = time.monotonic()
    wait_next(stop, wake, 0.3)
    assert time.monotonic() - t0 >= 0.3
    threading.Timer(0.1, wake.set).start()
    t0 = time.monotonic()
    wait_next(stop, wake, 30.0)
    assert time.monotonic() - t0 < 10 and not wake.is_set()  # taken: the next wait is a full one again
    threading.Timer(0.1, stop.set).start()
    t0 = time.monotonic()
    wait_next(stop, wake, 30.0)
    assert time.monotonic() - t0 < 10
