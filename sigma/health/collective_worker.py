"""One rank of the intra-node collective bandwidth test: all_reduce a buffer and print bus bandwidth as JSON.

python -m sigma.health.collective_worker --rank R --world W --port P --backend gloo|nccl --size-mb N --iters K
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    p = argparse.ArgumentParser()
    for name, tp in (("--rank", int), ("--world", int), ("--port", int), ("--size-mb", int), ("--iters", int),
                     ("--threads", int)):
        p.add_argument(name, type=tp, required=name not in ("--threads",), default=1)
    p.add_argument("--backend", choices=("gloo", "nccl"), required=True)
    a = p.parse_args()
    import torch
    import torch.distributed as dist

    torch.set_num_threads(a.threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.port))
    device = torch.device(f"cuda:{a.rank}") if a.backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(a.backend, rank=a.rank, world_size=a.world)
    buf = torch.ones((a.size_mb << 20) // 4, dtype=torch.float32, device=device)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    dist.all_reduce(buf)  # warm-up builds the communicator
    sync()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(a.iters):
        dist.all_reduce(buf)
    sync()
    elapsed = (time.perf_counter() - t0) / a.iters
    # every element started at 1 and was summed over ranks (warm-up + iters times)
    expected = float(a.world) ** (a.iters + 1)
    correct = bool(torch.allclose(buf[:1024].cpu(), torch.full((1024,), expected)))
    algbw = buf.numel() * 4 / elapsed / 1e9
    busbw = algbw * 2 * (a.world - 1) / a.world
    print(json.dumps({"rank": a.rank, "algbw_gbps": algbw, "busbw_gbps": busbw, "correct": correct}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
