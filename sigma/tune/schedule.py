"""How long a pipeline's run lasts: each pipeline rank runs its schedule's forwards and backwards in order, waits
for its neighbours' activations and gradients, and, where ranks share cores, computes slower the more ranks compute
at once.

    pipeline_time(stage_s, pp, vpp, microbatches, p2p_s, sharing)   # seconds of forward + backward of one step

A closed form ((m + (p - 1) / v) x the slowest rank's time per micro-batch) is exact only when every rank computes
at one speed. On a machine where the ranks share cores (phase 1 measures `sharing`: how much slower a rank computes
while every rank does), the ranks that wait in the pipeline's fill and drain leave their share of the cores to the
others, which then run faster. So the run is simulated: processor sharing, every rank's current task advancing at
min(1, pp / (sharing x ranks computing)) of its lone speed (the dp x tp copies of a pipeline rank compute in step).
"""

from __future__ import annotations

FORWARD_SHARE = 1 / 3  # a layer's backward costs about twice its forward


def rank_order(rank: int, pp: int, vpp: int, microbatches: int) -> list[tuple[str, int, int]]:
    """The (F or B, stage, micro-batch) tasks of a pipeline rank in the order 1F1B (vpp 1) or Megatron's
    interleaved 1F1B (vpp > 1, micro-batches in groups of pp) runs them."""
    m, n = microbatches, microbatches * vpp

    def task(kind: str, k: int) -> tuple[str, int, int]:
        chunk = (k // pp) % vpp
        if kind == "B":
            chunk = vpp - 1 - chunk
        return kind, chunk * pp + rank, (k // (pp * vpp)) * pp + k % pp

    if vpp == 1:
        warmup = min(m, pp - rank - 1)
        order = [("F", rank, i) for i in range(warmup)]
        for i in range(m - warmup):
            order += [("F", rank, warmup + i), ("B", rank, i)]
        return order + [("B", rank, i) for i in range(m - warmup, m)]
    warmup = min(n, (pp - rank - 1) * 2 + (vpp - 1) * pp)
    order = [task("F", k) for k in range(warmup)]
    for i in range(n - warmup):
        order += [task("F", warmup + i), task("B", i)]
    return order + [task("B", k) for k in range(n - warmup, n)]


def pipeline_time(stage_s: list[float], pp: int, vpp: int, microbatches: int, p2p_s: float = 0.0,
                  sharing: float = 1.0) -> float:
    """stage_s: lone seconds of forward + backward of one micro-batch per stage (pp x vpp of them, stage s on rank
    s % pp); p2p_s: one send of activations or gradients between ranks. Seconds from the first forward to the
    last backward."""
    n_stages = pp * vpp
    if vpp > 1 and microbatches % pp:
        raise ValueError(f"interleaved 1F1B needs micro-batches ({microbatches}) divisible by pp ({pp})")
    orders = [rank_order(r, pp, vpp, microbatches) for r in range(pp)]
    work = {"F": [s * FORWARD_SHARE for s in stage_s], "B": [s * (1 - FORWARD_SHARE) for s in stage_s]}
    done: dict[tuple[str, int, int], float] = {}
    pos = [0] * pp
    left = [work[o[0][0]][o[0][1]] if o else 0.0 for o in orders]
    now = 0.0

    def ready_at(task) -> float | None:
        """When the inputs of a task have arrived (None: not yet produced)."""
        kind, stage, mb = task
        deps = []
        if kind == "F" and stage > 0:
            deps.append((("F", stage - 1, mb), p2p_s))
        if kind == "B":
            deps.append((("F", stage, mb), 0.0))
            if stage < n_stages - 1:
                deps.append((("B", stage + 1, mb), p2p_s))
        at = 0.0
        for dep, delay in deps:
            if dep not in done:
                return None
            at = max(at, done[dep] + delay)
        return at

    while any(pos[r] < len(orders[r]) for r in range(pp)):
        running, arrivals = [], []
        for r in range(pp):
            if pos[r] < len(orders[r]):
                at = ready_at(orders[r][pos[r]])
                if at is not None and at <= now + 1e-12:
                    running.append(r)
                elif at is not None:
                    arrivals.append(at)
        if not running:
            if not arrivals:
                raise RuntimeError("pipeline schedule deadlocked")  # a bug in rank_order, never the input
            now = min(arrivals)
            continue
        speed = min(1.0, pp / (sharing * len(running)))
        dt = min(left[r] / speed for r in running)
        if arrivals:
            dt = min(dt, min(arrivals) - now)
        now += dt
        for r in running:
            left[r] -= dt * speed
            if left[r] <= 1e-12:
                done[orders[r][pos[r]]] = now
                pos[r] += 1
                if pos[r] < len(orders[r]):
                    kind, stage, _ = orders[r][pos[r]]
                    left[r] = work[kind][stage]
    return now
