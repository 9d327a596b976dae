"""The GPU path: a CPU fp32 reference replayed on CUDA in bf16 (skipped where no GPU is visible, never faked)."""

import pytest
import torch

from sigma.train.numerics.check import check
from sigma.train.numerics.record import record
from sigma.train.train_config import load_train_config
from tests.conftest import REPO

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible")


def test_cpu_reference_passes_on_cuda_bf16(tmp_path):
    ref = tmp_path / "ref"
    record(load_train_config(str(REPO / "configs/train/debug.yaml")), ref, steps=3, data=("random",),
           log=lambda m: None)
    result = check(ref, device="cuda", dtype="bfloat16")
    assert result.device == "cuda"
    assert not result.flagged, result.to_dict()
