"""Ingest under abuse: valid sidecars' throughput and the controller's RSS while 200 hostile clients connect.

The ingest server (`python -m sigma.controller.ingest.server`, per-node keys) runs as its own process. Valid
sidecars (one process, --sidecars threads, each its own node key and keep-alive connection) post binary batches of
--samples samples back to back, signature version 2, exactly as the sidecar does. Two phases of --duration seconds:

1. unloaded: only the valid sidecars;
2. loaded: the same, while --attackers unauthenticated clients (a second process) keep reconnecting (0.2 s after
   each close), a quarter each of: idle (connect, send nothing), slowloris (a request head trickled one byte
   every 0.5 s), oversized (Content-Length 60 MB with a forged key, then body bytes at 4 MB/s each), and
   oversized-v1 (the same signed the old way, no digest header).

The attackers run at nice 19 (on a real network their CPU is elsewhere); the phases alternate for --rounds rounds
and end with one more unloaded phase, so that other load on the machine hits both alike: each loaded phase is
compared with the unloaded phases just before and after it, and the median of those ratios is the figure. The controller database lives in /dev/shm by default: the
figure is about the network side, not the disk.

Printed: valid batches/s and samples/s per phase, the ratio of each round and their median (goal >= 90 %), the server's CPU per valid batch
in each phase and what the attack cost it (a figure that does not depend on how busy the rest of the machine is),
the server's peak and final RSS (goal < 200 MB), its refusal counters from /metrics, and what the attackers did.
Loopback only; every loop stops by itself at the phase's end.

--baseline REV adds a side-by-side check against the ingest server as it was at git REV: --big-clients
unauthenticated requests with --big-mb bodies (forged signature), then 100 clients trickling a request head for
15 s; printed: the server's RSS before and at its peak, its threads at the peak and after the 15 s, and how many
slow clients it closed.

    .venv/bin/python bench/ingest_abuse.py [--duration 15] [--rounds 5] [--sidecars 8] [--samples 2000] \
                                           [--attackers 200]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sigma.security.keys import KeyTable  # noqa: E402
from sigma.telemetry import http11, wire  # noqa: E402

HOST = "127.0.0.1"
KINDS = tuple(os.environ.get("ABUSE_KINDS", "idle,slowloris,oversized,oversized-v1").split(","))
RECONNECT_S = 0.2  # an attacker whose connection was closed comes back after this long
OVERSIZE_RATE = 4 << 20  # bytes/s each oversized client streams (all of them together: ~200 MB/s)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def start_server(tmp: Path, table: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sigma.controller.ingest.server", "--db", str(tmp / "c.db"),
                             "--keys-file", str(table), "--host", HOST, "--port", str(port),
                             "--log-level", "ERROR"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_healthz(proc, port)
    return proc, port


# ---------- valid sidecars ----------
SEQ_BASE = 10 ** 12  # fixed width, so a batch's seq can be swapped in its body without re-encoding


def template(node: str, samples: int) -> bytes:
    now = time.time()
    rows = [(now - 1 + i / samples, f"gpu.util.{i % 50}", float(i), '{"gpu":"0"}', "[7]") for i in range(samples)]
    return wire.encode_binary_batch(node, SEQ_BASE, now, rows, [], [])


def sidecar(port: int, node: str, key_id: str, secret: bytes, body0: bytes, until: float, seq0: int, out: list):
    """Posts back to back as a sidecar catching up a backlog does: a fresh seq and signature per batch."""
    conn = http11.Connection(HOST, port, timeout=30)  # the sidecar's own client: one sendall per request
    seq, ok, failed, dup = seq0, 0, 0, 0
    marker = f'"seq":{SEQ_BASE}'.encode()
    while time.time() < until:
        body = body0.replace(marker, f'"seq":{SEQ_BASE + seq}'.encode(), 1)
        headers = {"Content-Type": "application/octet-stream", **wire.auth_headers(key_id, secret, node, body)}
        try:
            status, _, reply = conn.post("/v1/ingest", headers, body)
            if status == 200:
                ok += 1
                dup += b'"duplicate": true' in reply
                seq += 1
            else:
                failed += 1
        except OSError:  # refused or reset: what a real sidecar would see, it reconnects
            failed += 1
            conn.close()
            time.sleep(0.05)
    conn.close()
    out.append((ok - dup, failed))


def sidecars_process(port: int, keys: list, samples: int, duration: float, seq0: int, queue) -> None:
    bodies = {node: template(node, samples) for node, _, _ in keys}
    until = time.time() + duration
    results: list = []
    threads = [threading.Thread(target=sidecar, args=(port, node, kid, sec, bodies[node], until, seq0, results))
               for node, kid, sec in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    queue.put((sum(r[0] for r in results), sum(r[1] for r in results)))


# ---------- attackers ----------
def attacker(kind: str, port: int, until: float, stats: dict, lock: threading.Lock) -> None:
    forged = {"node": "node1", "key": "node1-00000000"}
    first = True
    while time.time() < until:
        if not first:
            time.sleep(RECONNECT_S)
        first = False
        try:
            s = socket.create_connection((HOST, port), timeout=2)
        except OSError:
            continue
        with lock:
            stats["connections"] += 1
        sent = 0
        try:
            s.settimeout(0.5)
            if kind == "slowloris":
                head = b"POST /v1/ingest HTTP/1.1\r\nHost: x\r\nX-Sigma-Node: node1\r\n"
                for i in range(10 ** 6):
                    if time.time() >= until:
                        break
                    s.sendall(head[i:i + 1] if i < len(head) else b"a")
                    sent += 1
                    time.sleep(0.5)
            elif kind == "idle":
                while time.time() < until:
                    if s.recv(1) == b"":
                        break
            else:
                headers = (f"POST /v1/ingest HTTP/1.1\r\nHost: x\r\nContent-Length: {60 << 20}\r\n"
                           f"X-Sigma-Node: {forged['node']}\r\nX-Sigma-Timestamp: {time.time():.3f}\r\n"
                           f"X-Sigma-Key: {forged['key']}\r\nX-Sigma-Signature: {'0' * 64}\r\n")
                if kind == "oversized":
                    headers += f"X-Sigma-Content-SHA256: {'0' * 64}\r\n"
                s.sendall((headers + "\r\n").encode())
                chunk = b"\0" * 65536
                while time.time() < until:  # OVERSIZE_RATE per connection
                    s.sendall(chunk)
                    sent += len(chunk)
                    time.sleep(len(chunk) / OVERSIZE_RATE)
        except OSError:  # closed by the server: that is the point; go again
            pass
        finally:
            s.close()
        with lock:
            stats["bytes_sent"] += sent
            stats[f"{kind}_cycles"] += 1


def attackers_process(port: int, n: int, duration: float, queue) -> None:
    os.nice(19)  # their own CPU is not the server's cost: on a real network they run elsewhere
    until = time.time() + duration
    stats = {"connections": 0, "bytes_sent": 0}
    kinds = KINDS
    for k in kinds:
        stats[f"{k}_cycles"] = 0
    lock = threading.Lock()
    threads = [threading.Thread(target=attacker, args=(kinds[i % len(kinds)], port, until, stats, lock), daemon=True)
               for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(0.0, until - time.time()) + 5)
    queue.put(stats)


# ---------- phases ----------
def phase(port: int, server: psutil.Process, keys: list, args, attackers: int, seq0: int) -> dict:
    ctx = mp.get_context("fork")
    q_valid, q_att = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=sidecars_process,
                         args=(port, keys, args.samples, args.duration, seq0, q_valid))]
    if attackers:
        procs.append(ctx.Process(target=attackers_process,
                                 args=(port, attackers, args.duration + 1, q_att)))
        procs[-1].start()
        time.sleep(1.0)  # the flood is on before the measured window starts
    procs[0].start()
    peak, t_end, cpu0 = 0, time.time() + args.duration, sum(server.cpu_times()[:2])
    while time.time() < t_end:
        peak = max(peak, server.memory_info().rss)
        time.sleep(0.1)
    server_cpu = (sum(server.cpu_times()[:2]) - cpu0) / args.duration
    ok, failed = q_valid.get(timeout=60)
    att = q_att.get(timeout=60) if attackers else {}
    for p in procs:
        p.join(timeout=10)
    return {"batches_s": ok / args.duration, "samples_s": ok * args.samples / args.duration, "failed": failed,
            "peak_rss_mb": peak / 2 ** 20, "attack": att, "server_cpu": server_cpu}


# ---------- side by side with an earlier server (--baseline REV) ----------
def start_baseline(tmp: Path, rev: str) -> tuple[subprocess.Popen, int]:
    """The ingest server and batch module as they were at REV (shared secret, signature over the body), run
    beside the current package."""
    pkg = tmp / "baseline_ingest"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name in ("server", "batch"):
        text = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:sigma/controller/ingest/{name}.py"],
                              check=True, capture_output=True, text=True).stdout
        text = text.replace("from sigma.controller.ingest.batch", "from baseline_ingest.batch")
        (pkg / f"{name}.py").write_text(text)
    secret = tmp / "baseline.secret"
    wire.write_secret(secret)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": f"{tmp}{os.pathsep}{REPO}"}
    proc = subprocess.Popen([sys.executable, "-m", "baseline_ingest.server", "--db", str(tmp / "baseline.db"),
                             "--secret-file", str(secret), "--host", HOST, "--port", str(port), "--log-level",
                             "ERROR"], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_healthz(proc, port)
    return proc, port


def wait_healthz(proc: subprocess.Popen, port: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://{HOST}:{port}/healthz", timeout=1).read()
            return
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("ingest server did not start")


def oversized_then_slow(port: int, server: psutil.Process, clients: int, body_mb: int, slow: int,
                        slow_s: float) -> dict:
    """`clients` unauthenticated requests (forged signature, no digest header) each sending a body_mb body at
    full speed, then `slow` connections trickling a request head for slow_s: the server's peak RSS and threads."""
    rss0 = server.memory_info().rss
    peak = [rss0, server.num_threads()]
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            try:
                peak[0] = max(peak[0], server.memory_info().rss)
                peak[1] = max(peak[1], server.num_threads())
            except psutil.Error:
                return
            time.sleep(0.05)

    def big():
        head = (f"POST /v1/ingest HTTP/1.1\r\nHost: x\r\nContent-Length: {body_mb << 20}\r\n"
                f"X-Sigma-Node: node1\r\nX-Sigma-Timestamp: {time.time():.3f}\r\nX-Sigma-Signature: {'0' * 64}"
                f"\r\n\r\n").encode()
        try:
            with socket.create_connection((HOST, port), timeout=30) as s:
                s.sendall(head)
                chunk = b"\0" * (1 << 20)
                for _ in range(body_mb):
                    s.sendall(chunk)
                s.recv(100)
        except OSError:
            pass

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    senders = [threading.Thread(target=big) for _ in range(clients)]
    for t in senders:
        t.start()
    for t in senders:
        t.join(timeout=60)
    big_peak = peak[0]
    socks, closed = [], 0
    for _ in range(slow):
        try:
            socks.append(socket.create_connection((HOST, port), timeout=2))
        except OSError:
            closed += 1
    head = b"POST /v1/ingest HTTP/1.1\r\nHost: x\r\n"
    until, i = time.time() + slow_s, 0
    while time.time() < until:  # one byte per connection every 0.5 s
        for s in list(socks):
            try:
                s.sendall(head[i:i + 1] if i < len(head) else b"a")
            except OSError:
                socks.remove(s)
                closed += 1
        i += 1
        time.sleep(0.5)
    threads_end = server.num_threads()
    for s in socks:
        s.close()
    stop.set()
    watcher.join()
    return {"rss0_mb": rss0 / 2 ** 20, "big_peak_mb": big_peak / 2 ** 20, "peak_threads": peak[1],
            "threads_end": threads_end, "slow_closed": closed, "slow": slow}


