"""Every supported layout on gloo (CPU) trains like one process: same loss and gradient norm, step by step, and a
checkpoint written under one layout resumes under another (torch.distributed.checkpoint reshards)."""

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

STEPS = 3
OVERRIDES = {"n_layers": 4, "balance": "aux_free", "bias_update_speed": 0.01}
BATCH, SEQ = 8, 32

LAYOUTS = {
    "tp2": dict(tp=2),
    "pp2-1f1b": dict(pp=2),
    "pp2-gpipe-uneven": dict(pp=2, schedule="gpipe", pp_layers=[3, 1], microbatches=4),
    "pp2-vpp2": dict(pp=2, vpp=2, pp_layers=[1, 1, 1, 1], microbatches=2),
    "tp2-ep2": dict(world=4, tp=2, ep=2),
    "pp2-dp2": dict(world=4, pp=2),
    "pp2-ep2": dict(world=4, pp=2, ep=2),
}


def make_dims(layout, model_cfg):
    from sigma.train.dims import ParallelDims

    layout = dict(layout)
    world = layout.pop("world", 2)
    return ParallelDims.build(world, n_layers=model_cfg.n_layers, n_experts=model_cfg.n_experts,
                              n_heads=model_cfg.n_heads, n_kv_heads=model_cfg.n_kv_heads,
                              hidden_sizes={"expert_hidden": model_cfg.expert_hidden,
                                            "dense_hidden": model_cfg.dense_hidden}, global_batch=BATCH, **layout)


def batches():
    g = torch.Generator().manual_seed(5)
    from sigma.train.config import load_model_config

    vocab = load_model_config("debug", OVERRIDES).vocab_size
    return [torch.randint(0, vocab, (BATCH, SEQ + 1), generator=g) for _ in range(STEPS + 2)]


def run_steps(layout, rank, steps, ckpt_save=None, ckpt_load=None):
    """Train `steps` on a fresh build of `layout`; optionally load before / save after. Returns [(loss, gnorm)]."""
    from sigma.train.config import load_model_config
    from sigma.train.parallelize import build_optimizer, build_parallel, checkpoint_state, load_checkpoint, train_step
    from sigma.train.train_config import OptimConfig

    model_cfg = load_model_config("debug", OVERRIDES)
    dims = make_dims(layout, model_cfg)
    run = build_parallel(model_cfg, dims, rank, seed=0)
    optimizer, named, _ = build_optimizer(run, OptimConfig(fused=False, lr=3e-3, warmup_steps=0))
    data = batches()
    start = 0
    if ckpt_load:
        start = load_checkpoint(run, optimizer, named, ckpt_load)
    out = []
    for step in range(start, start + steps):
        loss, _, gnorm = train_step(run, optimizer, named, data[step], max_norm=1.0)
        out.append((loss, gnorm))
    if ckpt_save:
        import torch.distributed.checkpoint as dcp

        dcp.save(checkpoint_state(run, optimizer, named, start + steps), checkpoint_id=ckpt_save)
    return out


def worker(rank, world, port, layout, queue, steps, ckpt_save, ckpt_load):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        result = run_steps(layout, rank, steps, ckpt_save, ckpt_load)
        queue.put((rank, result))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    queue.close()
    queue.join_thread()
    os._exit(0)


def launch(layout, steps=STEPS, ckpt_save=None, ckpt_load=None):
    world = layout.get("world", 2)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, world, port, layout, queue, steps, ckpt_save, ckpt_load))
             for r in range(world)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


@pytest.fixture(scope="module")
def single():
    torch.set_num_threads(1)
    return run_steps({"world": 1}, 0, STEPS)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_one_process(single, name):
    results = launch(LAYOUTS[name])
    for rank, steps in results.items():
        for step, ((loss, gnorm), (ref_loss, ref_gnorm)) in enumerate(zip(steps, single)):
            assert loss == pytest.approx(ref_loss, abs=2e-5), (rank, step)
            assert gnorm == pytest.approx(ref_gnorm, rel=1e-4), (rank, step)


def test_checkpoint_reshards_across_layouts(single, tmp_path):
    """Two steps under pp2 x dp2, saved; the third step under tp2 x ep2 matches the one-process run's third."""
    launch(LAYOUTS["pp2-dp2"], steps=2, ckpt_save=str(tmp_path / "ckpt"))
    results = launch(LAYOUTS["tp2-ep2"], steps=1, ckpt_load=str(tmp_path / "ckpt"))
    for rank, steps in results.items():
        assert steps[0][0] == pytest.approx(single[2][0], abs=2e-5), rank
        assert steps[0][1] == pytest.approx(single[2][1], rel=1e-4), rank
