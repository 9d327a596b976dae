"""Intra-node collective bandwidth: all_reduce across local ranks (NCCL over GPUs, gloo on the CPU otherwise),
run as real separate processes; results checked for correctness and bus bandwidth against the baseline.

Only wrong sums name a part (NVLink for NCCL, the host's arithmetic for gloo). Ranks that do not finish in time are
a timeout and ranks that fail are an error: neither says which part is at fault (a loaded host, a port taken, a
missing library), so they follow the hook's tool_failure policy instead of blaming a part."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

from sigma.health.baselines import compare
from sigma.health.result import ERROR, TIMEOUT, Result, failed
from sigma.health.subproc import die_with_parent

CATEGORY = "performance"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def plan(gpu_count: int, ranks: int) -> tuple[str, int]:
    """NCCL across GPUs when there are at least two, else gloo across CPU processes."""
    if gpu_count >= 2:
        return "nccl", min(gpu_count, ranks) if ranks else gpu_count
    return "gloo", ranks or 2


def check_collective(outputs: list[dict], world: int, backend: str) -> Result | None:
    """None when every rank reported a correct sum; wrong sums blame the part that added them."""
    if len(outputs) != world:
        return Result(ERROR, f"{len(outputs)} of {world} ranks reported", "tool")
    wrong = [o["rank"] for o in outputs if not o.get("correct")]
    if wrong:
        return failed(f"all_reduce produced wrong sums on ranks {wrong}", "nvlink" if backend == "nccl" else
                      "host-memory")
    return None


def run(ctx, args: dict) -> Result:
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend, world = plan(gpus, int(args.get("ranks", 0)))
    port = _free_port()
    timeout = float(args.get("worker_timeout_s", 60))
    cmd = [sys.executable, "-m", "sigma.health.collective_worker", "--world", str(world), "--port", str(port),
           "--backend", backend, "--size-mb", str(args.get("size_mb", 64 if backend == "nccl" else 16)),
           "--iters", str(args.get("iters", 10)), "--threads", "1"]
    procs = [subprocess.Popen(cmd + ["--rank", str(r)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              preexec_fn=die_with_parent) for r in range(world)]
    outputs, errors, late = [], [], False
    deadline = time.monotonic() + timeout  # one limit for all ranks, not one per rank waited for
    try:
        for p in procs:
            out, err = p.communicate(timeout=max(0.0, deadline - time.monotonic()))
            if p.returncode != 0:
                errors.append(err.strip().splitlines()[-1] if err.strip() else f"exit {p.returncode}")
            for line in out.splitlines():
                if line.startswith("{"):
                    outputs.append(json.loads(line))
    except subprocess.TimeoutExpired:
        late = True
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    what = f"{backend} all_reduce with {world} ranks"
    if late:
        return Result(TIMEOUT, f"{what}: ranks did not finish within {timeout:g}s (worker_timeout_s)",
                      data={"backend": backend, "ranks": world})
    if errors:
        return Result(ERROR, f"{what} failed: {errors[0]}", "tool", data={"backend": backend, "ranks": world})
    wrong = check_collective(outputs, world, backend)
    if wrong is not None:
        return wrong
    busbw = min(o["busbw_gbps"] for o in outputs)
    label = f"{backend}x{world}"
    result = compare(ctx, f"allreduce_busbw_gbps:{label}", busbw, "GB/s", float(args.get("tolerance", 0.3)))
    result.data.update(backend=backend, ranks=world)
    return result