def counters(port: int) -> dict:
    text = urllib.request.urlopen(f"http://{HOST}:{port}/metrics", timeout=10).read().decode()
    found = {}
    for line in text.splitlines():
        if line.startswith("sigma_ingest_rejected_total{"):
            found[line.split('"')[1]] = float(line.rsplit(" ", 1)[1])
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per phase")
    parser.add_argument("--rounds", type=int, default=5, help="unloaded/loaded pairs, alternated (0: skip)")
    parser.add_argument("--sidecars", type=int, default=8, help="valid sidecars (threads, one key each)")
    parser.add_argument("--samples", type=int, default=2000, help="samples per valid batch")
    parser.add_argument("--attackers", type=int, default=200, help="hostile clients in the loaded phase")
    parser.add_argument("--baseline", metavar="REV", default=None,
                        help="also run the memory/slow-client check against the ingest server at git REV, side by "
                             "side with the current one")
    parser.add_argument("--big-clients", type=int, default=8, help="--baseline check: oversized clients")
    parser.add_argument("--big-mb", type=int, default=32, help="--baseline check: body size of each, MB")
    parser.add_argument("--tmp-dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None,
                        help="where the controller database goes (default /dev/shm: the figure is about the "
                             "network side, not the disk, which other work on a shared machine also uses)")
    args = parser.parse_args()
    if args.rounds > 0:
        measure(args)
    if args.baseline:
        compare(args)
    return 0


