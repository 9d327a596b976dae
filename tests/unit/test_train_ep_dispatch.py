"""The capacity expert-parallel dispatch on 2 gloo ranks: no value is read back to the host in a MoE model's forward
and backward, it trains like one process when no token is over capacity, and tokens over capacity are dropped
(zero expert output, zero gradient) and counted exactly."""

import pytest
import torch

from tests.unit.gloo_ranks import run_ranks
from tests.unit.test_train_expert_parallel import DIM, E, local_experts, reference_experts

# tokens per expert on each rank (top_k 1): rank 0 sends expert 2 more rows than a capacity factor of 1 allows
COUNTS = {0: [3, 1, 6, 0], 1: [2, 4, 0, 2]}
STEPS, BATCH, SEQ = 3, 4, 32
OVERRIDES = {"n_layers": 3, "balance": "aux_free", "bias_update_speed": 0.01}
HOST_READS = ("tolist", "item", "__bool__", "nonzero", "__int__", "__float__", "__index__")


def inputs(rank):
    torch.manual_seed(10 + rank)
    return torch.randn(sum(COUNTS[rank]), DIM)


def batches(vocab):
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, vocab, (BATCH, SEQ + 1), generator=g) for _ in range(STEPS)]


class HostReadError(RuntimeError):
    """A tensor value was read back to the host inside the expert-parallel forward or backward."""


def _forbid_host_reads(monkeypatch_like: dict):
    """Make every Python-level way of reading a tensor's value raise (restored by the caller)."""
    for name in HOST_READS:
        monkeypatch_like[name] = getattr(torch.Tensor, name)

        def refuse(self, *args, _name=name, **kwargs):
            raise HostReadError(f"Tensor.{_name} called inside the expert-parallel forward/backward")
        setattr(torch.Tensor, name, refuse)


def _restore(saved: dict):
    for name, fn in saved.items():
        setattr(torch.Tensor, name, fn)


def direct_dispatch(rank):
    """ExpertParallel on COUNTS with capacity 4 per expert and rank, in 2 chunks of 2."""
    from sigma.train.parallel import EPDispatch, ExpertParallel

    local = local_experts(rank)
    # capacity 4 on both ranks: ceil(1.6 x 10 / 4) and ceil(1.6 x 8 / 4), in 2 chunks of 2 (every rank of an ep
    # group must send the same buffer: the trainer's micro-batches have one shape)
    options = EPDispatch("capacity", capacity_factor=1.6, chunks=2)
    ep = ExpertParallel(local, None, 2, E, 1, options)
    x = inputs(rank).requires_grad_()
    y = ep(x, torch.tensor(COUNTS[rank]))
    (y * torch.arange(1, y.numel() + 1, dtype=y.dtype).view_as(y)).sum().backward()
    return {"y": y.detach().numpy(), "x_grad": x.grad.numpy(), "w1_grad": local.w1.grad.numpy(),
            "capacity": options.capacity(x.shape[0], E, 1), "dropped": ep.take_dropped()}


def model_steps(rank, options, recompute=()):
    """STEPS optimiser steps of `debug` under dp2 x ep2; the first forward and backward with host reads refused.
    recompute: MoE layers whose forward (dispatch included) runs again in backward."""
    from sigma.train.config import load_model_config
    from sigma.train.dims import ParallelDims
    from sigma.train.parallelize import build_optimizer, build_parallel, train_step
    from sigma.train.train_config import OptimConfig

    cfg = load_model_config("debug", OVERRIDES)
    dims = ParallelDims.build(2, ep=2, n_layers=cfg.n_layers, n_experts=cfg.n_experts, n_heads=cfg.n_heads,
                              n_kv_heads=cfg.n_kv_heads, global_batch=BATCH)
    run = build_parallel(cfg, dims, rank, seed=0, ep_dispatch=options, recompute_layers=list(recompute))
    optimizer, named, _ = build_optimizer(run, OptimConfig(fused=False, lr=3e-3, warmup_steps=0))
    data = batches(cfg.vocab_size)
    rows = data[0][rank * 2:(rank + 1) * 2]
    saved = {}
    error = None
    _forbid_host_reads(saved)
    try:
        logits, aux = run.module(rows[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1))
        (loss + aux).backward()
    except HostReadError as e:
        error = str(e)
    finally:
        _restore(saved)
    optimizer.zero_grad(set_to_none=True)
    from sigma.train.parallel import dropped_tokens

    dropped_tokens(run.moe_by_id.values())  # forget the probe forward
    out = []
    for batch in data:
        loss, _, gnorm = train_step(run, optimizer, named, batch, max_norm=1.0)
        out.append((loss, gnorm, run.kpi.get("dropped_tokens")))
    return {"host_read": error, "steps": out}


