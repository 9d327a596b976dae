"""sigma.integrations.lightning with the real Lightning Trainer (one CPU process): a step line per optimiser step,
the controller's request (a control file written by the sidecar's own writer) answered through
trainer.save_checkpoint, the ModelCheckpoint's saves reported, validation as a pause, the NaN hook caught before the
update, and the requeued fit(ckpt_path=resume_checkpoint(...)) going on from the rollback checkpoint.
The same callback on the local cluster: tests/integration/test_own_trainer.py."""

from __future__ import annotations

import math
import time

import pytest

pl = pytest.importorskip("lightning.pytorch")
import torch  # noqa: E402

from sigma import kpi  # noqa: E402
from sigma.integrations.lightning import SigmaCallback, resume_checkpoint  # noqa: E402
from sigma.telemetry.control import NAN_TRIGGER, write_checkpoint_requests  # noqa: E402

JOB, NODE = 4242, "node1"


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 1)

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, _):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


class Faults(pl.Callback):
    """What the platform does to a running job, at a given step: the sidecar writes a request, `sigma chaos nan`."""

    def __init__(self, kpi_dir, request_at: int, nan_at: int):
        self.kpi_dir, self.request_at, self.nan_at = kpi_dir, request_at, nan_at

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.request_at:
            write_checkpoint_requests(self.kpi_dir, NODE, [{"id": 7, "job_id": JOB, "deadline": time.time() + 60}])
        if trainer.global_step == self.nan_at:
            (self.kpi_dir / f"job-{JOB}" / NAN_TRIGGER).touch()


def data(n: int = 64):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


def fit(tmp_path, max_steps: int, *extra, ckpt_path=None):
    run = kpi.Run(rank=0, trainer="lightning test", kpi_dir=tmp_path / "kpi", job_id=JOB, node=NODE,
                  fault_hooks=True, heartbeat_s=0)
    sigma = SigmaCallback(run, hold=False, tokens=lambda batch: batch[0].shape[0])
    ckpt = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=5, save_top_k=-1)
    trainer = pl.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, val_check_interval=4,
                         limit_val_batches=2, callbacks=[ckpt, sigma, *extra])
    model = Tiny()
    trainer.fit(model, data(), data(8), ckpt_path=ckpt_path)
    return trainer, model, sigma


def lines(tmp_path):
    return kpi.read_kpis(kpi.kpi_path(tmp_path / "kpi", JOB, 0, NODE))


def test_lightning_reports_answers_through_its_own_checkpoint_and_stops_before_a_nan_update(tmp_path):
    trainer, model, sigma = fit(tmp_path, 100, Faults(tmp_path / "kpi", request_at=6, nan_at=9))
    got = lines(tmp_path)
    steps = [r for r in got if "event" not in r]
    # the NaN came in step 10 (the trigger was set after step 9): its update was dropped, training stopped there
    assert [r["step"] for r in steps] == list(range(1, 10))
    assert all(r["tokens_per_s"] > 0 and r["step_time_s"] > 0 and r["learning_rate"] == 1e-2
               and math.isfinite(r["loss"]) and r["grad_norm"] > 0 for r in steps)
    saved = {(r["kind"], r["step"]): r for r in got if r.get("event") == "checkpoint"}
    assert saved[("jit", 7)]["request"] == 7 and saved[("jit", 7)]["path"].endswith("sigma-step=7.ckpt")
    assert saved[("periodic", 5)]["path"].endswith("step=5.ckpt")  # the ModelCheckpoint's own save
    rollback = saved[("rollback", 10)]
    (nan,) = [r for r in got if r.get("event") == "nan_loss"]
    assert nan["step"] == 10 and sigma.stopped_on_nan and trainer.global_step == 10
    state = torch.load(rollback["path"], weights_only=False)["state_dict"]
    assert all(torch.isfinite(v).all() for v in state.values())  # the model before the NaN's update
    events = [r["event"] for r in got if "event" in r]
    assert events.count("pause") == events.count("pause_end") == events.count("eval") >= 2
    assert "stop" not in events  # a NaN stop is no end: the controller requeues it

    # the requeued run: fit(ckpt_path=resume_checkpoint(...)) goes on from the rollback checkpoint
    assert resume_checkpoint(tmp_path / "ckpt") == rollback["path"]
    trainer, _, _ = fit(tmp_path, 13, ckpt_path=resume_checkpoint(tmp_path / "ckpt"))
    after = lines(tmp_path)[len(got):]
    (resume,) = [r for r in after if r.get("event") == "resume"]
    assert resume["step"] == 10 and resume["checkpoint_kind"] == "rollback"
    assert [r["step"] for r in after if "event" not in r] == [11, 12, 13]
    assert after[-1]["event"] == "stop" and trainer.global_step == 13
