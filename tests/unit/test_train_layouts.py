"""Every supported layout on gloo (CPU) trains like one process: same loss and gradient norm, step by step, and a
checkpoint written under one layout resumes under another (torch.distributed.checkpoint reshards)."""

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from tests.unit.gloo_ranks import run_ranks

STEPS = 3
OVERRIDES = {"n_layers": 4, "balance": "aux_free", "bias_update_speed": 0.01}
BATCH, SEQ = 8, 32

WORLD = 4
# every layout on 4 ranks; dp fills what tp x pp leave
LAYOUTS = {
    "tp2-dp2": dict(tp=2),
    "tp2-ep2": dict(tp=2, ep=2),
    "pp2-dp2-1f1b": dict(pp=2),
    "pp2-dp2-gpipe-uneven": dict(pp=2, schedule="gpipe", pp_layers=[3, 1], microbatches=4),
    "pp2-dp2-vpp2": dict(pp=2, vpp=2, pp_layers=[1, 1, 1, 1], microbatches=2),
    "pp2-ep2": dict(pp=2, ep=2),
    "pp4": dict(pp=4, microbatches=4),
    "tp2-pp2": dict(tp=2, pp=2),
    "dp4-zero1": dict(shard_optimizer=True),
    "dp4-ep2-zero1": dict(ep=2, shard_optimizer=True),
    "pp2-dp2-zero1": dict(pp=2, shard_optimizer=True),
}
# the Switch aux loss is per micro-batch: compared with one process running the same 4 micro-batches of 2 rows
AUX_LOSS = {"balance": "aux_loss", "aux_loss_coef": 0.1}
AUX_LAYOUTS = {
    "pp2-dp2-aux-loss": dict(pp=2, model=AUX_LOSS),
    "tp2-ep2-mb2-aux-loss": dict(tp=2, ep=2, microbatches=2, model=AUX_LOSS),
}


def make_dims(layout, model_cfg):
    from sigma.train.dims import ParallelDims

    layout = dict(layout)
    world = layout.pop("world", WORLD)
    layout.pop("shard_optimizer", None)
    layout.pop("model", None)
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

    model_cfg = load_model_config("debug", {**OVERRIDES, **layout.get("model", {})})
    dims = make_dims(layout, model_cfg)
    run = build_parallel(model_cfg, dims, rank, seed=0)
    optimizer, named, _ = build_optimizer(run, OptimConfig(fused=False, lr=3e-3, warmup_steps=0),
                                          shard=layout.get("shard_optimizer", False))
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


def run_jobs(rank, jobs):
    import torch.distributed as dist

    results = {}
    for name, layout, steps, save, load in jobs:
        try:
            results[name] = run_steps(layout, rank, steps, save, load)
        except Exception as exc:  # reported per layout; the other layouts still run
            results[name] = f"{type(exc).__name__}: {exc}"
        dist.barrier()
    return results


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """All layouts in one 4-rank process group (one start-up); then pp2 x dp2 saves, tp2 x ep2 resumes."""
    ckpt = str(tmp_path_factory.mktemp("ckpt") / "step-2")
    jobs = [(name, layout, STEPS, None, None) for name, layout in {**LAYOUTS, **AUX_LAYOUTS}.items()]
    jobs += [("save pp2-dp2", LAYOUTS["pp2-dp2-zero1"], 2, ckpt, None),
             ("resume tp2-ep2", LAYOUTS["tp2-ep2"], 1, None, ckpt)]
    return run_ranks(run_jobs, WORLD, jobs)


@pytest.fixture(scope="module")
def single():
    torch.set_num_threads(1)
    return run_steps({"world": 1}, 0, STEPS)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_one_process(layouts, single, name):
    for rank in range(WORLD):
        steps = layouts[rank][name]
        assert not isinstance(steps, str), f"rank {rank}: {steps}"
        for step, ((loss, gnorm), (ref_loss, ref_gnorm)) in enumerate(zip(steps, single)):
            assert loss == pytest.approx(ref_loss, abs=2e-5), (rank, step)
            assert gnorm == pytest.approx(ref_gnorm, rel=1e-4), (rank, step)


