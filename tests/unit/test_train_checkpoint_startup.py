"""What a restart's start-up does not pay for: the trainer's optimiser is torch's AdamW without the torch._dynamo
import (seconds per rank), with the same numbers."""

import subprocess
import sys

CODE = """
import sys, torch
from sigma.train.trainer import build_optimizer
from sigma.train.train_config import OptimConfig

def run(fused):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(32, 8), torch.nn.Linear(8, 32))
    opt, named, _ = build_optimizer(model, OptimConfig(fused=fused), torch.device("cpu"))
    twin = torch.nn.Sequential(torch.nn.Embedding(32, 8), torch.nn.Linear(8, 32))
    twin.load_state_dict(model.state_dict())
    for step in range(4):
        opt.zero_grad(set_to_none=True)
        model(torch.arange(6)).logsumexp(-1).sum().backward()
        opt.step()
    opt.load_state_dict(opt.state_dict())
    return model, twin

ours = [run(fused) for fused in (False, True)]
assert "torch._dynamo" not in sys.modules, "the optimiser imported torch._dynamo"
for (model, twin), fused in zip(ours, (False, True)):  # torch's own AdamW from the same start: the same numbers
    cfg = OptimConfig()
    ref = torch.optim.AdamW([{"params": [twin[0].weight, twin[1].weight], "weight_decay": cfg.weight_decay},
                             {"params": [twin[1].bias], "weight_decay": 0.0}],
                            lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, fused=True if fused else None,
                            foreach=None if fused else True)
    torch.manual_seed(0)
    for step in range(4):
        ref.zero_grad(set_to_none=True)
        twin(torch.arange(6)).logsumexp(-1).sum().backward()
        ref.step()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), twin.parameters())), fused
print("ok")
"""


def test_the_optimiser_steps_like_torchs_adamw_without_importing_dynamo():
    proc = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


DCP_CODE = """
import sys
from sigma.train.checkpoint import import_dcp_in_background
assert "torch.distributed.checkpoint" not in sys.modules, "imported at start-up"
thread = import_dcp_in_background()
thread.join(60)
assert "torch.distributed.checkpoint" in sys.modules and thread.name == "sigma-dcp-import"
assert import_dcp_in_background() is None  # already there: no second thread
print("ok")
"""


def test_the_checkpoint_library_is_imported_in_a_thread_not_at_start_up():
    """The first periodic save after a restart from the replicas no longer stops training for the import."""
    proc = subprocess.run([sys.executable, "-c", DCP_CODE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