def measure(args) -> None:
    """Valid ingest unloaded and under attack, alternated for --rounds rounds."""
    with tempfile.TemporaryDirectory(prefix="sigma-abuse-", dir=args.tmp_dir) as tmp:
        tmp = Path(tmp)
        table = KeyTable(tmp / "keys.json")
        issued = [table.issue(f"node{i + 1}") for i in range(args.sidecars)]
        table.save()
        keys = [(k.node, k.id, k.secret.encode()) for k in issued]
        proc, port = start_server(tmp, table.path)
        load0 = os.getloadavg()[0]
        try:
            server = psutil.Process(proc.pid)
            idle_rss = server.memory_info().rss / 2 ** 20
            runs = {"unloaded": [], "loaded": []}
            for r in range(args.rounds):  # alternated, so drift in the machine's load hits both alike
                runs["unloaded"].append(phase(port, server, keys, args, 0, 1 + 2 * r * 10 ** 8))
                runs["loaded"].append(phase(port, server, keys, args, args.attackers, (2 * r + 1) * 10 ** 8))
            # a closing unloaded phase: every loaded phase is then judged against one before and one after it
            runs["unloaded"].append(phase(port, server, keys, args, 0, 1 + 2 * args.rounds * 10 ** 8))
            time.sleep(1.0)
            final_rss = server.memory_info().rss / 2 ** 20
            refused = counters(port)
            threads = server.num_threads()
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    print(f"ingest under abuse: {args.sidecars} valid sidecars x {args.samples} samples/batch, {args.rounds} rounds "
          f"of {args.duration:.0f} s per phase, {args.attackers} attackers, {os.cpu_count()} CPUs, load average "
          f"{load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    print(f"{'phase':10} {'round':>5} {'batches/s':>10} {'samples/s':>11} {'failed':>7} {'peak RSS MB':>12} "
          f"{'server CPU':>11}")
    for name, rs in runs.items():
        for i, r in enumerate(rs):
            print(f"{name:10} {i + 1:5d} {r['batches_s']:10.1f} {r['samples_s']:11.0f} {r['failed']:7d} "
                  f"{r['peak_rss_mb']:12.1f} {100 * r['server_cpu']:10.0f}%")
    base = sum(r["samples_s"] for r in runs["unloaded"]) / len(runs["unloaded"])
    under = sum(r["samples_s"] for r in runs["loaded"]) / args.rounds
    peak = max(r["peak_rss_mb"] for rs in runs.values() for r in rs)
    ratios = round_ratios(runs["unloaded"], runs["loaded"])
    print("under attack / unloaded, per round (each loaded phase against the unloaded phases either side of it): "
          + ", ".join(f"{100 * x:.1f} %" for x in ratios))
    print(f"valid ingest: {base:.0f} samples/s unloaded, {under:.0f} samples/s under attack; median ratio "
          f"{100 * statistics.median(ratios):.1f} % (goal >= 90 %)")
    per_batch = [sum(r["server_cpu"] for r in rs) / max(sum(r["batches_s"] for r in rs), 1e-9)
                 for rs in runs.values()]  # server CPU seconds per valid batch, unloaded and loaded
    attack_cpu = sum(r["server_cpu"] - r["batches_s"] * per_batch[0] for r in runs["loaded"]) / args.rounds
    print(f"server CPU per valid batch: {1000 * per_batch[0]:.1f} ms unloaded, {1000 * per_batch[1]:.1f} ms under "
          f"attack; the attack itself cost the server {100 * attack_cpu:.1f} % of a core")
    print(f"server RSS: {idle_rss:.1f} MB at start, peak {peak:.1f} MB, {final_rss:.1f} MB after (goal < 200 MB); "
          f"{threads} threads after")
    loaded = runs["loaded"][-1]
    att = loaded["attack"]
    print(f"attackers (last round): {att.get('connections', 0)} connections, "
          f"{att.get('bytes_sent', 0) / 2 ** 20:.1f} MB sent, cycles "
          + ", ".join(f"{k[:-7]} {v}" for k, v in att.items() if k.endswith("_cycles")))
    print("server refusals: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(refused.items())))


def round_ratios(unloaded: list[dict], loaded: list[dict]) -> list[float]:
    """Valid samples/s of each loaded phase over the mean of the unloaded phases just before and just after it (the
    phases alternate unloaded, loaded, unloaded, ...: a drift in the machine's load between rounds then cancels)."""
    out = []
    for i, r in enumerate(loaded):
        around = [u["samples_s"] for u in unloaded[i:i + 2]]
        out.append(r["samples_s"] / (sum(around) / len(around)) if sum(around) > 0 else 0.0)
    return out


def compare(args) -> None:
    """The same unauthenticated flood against the server at --baseline and the current one."""
    rows = {}
    with tempfile.TemporaryDirectory(prefix="sigma-abuse-base-", dir=args.tmp_dir) as tmp:
        tmp = Path(tmp)
        table = KeyTable(tmp / "keys.json")
        table.issue("node1")
        table.save()
        for name, start in ((f"at {args.baseline}", lambda: start_baseline(tmp, args.baseline)),
                            ("current", lambda: start_server(tmp, table.path))):
            proc, port = start()
            try:
                rows[name] = oversized_then_slow(port, psutil.Process(proc.pid), args.big_clients, args.big_mb,
                                                 slow=100, slow_s=15.0)
            finally:
                proc.terminate()
                proc.wait(timeout=10)
    print(f"\nside by side: {args.big_clients} unauthenticated clients sending {args.big_mb} MB bodies each, then "
          f"100 clients trickling a request head for 15 s")
    print(f"{'server':16} {'RSS before':>10} {'RSS peak (bodies)':>18} {'peak threads':>13} "
          f"{'threads after 15 s':>19} {'slow clients closed':>20}")
    for name, r in rows.items():
        print(f"{name:16} {r['rss0_mb']:9.1f}M {r['big_peak_mb']:17.1f}M {r['peak_threads']:13d} "
              f"{r['threads_end']:19d} {r['slow_closed']:>14d} of {r['slow']}")


if __name__ == "__main__":
    sys.exit(main())
