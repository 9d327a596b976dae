"""ParallelDims: every wrong combination is a ConfigError naming the key and the numbers, before any process group."""

import pytest

from sigma.config import ConfigError
from sigma.paths import configs_dir
from sigma.train.dims import ParallelDims, even_split
from sigma.train.train_config import check_layout, load_train_config

MODEL = dict(n_layers=8, n_experts=8, n_heads=8, n_kv_heads=4, hidden_sizes={"expert_hidden": 64}, global_batch=16)


def build(world, **kw):
    return ParallelDims.build(world, **{**MODEL, **kw})


def test_valid_layouts_and_rank_coordinates():
    dims = build(16, tp=2, pp=2, ep=2, vpp=2, microbatches=4, pp_layers=[3, 2, 2, 1])
    assert (dims.dp, dims.edp, dims.n_stages, dims.schedule) == (4, 2, 4, "interleaved_1f1b")
    assert dims.mesh_shape == (2, 2, 2, 2)
    assert dims.coords(0) == {"tp": 0, "ep": 0, "edp": 0, "pp": 0, "dp": 0}
    assert dims.coords(1)["tp"] == 1 and dims.coords(2)["ep"] == 1 and dims.coords(4)["edp"] == 1
    assert dims.coords(8)["pp"] == 1 and dims.coords(6)["dp"] == 3
    assert dims.stages_of(1) == [1, 3]
    assert dims.layers_of_stage(0) == [0, 1, 2] and dims.layers_of_stage(3) == [7]
    assert build(4, pp=2).stage_layers == (4, 4) and build(4, pp=2).microbatches == 2
    assert even_split(7, 3) == [3, 2, 2]


@pytest.mark.parametrize("kw, key, text", [
    (dict(world=6, tp=2, pp=2), "parallel.tp",
     "world size 6 .* not divisible by parallel.tp x parallel.pp = 2 x 2 = 4"),
    (dict(world=8, tp=2, pp=2, ep=4), "parallel.ep", "parallel.ep=4 must divide the data-parallel degree dp = "
                                                     "world size 8 / \\(tp 2 x pp 2\\) = 2"),
    (dict(world=3, ep=3), "parallel.ep", "8 routed experts cannot be split over parallel.ep=3"),
    (dict(world=3, tp=3), "parallel.tp", "parallel.tp=3 must divide the model's n_heads=8"),
    (dict(world=6, global_batch=16), "data.global_batch", "global_batch 16 is not divisible by the 6 data-parallel"),
    (dict(world=2, vpp=2), "parallel.vpp", "vpp=2 needs pipeline parallelism"),
    (dict(world=2, pp=2, vpp=2, schedule="1f1b"), "parallel.pp_schedule", "needs pp_schedule interleaved_1f1b"),
    (dict(world=2, pp=2, schedule="interleaved_1f1b"), "parallel.vpp", "needs parallel.vpp >= 2"),
    (dict(world=2, pp=2, pp_layers=[5, 2]), "parallel.pp_layers", "\\[5, 2\\] sum to 7, but the model has n_layers=8"),
    (dict(world=2, pp=2, pp_layers=[8]), "parallel.pp_layers", "1 entries for pp x vpp = 2 x 1 = 2 stages"),
    (dict(world=2, pp=2, pp_layers=[8, 0]), "parallel.pp_layers", "at least one layer"),
    (dict(world=4, pp=4, vpp=4, microbatches=4), "parallel.vpp", "16 stages need at least 16 layers"),
    (dict(world=2, pp=2, microbatches=1), "parallel.microbatches", "1 micro-batches cannot fill a 2-stage pipeline"),
    (dict(world=4, pp=4, vpp=2, microbatches=6, global_batch=12), "parallel.microbatches",
     "rounds of pp=4; 6 is not a multiple of 4"),
    (dict(world=2, pp=2, microbatches=5), "parallel.microbatches", "16 sequences per data-parallel rank .* 5 micro"),
    (dict(world=2, pp=2, tie_embeddings=True), "parallel.pp", "tie_embeddings"),
    (dict(world=2, pp=2, schedule="zb"), "parallel.pp_schedule", "unknown schedule 'zb'"),
])
def test_wrong_layouts_name_key_and_numbers(kw, key, text):
    kw = dict(kw)
    world = kw.pop("world")
    with pytest.raises(ConfigError, match=text) as err:
        build(world, **kw)
    assert err.value.where == f"[{key}]"


def test_check_layout_uses_the_model_preset():
    cfg = load_train_config(configs_dir() / "train" / "debug.yaml",
                            ["parallel.pp=2", "parallel.pp_layers=[1, 1]", "parallel.microbatches=2"])
    dims = check_layout(cfg, 4, 4)
    assert (dims.dp, dims.pp, dims.stage_layers) == (2, 2, (1, 1))
    cfg = load_train_config(configs_dir() / "train" / "debug.yaml", ["parallel.pp=2", "parallel.pp_layers=[2, 1]"])
    with pytest.raises(ConfigError, match="sum to 3, but the model has n_layers=2"):
        check_layout(cfg, 2, 4)


@pytest.mark.parametrize("micro_batch, microbatches, pp, expected", [
    (0, 0, 1, 1),  # the rank's whole share in one
    (0, 0, 2, 2),  # a pipeline fills its stages
    (4, 0, 1, 4),  # 16 sequences per rank in micro-batches of 4
    (2, 0, 2, 8),
    (0, 4, 1, 4),
    (4, 4, 2, 4),  # both keys, agreeing
])
def test_micro_batch_size_and_count_are_one_split(micro_batch, microbatches, pp, expected):
    dims = build(pp, pp=pp, micro_batch=micro_batch, microbatches=microbatches)
    assert dims.microbatches == expected


@pytest.mark.parametrize("kw, key, text", [
    (dict(micro_batch=4, microbatches=2), "data.micro_batch",
     "parallel.microbatches=2 micro-batches of data.micro_batch=4 sequences are 8, but the 16 sequences"),
    (dict(micro_batch=5), "data.micro_batch", "micro_batch 5 does not divide the 16 sequences per data-parallel"),
    (dict(pp=2, micro_batch=16), "data.micro_batch",
     "1 micro-batches \\(data.micro_batch=16 of 16 sequences\\) cannot fill a 2-stage pipeline"),
    (dict(pp=4, vpp=2, micro_batch=2, global_batch=12), "data.micro_batch",
     "rounds of pp=4; 6 \\(data.micro_batch=2 of 12 sequences\\) is not a multiple of 4"),
    (dict(micro_batch=-1), "data.micro_batch", "non-negative integer"),
    (dict(microbatches=-2), "parallel.microbatches", "non-negative integer"),
])
def test_micro_batch_combinations_that_cannot_run(kw, key, text):
    kw = dict(kw)
    world = kw.get("pp", 1)
    with pytest.raises(ConfigError, match=text) as err:
        build(world, **kw)
    assert err.value.where == f"[{key}]"


def test_check_layout_reconciles_the_data_and_parallel_keys():
    path = configs_dir() / "train" / "debug.yaml"
    cfg = load_train_config(path, ["data.global_batch=8", "data.micro_batch=2", "parallel.pp=2"])
    assert check_layout(cfg, 2, 4).microbatches == 4
    cfg = load_train_config(path, ["data.global_batch=8", "data.micro_batch=1", "parallel.microbatches=2"])
    with pytest.raises(ConfigError, match="are 2, but the 4 sequences per data-parallel rank") as err:
        check_layout(cfg, 2, 4)
    assert err.value.where == "[data.micro_batch]"
