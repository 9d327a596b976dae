"""2 and 4 ranks on CPU over gloo (torchrun): data parallel, expert parallel (also with an expert-data-parallel group
larger than one) and global-batch load balancing equal the one-process run."""

import os
import subprocess
import sys

import pytest

from sigma.paths import configs_dir
from sigma.train.kpi import read_kpis
from sigma.train.train_config import load_train_config

DEBUG = configs_dir() / "train" / "debug.yaml"
STEPS = 8


def common(train_data, ckpt_dir):
    # aux-free balancing: the Switch aux loss is computed from each rank's own tokens, so it (legitimately)
    # differs between 1 and 2 ranks; the expert-bias update uses loads summed over ranks and must agree.
    return [f"data.path={train_data}", "data.prepare_if_missing=false", "data.seq_len=32", "data.global_batch=4",
            "threads=1", "kpi.progress_every=0", f"checkpoint.dir={ckpt_dir}", f"steps={STEPS}",
            "optim.warmup_steps=2", "model_overrides.balance=aux_free", "model_overrides.bias_update_speed=0.01",
            "kpi.param_norm_every=4"]


@pytest.fixture(scope="module")
def single(train_data, tmp_path_factory):
    from sigma.train.trainer import train

    tmp = tmp_path_factory.mktemp("single")
    os.environ["SIGMA_KPI_DIR"] = str(tmp / "kpi")
    try:
        summary = train(load_train_config(DEBUG, common(train_data, tmp / "ckpt")))
    finally:
        del os.environ["SIGMA_KPI_DIR"]
    return {r["step"]: r for r in read_kpis(summary.kpi_path) if "event" not in r}


def torchrun(tmp_path, args, nproc=2):
    env = {**os.environ, "SIGMA_KPI_DIR": str(tmp_path / "kpi"), "SIGMA_JOB_ID": "77", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                           str(nproc), "-m", "sigma.train.trainer", "--config", str(DEBUG), *args],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    node = os.uname().nodename
    return [{r["step"]: r for r in read_kpis(tmp_path / "kpi" / "job-77" / f"rank-{rank}.{node}.jsonl")
             if "event" not in r} for rank in range(nproc)]


@pytest.mark.parametrize("nproc, ep", [(2, 1), (2, 2), (4, 2)], ids=["dp2", "dp2-ep2", "dp4-ep2-edp2"])
def test_ranks_equal_one_rank(single, train_data, tmp_path, nproc, ep):
    # 4 ranks with ep=2: two expert-data-parallel replicas of every expert shard, whose gradients must be summed
    ranks = torchrun(tmp_path, common(train_data, tmp_path / "ckpt") + [f"parallel.ep={ep}"], nproc)
    for rank in ranks:
        assert sorted(rank) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        one, many = single[step], ranks[0][step]
        assert many["loss"] == pytest.approx(one["loss"], abs=2e-5), step
        assert many["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4), step
        assert many["expert_load"] == one["expert_load"], step  # same routing of the same global batch
        assert all(r[step]["loss"] == many["loss"] for r in ranks)  # every rank logs the global loss
    for step in (4, 8):
        assert ranks[0][step]["moe_param_norm"] == pytest.approx(single[step]["moe_param_norm"], rel=1e-4)
        assert ranks[-1][step]["moe_param_norm"] == ranks[0][step]["moe_param_norm"]  # replicas stay equal
    # the checkpoint of the sharded run holds the whole model: a one-rank run resumes from it
    from sigma.train.trainer import train

    os.environ["SIGMA_KPI_DIR"] = str(tmp_path / "kpi1")
    try:
        resumed = train(load_train_config(DEBUG, common(train_data, tmp_path / "ckpt") + [f"steps={STEPS + 2}"]))
    finally:
        del os.environ["SIGMA_KPI_DIR"]
    assert resumed.start_step == STEPS and sorted(resumed.losses) == [STEPS + 1, STEPS + 2]


def test_global_batch_balancing_loss_equals_the_one_process_loss(train_data, tmp_path):
    """With expert fractions summed over ranks, the mean of the ranks' Switch losses is the whole batch's."""
    from sigma.train.trainer import train

    aux = [f"data.path={train_data}", "data.prepare_if_missing=false", "data.seq_len=32", "data.global_batch=4",
           "threads=1", "kpi.progress_every=0", "steps=3", "optim.warmup_steps=1", "model_overrides.balance=aux_loss",
           "model_overrides.aux_loss_coef=0.5", "checkpoint.every=0", "eval.every=0"]
    os.environ["SIGMA_KPI_DIR"] = str(tmp_path / "kpi1")
    try:
        one = train(load_train_config(DEBUG, aux + [f"checkpoint.dir={tmp_path / 'c1'}"]))
    finally:
        del os.environ["SIGMA_KPI_DIR"]
    one = {r["step"]: r for r in read_kpis(one.kpi_path) if "event" not in r}
    scoped = torchrun(tmp_path / "g", aux + [f"checkpoint.dir={tmp_path / 'c2'}",
                                             "model_overrides.balance_scope=global_batch"])
    local = torchrun(tmp_path / "m", aux + [f"checkpoint.dir={tmp_path / 'c3'}"])
    assert scoped[0][1]["aux_loss"] == pytest.approx(one[1]["aux_loss"], rel=1e-5)
    assert scoped[0][3]["loss"] == pytest.approx(one[3]["loss"], abs=2e-5)
    assert local[0][1]["aux_loss"] != pytest.approx(one[1]["aux_loss"], rel=2e-5)  # per-rank fractions differ


def test_rendezvous_port_is_per_cluster_and_equal_on_every_rank():
    from sigma.train.parallel import master_port

    assert master_port("7", "/etc/slurm/slurm.conf") == master_port("7", "/etc/slurm/slurm.conf")
    ports = {master_port("7", f"/clusters/{c}/slurm.conf") for c in "abcdefgh"}
    assert len(ports) > 1 and all(20000 <= p <= 60000 for p in ports)
