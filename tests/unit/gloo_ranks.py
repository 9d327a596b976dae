"""Run a function on N gloo ranks, each a spawned process, and collect what each rank returns."""

import os
import queue as queues
import socket
import time

import torch
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(target, rank: int, world: int, port: int, queue, args) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        queue.put((rank, target(rank, *args)))  # plain Python values or numpy arrays: they travel by value
        dist.barrier()  # no rank tears gloo down while another still talks to it
    finally:
        dist.destroy_process_group()
    queue.close()
    queue.join_thread()  # the result is in the pipe
    os._exit(0)  # skip interpreter teardown: gloo's static destructors can abort a finished worker


def run_ranks(target, world: int, *args, timeout: float = 900) -> dict:
    """{rank: target(rank, *args)} from `world` processes in one gloo group; target must be importable."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(target, rank, world, port, queue, args)) for rank in range(world)]
    for p in procs:
        p.start()
    results, deadline = {}, time.monotonic() + timeout
    try:
        while len(results) < world:
            try:
                rank, value = queue.get(timeout=1)
                results[rank] = value
            except queues.Empty:
                failed = {rank: p.exitcode for rank, p in enumerate(procs) if p.exitcode not in (None, 0)}
                assert not failed, f"rank(s) exited before their result (exit codes {failed}; traceback on stderr)"
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no result from rank(s) {set(range(world)) - set(results)} in {timeout} s")
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    return results
