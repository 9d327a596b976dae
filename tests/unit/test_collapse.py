"""sigma collapse check: the judgement on KPI files written by the trainer's KPI writer."""

import json

from sigma.cli import main
from sigma.train.collapse import Thresholds, assess, read_metrics
from sigma.train.kpi import KpiWriter


def write_run(tmp_path, losses, norms=None, grads=None, job=7):
    writer = KpiWriter(0, tmp_path, job_id=job, node="n1")
    for step, loss in enumerate(losses, 1):
        extra = {}
        if norms and step in norms:
            extra["moe_param_norm"] = norms[step]
        writer.metrics(step, loss=loss, grad_norm=(grads or {}).get(step, 1.0), **extra)
    writer.event("stop", "done")
    writer.close()
    return writer.path


def test_healthy_run(tmp_path):
    path = write_run(tmp_path, [6 - 0.01 * s for s in range(100)], {s: [10, 10.1, 10.2] for s in range(10, 101, 10)})
    verdict = assess(read_metrics([path]))
    assert verdict.state == "healthy" and verdict.first == {}


def test_valley_warns_before_the_divergence(tmp_path):
    losses = [6 - 0.01 * s for s in range(60)] + [5.4 + 0.1 * s for s in range(40)]
    norms = {s: [10, 10, 10] for s in range(10, 30, 10)}
    norms.update({s: [12, 8, 12] for s in range(30, 101, 10)})
    verdict = assess(read_metrics([write_run(tmp_path, losses, norms)]))
    assert verdict.state == "collapsing"
    assert verdict.first["norm_valley"] == 40  # two reports in a row
    assert verdict.first["diverged"] > verdict.first["norm_valley"]
    assert "33.3% below the end layers" in verdict.evidence["norm_valley"]


def test_nan_loss_is_collapsing_and_spikes_warn(tmp_path):
    grads = {s: (10.0 if s % 4 == 0 else 1.0) for s in range(30, 60)}
    path = write_run(tmp_path, [5.0] * 59 + [float("nan")], grads=grads)
    verdict = assess(read_metrics([path]), Thresholds())
    assert verdict.state == "collapsing" and verdict.first["diverged"] == 60
    assert 30 < verdict.first["grad_spikes"] < 60


def test_cli_job_plot_and_emit(tmp_path, capsys):
    losses = [6 - 0.01 * s for s in range(60)] + [5.4 + 0.1 * s for s in range(40)]
    norms = {s: [12, 8, 12] for s in range(10, 101, 10)}
    path = write_run(tmp_path, losses, norms, job=42)
    png = tmp_path / "norms.png"
    rc = main(["collapse", "check", "--job", "42", "--kpi-dir", str(tmp_path), "--plot", str(png), "--emit"])
    assert rc == 3 and png.stat().st_size > 1000
    assert "norm_valley     first at step 20" in capsys.readouterr().out
    event = json.loads((path.parent / "rank-collapse.n1.jsonl").read_text().splitlines()[-1])
    assert event["event"] == "collapse_warning" and event["state"] == "collapsing" and event["job_id"] == 42
    assert main(["collapse", "check", "--job", "43", "--kpi-dir", str(tmp_path)]) == 2
    assert "no KPI files of job 43" in capsys.readouterr().err


def test_falling_gradient_norm_of_the_first_steps_is_not_spikes(tmp_path):
    grads = {s: 2.0 * 0.9 ** s + 0.2 for s in range(1, 101)}  # 2.2 falling to 0.2: every step below its own past
    path = write_run(tmp_path, [6 - 0.01 * s for s in range(100)], grads=grads)
    assert "grad_spikes" not in assess(read_metrics([path])).first


def test_a_loss_spike_the_run_recovers_from_is_not_a_divergence(tmp_path):
    losses = [6 - 0.02 * s for s in range(100)]
    recovered = losses[:50] + [8.0] * 5 + losses[55:]  # five bad steps, then back on track
    assert "diverged" not in assess(read_metrics([write_run(tmp_path, recovered)])).first
    sustained = losses[:50] + [l + 1.5 for l in losses[50:]]  # the average stays over 1.1 x its lowest
    verdict = assess(read_metrics([write_run(tmp_path / "b", sustained)]))
    assert verdict.state == "collapsing" and 50 < verdict.first["diverged"] < 60
    assert "over 1.1 x its lowest" in verdict.evidence["diverged"]