def test_checkpoint_reshards_across_layouts(layouts, single):
    """Two steps under pp2 x dp2 with ZeRO-1, saved; the third under tp2 x ep2 matches the one-process third."""
    for rank in range(WORLD):
        saved = layouts[rank]["save pp2-dp2"]
        assert [x for pair in saved for x in pair] == pytest.approx([x for pair in single[:2] for x in pair], rel=1e-4)
        (loss, gnorm), = layouts[rank]["resume tp2-ep2"]
        assert loss == pytest.approx(single[2][0], abs=2e-5), rank
        assert gnorm == pytest.approx(single[2][1], rel=1e-4), rank


@pytest.mark.parametrize("name", list(AUX_LAYOUTS))
def test_aux_loss_reaches_backward_under_every_layout(layouts, name):
    torch.set_num_threads(1)
    reference = run_steps({"world": 1, "microbatches": 4, "model": AUX_LOSS}, 0, STEPS)
    for rank in range(WORLD):
        steps = layouts[rank][name]
        assert not isinstance(steps, str), f"rank {rank}: {steps}"
        for step, ((loss, gnorm), (ref_loss, ref_gnorm)) in enumerate(zip(steps, reference)):
            assert loss == pytest.approx(ref_loss, abs=2e-5), (rank, step)
            assert gnorm == pytest.approx(ref_gnorm, rel=1e-4), (rank, step)


# ---------------------------------------------------------------- the real trainer loop under layouts

LOOP_STEPS = 4


def loop_overrides(data, ckpt_dir, steps=LOOP_STEPS):
    """debug with 4 layers, aux-free balancing; eval, MoE norms and a checkpoint every 2 steps. A constant LR: a
    run of 2 steps and one of 4 take the same first two steps."""
    return [f"data.path={data}", "data.prepare_if_missing=false", "data.seq_len=32", "data.global_batch=8",
            "threads=1", "kpi.progress_every=0", f"checkpoint.dir={ckpt_dir}", "checkpoint.every=2",
            f"steps={steps}", "optim.warmup_steps=0", "optim.min_lr=3e-3", "model_overrides.n_layers=4",
            "model_overrides.balance=aux_free", "model_overrides.bias_update_speed=0.01", "kpi.param_norm_every=2",
            "eval.every=2", "eval.batches=1"]


def loop_worker(rank, ports, kpi_dir, jobs, queue):
    """One rank of every job in turn, each a real sigma.train.trainer.train() joining its own process group."""
    from sigma.train.train_config import load_train_config
    from sigma.train.trainer import train

    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      SIGMA_KPI_DIR=str(kpi_dir))
    errors = {}
    for (name, overrides), port in zip(jobs, ports):
        os.environ.update(MASTER_PORT=str(port), SIGMA_JOB_ID=str(JOB_IDS[name]))
        try:
            train(load_train_config(DEBUG_PRESET, overrides))
        except Exception as exc:  # reported per job; the later jobs still run
            errors[name] = f"{type(exc).__name__}: {exc}"
    queue.put((rank, errors))
    queue.close()
    queue.join_thread()
    os._exit(0)


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


from sigma.paths import configs_dir  # noqa: E402

DEBUG_PRESET = configs_dir() / "train" / "debug.yaml"
JOB_IDS = {"single": 1, "vpp": 2, "zero1": 3, "resume": 4}  # the KPI files' job ids


def metric_lines(kpi_dir, job, rank):
    from sigma.train.kpi import read_kpis

    path, = (kpi_dir / f"job-{JOB_IDS[job]}").glob(f"rank-{rank}.*.jsonl")
    rows = read_kpis(path)
    return {r["step"]: r for r in rows if "event" not in r}, [r for r in rows if "event" in r]