def all_dispatches(rank):
    from sigma.train.parallel import EPDispatch

    return {"direct": direct_dispatch(rank),
            "capacity": model_steps(rank, EPDispatch("capacity")),
            "one_chunk_recompute": model_steps(rank, EPDispatch("capacity", chunks=1), recompute=(1, 2)),
            "dropless": model_steps(rank, EPDispatch("dropless"))}


@pytest.fixture(scope="module")
def results():
    return run_ranks(all_dispatches, 2)


def one_process_steps():
    from sigma.train.config import load_model_config
    from sigma.train.dims import ParallelDims
    from sigma.train.parallelize import build_optimizer, build_parallel, train_step
    from sigma.train.train_config import OptimConfig

    cfg = load_model_config("debug", OVERRIDES)
    dims = ParallelDims.build(1, n_layers=cfg.n_layers, n_experts=cfg.n_experts, n_heads=cfg.n_heads,
                              n_kv_heads=cfg.n_kv_heads, global_batch=BATCH, microbatches=2)
    run = build_parallel(cfg, dims, 0, seed=0)
    optimizer, named, _ = build_optimizer(run, OptimConfig(fused=False, lr=3e-3, warmup_steps=0))
    return [train_step(run, optimizer, named, batch, max_norm=1.0) for batch in batches(cfg.vocab_size)]


def test_capacity_dispatch_reads_nothing_back_to_the_host(results):
    for rank in (0, 1):
        assert results[rank]["capacity"]["host_read"] is None
        assert results[rank]["one_chunk_recompute"]["host_read"] is None
        # the probe is live: the dropless dispatch reads its split sizes
        assert "Tensor.tolist" in results[rank]["dropless"]["host_read"]


def test_capacity_dispatch_trains_like_one_process(results):
    """dp2 x ep2 with the default capacity factor, which cannot drop here (E / top_k = 2), matches one process
    running the same two micro-batches of 2 rows: loss and gradient norm at every step, chunked or not (and with
    the MoE layers recomputed in backward, which dispatches again), and so does the dropless dispatch."""
    torch.set_num_threads(1)
    reference = one_process_steps()
    for mode in ("capacity", "one_chunk_recompute", "dropless"):
        for rank in (0, 1):
            for (loss, gnorm, dropped), (ref_loss, _, ref_gnorm) in zip(results[rank][mode]["steps"], reference):
                assert loss == pytest.approx(ref_loss, abs=2e-5), mode
                assert gnorm == pytest.approx(ref_gnorm, rel=1e-4), mode
                assert dropped == (None if mode == "dropless" else 0.0)


def test_tokens_over_capacity_are_dropped_and_counted(results):
    full = reference_experts()
    w1_grad = torch.zeros_like(full.w1)
    for rank in (0, 1):
        r = results[rank]["direct"]
        capacity = r["capacity"]
        assert capacity == 4
        counts = COUNTS[rank]
        # rows beyond the first `capacity` of each expert get no expert output and no gradient
        kept = torch.cat([torch.arange(c) < capacity for c in counts])
        assert r["dropped"] == (float(sum(max(0, c - capacity) for c in counts)), sum(counts))
        full.zero_grad()
        x = inputs(rank).requires_grad_()
        y = full(x * kept.unsqueeze(1), torch.tensor(counts)) * kept.unsqueeze(1)
        (y * torch.arange(1, y.numel() + 1, dtype=y.dtype).view_as(y)).sum().backward()
        torch.testing.assert_close(torch.from_numpy(r["y"]), y.detach(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(torch.from_numpy(r["x_grad"]), x.grad, atol=1e-5, rtol=1e-5)
        w1_grad += full.w1.grad
    assert results[0]["direct"]["dropped"][0] == 2.0  # expert 2 got 6 rows for 4 places
    assert results[1]["direct"]["dropped"][0] == 0.0
    for rank in (0, 1):
        torch.testing.assert_close(torch.from_numpy(results[rank]["direct"]["w1_grad"]),
                                   w1_grad[rank * 2:(rank + 1) * 2], atol=1e-5, rtol=1e-5)