@pytest.fixture(scope="module")
def loop_runs(train_data, tmp_path_factory):
    """One-process reference; then on 4 ranks: pp2 x dp2 with interleaved 1F1B (vpp2) and MoE layers 2 and 3
    recomputed for all steps, and tp2 x ep2
    with ZeRO-1 for 2 steps whose checkpoint a pp2 x dp2 GPipe run with an uneven split resumes."""
    from sigma.train.train_config import load_train_config
    from sigma.train.trainer import train

    tmp = tmp_path_factory.mktemp("loop")
    kpi_dir = tmp / "kpi"
    os.environ.update(SIGMA_KPI_DIR=str(kpi_dir), SIGMA_JOB_ID=str(JOB_IDS["single"]))
    try:
        torch.set_num_threads(1)
        train(load_train_config(DEBUG_PRESET, loop_overrides(train_data, tmp / "single")))
    finally:
        del os.environ["SIGMA_KPI_DIR"], os.environ["SIGMA_JOB_ID"]
    resharded = tmp / "resharded"
    jobs = [("vpp", loop_overrides(train_data, tmp / "vpp") + [
                "parallel.pp=2", "parallel.vpp=2", "parallel.microbatches=2", "parallel.recompute.moe_layers=[2, 3]"]),
            ("zero1", loop_overrides(train_data, resharded, steps=2) + [
                "parallel.tp=2", "parallel.ep=2", "parallel.shard_optimizer=true"]),
            ("resume", loop_overrides(train_data, resharded) + [
                "parallel.pp=2", "parallel.pp_schedule=gpipe", "parallel.pp_layers=[3, 1]",
                "parallel.microbatches=2"])]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    ports = free_ports(len(jobs))
    procs = [ctx.Process(target=loop_worker, args=(r, ports, kpi_dir, jobs, queue)) for r in range(WORLD)]
    for p in procs:
        p.start()
    errors = dict(queue.get(timeout=900) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return kpi_dir, errors


def test_trainer_loop_under_interleaved_pipeline_matches_one_process(loop_runs):
    kpi_dir, errors = loop_runs
    assert not any(errors.values()), errors
    single, _ = metric_lines(kpi_dir, "single", 0)
    for rank in range(WORLD):
        steps, events = metric_lines(kpi_dir, "vpp", rank)
        assert sorted(steps) == list(range(1, LOOP_STEPS + 1))
        for step, one in single.items():
            many = steps[step]
            assert many["loss"] == pytest.approx(one["loss"], abs=2e-5), (rank, step)
            assert many["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4), (rank, step)
            assert many["expert_load"] == one["expert_load"], (rank, step)
            assert 0.0 <= many["bubble"] < 1.0 and many["stage_busy_s"] <= many["pipeline_s"]
        for step in (2, 4):
            assert steps[step]["moe_param_norm"] == pytest.approx(single[step]["moe_param_norm"], rel=1e-4)
            assert steps[step]["eval_loss"] == pytest.approx(single[step]["eval_loss"], abs=2e-5)
        start, = [e for e in events if e["event"] == "start"]
        assert start["layout"] == "dp2 tp1 pp2 ep1 vpp2 interleaved_1f1b mb2 layers[1, 1, 1, 1]"
        if rank == 0:  # the rank that reports the saves
            assert [e["step"] for e in events if e["event"] == "checkpoint"] == [2, 4]


def test_trainer_checkpoint_of_one_layout_resumes_under_another(loop_runs):
    """tp2 x ep2 with ZeRO-1 saves at step 2; pp2 x dp2 (GPipe, layers [3, 1]) resumes: steps 3 and 4 as one process."""
    kpi_dir, errors = loop_runs
    assert not any(errors.values()), errors
    single, _ = metric_lines(kpi_dir, "single", 0)
    for rank in range(WORLD):
        first, _ = metric_lines(kpi_dir, "zero1", rank)
        assert [first[s]["loss"] for s in (1, 2)] == pytest.approx([single[s]["loss"] for s in (1, 2)], abs=2e-5)
        resumed, events = metric_lines(kpi_dir, "resume", rank)
        assert sorted(resumed) == [3, 4]
        assert [e["step"] for e in events if e["event"] == "resume"] == [2]
        for step in (3, 4):
            assert resumed[step]["loss"] == pytest.approx(single[step]["loss"], abs=2e-5), (rank, step)
            assert resumed[step]["grad_norm"] == pytest.approx(single[step]["grad_norm"], rel=1e-4), (rank, step)
