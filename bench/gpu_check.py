"""Every GPU path of the project in one command and one report: `make gpu-check`.

    python bench/gpu_check.py [--out DIR] [--budget-s 480] [--parts NAME,...] [--list]

Each part runs in its own process under its own time limit (a hang or a crash costs only that part's share), and
the whole run stays inside --budget-s (a part starts only with at least 20 s of it left and gets no more than what
is left). The parts:

  device          GPU model(s), driver, CUDA and torch versions, memory, the datasheet dense bf16 peak for MFU
  trainer-tiny    sigma's trainer on the `tiny` preset in bf16 autocast: tokens/s and MFU against that peak
  trainer-moe-1b  the same on the ~1B-parameter MoE preset (moe-1b: 0.94B in all, 0.18B active)
  moe-layer       the MoE layer forward+backward against Hugging Face's experts implementations (grouped_mm,
                  batched_mm where it fits) and a torchtitan-style grouped layer, fp32 and bf16 (bench/train.py)
  expert-parallel the trainer with experts split over every GPU over NCCL (two or more GPUs)
  hf-trainer      a Hugging Face Trainer (GPT-2 small, bf16) with and without sigma's callback, side by side, and a
                  NaN caught by the callback on the GPU (bench/own_trainer.py)
  jit-checkpoint  a just-in-time checkpoint request answered on the GPU, the run stopped as a requeue stops it,
                  and a new run resumed from that checkpoint (steps lost, save and resume times, loss continuity)
  nvml            the sidecar's NVML collector: what it samples on this GPU
  health          the accelerator health checks of the return-to-service suite (accelerators, gemm,
                  gemm_sustained, copy_bandwidth, train_step)
  dcgm            `dcgmi diag -r 1`, where DCGM is installed
  numerics        a numerics reference recorded on the GPU (fp32) and replayed on the CPU (sigma train numerics)

Without a CUDA device every part after `device` says it was skipped and why, and the command exits 0 in seconds.
It writes DIR/gpu-check.json (every figure and status) and DIR/gpu-check.txt (the short table it also prints).
Exit status: 0 when no part failed, 1 when one failed or timed out.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

MIN_PART_S = 20  # a part is not started with less of the budget than this left


@dataclass(frozen=True)
class Part:
    name: str
    limit_s: int
    min_gpus: int  # 0: runs without a GPU too
    what: str


PARTS = (
    Part("device", 30, 0, "GPU model, driver, CUDA, datasheet peak"),
    Part("trainer-tiny", 75, 1, "trainer, tiny preset, bf16: tokens/s, MFU"),
    Part("trainer-moe-1b", 150, 1, "trainer, moe-1b preset, bf16: tokens/s, MFU"),
    Part("moe-layer", 75, 1, "MoE layer fwd+bwd vs HF experts and torchtitan-style, fp32/bf16"),
    Part("expert-parallel", 90, 2, "trainer with expert parallelism over NCCL"),
    Part("hf-trainer", 120, 1, "HF Trainer with/without sigma's callback, bf16; NaN caught"),
    Part("jit-checkpoint", 75, 1, "just-in-time checkpoint on the GPU, stop, resume"),
    Part("nvml", 20, 1, "sidecar NVML collector samples"),
    Part("health", 60, 1, "accelerator health checks"),
    Part("dcgm", 90, 1, "dcgmi diag -r 1"),
    Part("numerics", 75, 1, "numerics reference on the GPU, replayed on the CPU"),
)
BY_NAME = {p.name: p for p in PARTS}


# ---------------------------------------------------------------- the parts (each runs in its own process)

def part_device(work: Path) -> dict:
    import torch

    info = {"torch": torch.__version__, "cuda_runtime": torch.version.cuda, "hostname": socket.gethostname(),
            "gpus": []}
    if not torch.cuda.is_available():
        return {**info, "status": "ok", "cuda": False,
                "summary": f"no CUDA device (torch {torch.__version__}, built with CUDA {torch.version.cuda})"}
    from sigma.train.flops import PeakUnknown, accelerator_peak

    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        gpu = {"index": i, "name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
               "multiprocessors": p.multi_processor_count, "capability": f"{p.major}.{p.minor}"}
        try:
            peak = accelerator_peak(p.name, torch.bfloat16)
            gpu.update(bf16_peak_tflops=peak.flops / 1e12, peak_source=peak.source)
        except PeakUnknown as exc:
            gpu.update(bf16_peak_tflops=None, peak_source=str(exc))
        info["gpus"].append(gpu)
    info["driver"] = _nvidia_smi("driver_version")
    info["cuda"] = True
    first = info["gpus"][0]
    return {**info, "status": "ok",
            "summary": f"{len(info['gpus'])} x {first['name']} ({first['memory_gib']} GiB), driver {info['driver']}, "
                       f"torch {torch.__version__} CUDA {torch.version.cuda}; bf16 peak "
                       f"{first['bf16_peak_tflops'] or '?'} TFLOP/s"}


def _nvidia_smi(field: str) -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=15)
        return out.stdout.splitlines()[0].strip() if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        return None


TRAIN_RUNS = {  # preset: (steps, global batch, sequence length, corpus MB for the BPE data)
    "tiny": (300, 64, 512, 2.0),
    "moe-1b": (200, 16, 2048, 4.0),
}
SKIP_STEPS = 5  # warm-up steps left out of the means (CUDA start-up, allocator growth)


def _prepared(work: Path, vocab: int, max_mb: float) -> Path:
    from sigma.train.data import prepare

    from sigma.train.data import META_NAME

    data = work / f"data-{vocab}"
    if not (data / META_NAME).exists():
        prepare(data, max_mb=max_mb, vocab_size=vocab)
    return data


def _trainer(work: Path, preset: str, tag: str, overrides: list[str], nproc: int = 1, timeout: float = 600,
             background: bool = False, checkpoints: str | None = None):
    """Run sigma's trainer entry point (torchrun for several ranks); KPI lines land in work/kpi-TAG, checkpoints
    in work/ckpt-CHECKPOINTS (default TAG)."""
    from sigma.paths import configs_dir
    from sigma.train.config import load_model_config

    steps, batch, seq, mb = TRAIN_RUNS[preset]
    data = _prepared(work, load_model_config(preset).vocab_size, mb)
    kpi = work / f"kpi-{tag}"
    args = ["--config", str(configs_dir() / "train" / "tiny.yaml"), f"model={preset}", f"steps={steps}",
            f"data.path={data}",
            "data.prepare_if_missing=false", f"data.global_batch={batch}", f"data.seq_len={seq}",
            "device=cuda", "dtype=bfloat16", "kpi.progress_every=0", "eval.every=0", "checkpoint.every=0",
            f"checkpoint.dir={work / ('ckpt-' + (checkpoints or tag))}", f"optim.warmup_steps={min(10, steps)}", *overrides]
    env = {**os.environ, "SIGMA_KPI_DIR": str(kpi), "SIGMA_JOB_ID": "1", "PYTHONPATH": _pythonpath()}
    env.pop("SLURM_JOB_ID", None)
    module = ["-m", "sigma.train.trainer", *args]
    cmd = ([sys.executable, *module] if nproc == 1 else
           [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *module])
    log = open(work / f"trainer-{tag}.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    if background:
        return proc, kpi
    try:
        code = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    if code:
        raise RuntimeError(f"trainer exited {code}: {_tail(work / f'trainer-{tag}.log')}")
    return _kpi_summary(kpi)


def _pythonpath() -> str:
    """This checkout first, then whatever the caller had (wheels unpacked beside an installed torch)."""
    return os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)


def _tail(path: Path, chars: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def _records(kpi: Path, rank: int = 0) -> list[dict]:
    from sigma.train.kpi import read_kpis

    files = sorted(kpi.glob(f"job-1/rank-{rank}.*.jsonl"))
    return read_kpis(files[0]) if files else []


def _last_step(kpi: Path) -> int:
    return max((r["step"] for r in _records(kpi) if "event" not in r and r.get("step") is not None), default=0)


def _kpi_summary(kpi: Path) -> dict:
    records = _records(kpi)
    steps = [r for r in records if "event" not in r and r.get("step") is not None]
    start = next((r for r in records if r.get("event") == "start"), {})
    timed = steps[SKIP_STEPS:] or steps
    if not timed:
        raise RuntimeError(f"no step lines in {kpi}")
    mfu = [r["mfu"] for r in timed if r.get("mfu") is not None]
    return {"steps": len(steps), "params": start.get("params"), "peak_source": start.get("peak_source"),
            "tokens_per_s": round(statistics.mean(r["tokens_per_s"] for r in timed)),
            "step_ms_median": round(1000 * statistics.median(r["step_time_s"] for r in timed), 2),
            "mfu": round(statistics.mean(mfu), 4) if mfu else None,
            "loss_first": steps[0].get("loss"), "loss_last": steps[-1].get("loss")}


def _train_part(preset: str):
    def run(work: Path) -> dict:
        r = _trainer(work, preset, preset, [])
        mfu = f"{100 * r['mfu']:.1f} %" if r["mfu"] is not None else "n/a"
        return {**r, "status": "ok",
                "summary": f"{r['tokens_per_s']:,} tok/s, MFU {mfu}, step {r['step_ms_median']} ms, loss "
                           f"{r['loss_first']:.3f} -> {r['loss_last']:.3f} over {r['steps']} steps"}
    return run


def part_expert_parallel(work: Path) -> dict:
    import torch

    n = torch.cuda.device_count()
    one = _trainer(work, "tiny", "ep1", [])
    many = _trainer(work, "tiny", f"ep{n}", [f"parallel.ep={n}"], nproc=n)
    return {"status": "ok", "gpus": n, "one_gpu": one, "expert_parallel": many,
            "summary": f"tiny on {n} GPUs ep={n}: {many['tokens_per_s']:,} tok/s (rank 0) vs 1 GPU "
                       f"{one['tokens_per_s']:,}; loss {many['loss_last']:.3f} vs {one['loss_last']:.3f}"}


def part_jit_checkpoint(work: Path) -> dict:
    """Ask for a checkpoint mid-run as the sidecar does, stop the run with SIGTERM as a requeue does, resume."""
    from sigma.train.jit import REQUEST_NAME

    request_id = 7
    proc, kpi = _trainer(work, "tiny", "jit", [], background=True)
    try:
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline and proc.poll() is None:
            steps = [r for r in _records(kpi) if "event" not in r]
            if len(steps) >= 30:
                break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"the run did not reach step 30: {_tail(work / 'trainer-jit.log')}")
        node = socket.gethostname()
        request = kpi / "job-1" / REQUEST_NAME.format(node=node)
        tmp = request.with_suffix(".tmp")
        tmp.write_text(json.dumps({"id": request_id}))
        asked = time.time()
        tmp.rename(request)  # by rename, as the sidecar writes it
        saved = None
        while time.monotonic() < deadline and saved is None:
            saved = next((r for r in _records(kpi) if r.get("event") == "checkpoint"
                          and r.get("request") == request_id), None)
            time.sleep(0.05)
        if saved is None:
            raise RuntimeError("no checkpoint answered the request within the part's time")
        while time.monotonic() < deadline and proc.poll() is None and _last_step(kpi) < saved["step"] + 3:
            time.sleep(0.05)  # a few steps past the checkpoint, to compare the resumed run's losses with
        stopped_at = _last_step(kpi)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    first_run = {r["step"]: r["loss"] for r in _records(kpi) if "event" not in r}
    request.unlink(missing_ok=True)
    resumed_at = time.time()
    steps_to = saved["step"] + 20
    proc, kpi2 = _trainer(work, "tiny", "jit-resume", [f"steps={steps_to}"], background=True, checkpoints="jit")
    code = proc.wait(timeout=60)
    if code:
        raise RuntimeError(f"resumed run exited {code}: {_tail(work / 'trainer-jit-resume.log')}")
    records = _records(kpi2)
    resume = next((r for r in records if r.get("event") == "resume"), None)
    if resume is None:
        raise RuntimeError("the new run did not resume from the checkpoint")
    first_step = min((r for r in records if "event" not in r), key=lambda r: r["step"])
    same = first_run.get(first_step["step"])
    return {"status": "ok" if resume["step"] == saved["step"] else "fail",
            "saved_step": saved["step"], "save_s": saved.get("save_s"),
            "answered_after_s": round(saved["ts"] - asked, 3) if "ts" in saved else None,
            "stopped_at_step": stopped_at, "steps_redone": stopped_at - saved["step"],
            "resumed_step": resume["step"], "first_step_after_resume": first_step["step"],
            "resume_to_first_step_s": round(first_step["ts"] - resumed_at, 2) if "ts" in first_step else None,
            "loss_after_resume": first_step["loss"], "loss_same_step_first_run": same,
            "summary": f"request answered at step {saved['step']} in {saved.get('save_s')} s; SIGTERM at step "
                       f"{stopped_at}; resumed at step {resume['step']}: loss at step {first_step['step']} "
                       f"{first_step['loss']:.4f}, first run {same if same is None else round(same, 4)}"}


def part_hf_trainer(work: Path) -> dict:
    bench = _bench_module("own_trainer")
    r = bench.measure("cuda", "small", steps=40, skip=10, rounds=2)
    return {**r, "status": "ok" if r["nan_ok"] else "fail", "summary": bench.summary(r)}


def _bench_module(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def part_moe_layer(work: Path) -> dict:
    import torch

    bench = _bench_module("train")
    args = argparse.Namespace(tokens=16384, rounds=10, hf_impls="batched_mm,grouped_mm", shapes="sigma,coarse",
                              peak_flops=0.0, clock="wall")
    rows = bench.bench_layers(args, torch.device("cuda"))
    verdicts = [r for r in rows if r.get("strongest")]
    return {"status": "ok", "tokens": args.tokens, "rows": rows,
            "summary": "; ".join(f"{r['shape'].split()[0]} {r['dtype']}: ours {r['ours_vs_strongest']:.2f}x "
                                 f"{r['strongest']}" for r in verdicts)}


def part_nvml(work: Path) -> dict:
    from sigma.telemetry.base import Context, Output
    from sigma.telemetry.collectors.nvml import NvmlCollector

    collector = NvmlCollector("nvml", NvmlCollector.Params(), Context(node=socket.gethostname(), node_dir=str(work)))
    rounds, seconds = [], []
    try:
        for _ in range(5):
            out = Output()
            t0 = time.perf_counter()
            collector.collect(out)
            seconds.append(time.perf_counter() - t0)
            rounds.append(out)
            time.sleep(0.2)
    finally:
        collector.close()
    last = rounds[-1]
    metrics = sorted({s[1] for s in last.samples})
    sample = {s[1]: s[2] for s in last.samples if s[3] in ("{}", '{"gpu":"0"}')}
    return {"status": "ok" if metrics else "fail", "metrics": metrics, "samples_per_round": len(last.samples),
            "events": [e[2] for r in rounds for e in r.events], "collect_ms_median":
            round(1000 * statistics.median(seconds), 2), "gpu0": sample,
            "summary": f"{len(metrics)} metrics, {len(last.samples)} samples a round in "
                       f"{1000 * statistics.median(seconds):.1f} ms; events: "
                       f"{sorted({e[2] for r in rounds for e in r.events}) or 'none'}"}


HEALTH_CHECKS = ("accelerators", "gemm", "gemm_sustained", "copy_bandwidth", "train_step")


def part_health(work: Path) -> dict:
    cmd = [sys.executable, "-m", "sigma.cli", "health", "run", "--suite", "comprehensive", "--json", "--no-record",
           "--node", "gpucheck", "--node-dir", str(work / "node"), "--budget", "55"]
    for name in HEALTH_CHECKS:
        cmd += ["--check", name]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=58, env={**os.environ, "PYTHONPATH": _pythonpath()})
    report = json.loads(out.stdout)
    checks = [{k: c.get(k) for k in ("name", "status", "message", "data", "duration_s")} for c in report["checks"]]
    return {"status": "ok" if report["verdict"] == "accept" else "fail", "verdict": report["verdict"],
            "checks": checks,
            "summary": f"verdict {report['verdict']}: " + "; ".join(f"{c['name']} {c['status']}" for c in checks)}


def part_dcgm(work: Path) -> dict:
    import shutil

    dcgmi = shutil.which("dcgmi")
    if dcgmi is None:
        return {"status": "skipped", "summary": "skipped: dcgmi is not installed (DCGM absent)"}
    out = subprocess.run([dcgmi, "diag", "-r", "1"], capture_output=True, text=True, timeout=85)
    text = (out.stdout + out.stderr).strip()
    return {"status": "ok" if out.returncode == 0 else "fail", "exit": out.returncode, "output": text[-4000:],
            "summary": f"dcgmi diag -r 1 exited {out.returncode}: {text.splitlines()[-1] if text else ''}"}


def part_numerics(work: Path) -> dict:
    import torch

    from sigma.paths import configs_dir
    from sigma.train.config import load_model_config
    from sigma.train.numerics.check import check
    from sigma.train.numerics.record import record
    from sigma.train.train_config import load_train_config

    mb = TRAIN_RUNS["tiny"][3]
    cfg = load_train_config(str(configs_dir() / "train" / "tiny.yaml"),
                            [f"data.path={_prepared(work, load_model_config('tiny').vocab_size, mb)}"])
    ref = work / "numerics-ref"
    t0 = time.perf_counter()
    record(cfg, ref, steps=5, device="cuda", dtype="float32", log=lambda *_: None)
    recorded_s = time.perf_counter() - t0
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    result = check(ref, device="cpu", dtype="float32").to_dict()
    return {"status": "ok" if result["verdict"] == "pass" else "fail", "verdict": result["verdict"],
            "culprits": result["culprits"], "record_s": round(recorded_s, 2), "check_s": result["seconds"],
            "reference": str(ref),
            "worst": sorted(({"unit": u["name"], "min_cos": min(u["min_cos"].values()),
                              "max_rel": max(u["max_rel"].values())} for u in result["units"]),
                            key=lambda u: u["max_rel"], reverse=True)[:5],
            "summary": f"GPU reference replayed on CPU: {result['verdict']}"
                       + (f" (culprits {', '.join(result['culprits'])})" if result["culprits"] else "")}


RUNNERS = {"device": part_device, "trainer-tiny": _train_part("tiny"), "trainer-moe-1b": _train_part("moe-1b"),
           "moe-layer": part_moe_layer, "hf-trainer": part_hf_trainer, "expert-parallel": part_expert_parallel,
           "jit-checkpoint": part_jit_checkpoint, "nvml": part_nvml, "health": part_health, "dcgm": part_dcgm,
           "numerics": part_numerics}


def run_part_here(name: str, work: Path, result: Path) -> int:
    """Child process: run one part, write its result (or the error) as JSON."""
    started = time.perf_counter()
    try:
        out = RUNNERS[name](work)
    except Exception as exc:  # the report says what broke; the other parts still run
        last = next((line for line in reversed(str(exc).strip().splitlines()) if line.strip()), "")
        out = {"status": "error", "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:],
               "summary": f"error: {type(exc).__name__}: {last[:300]}"}
    out["seconds"] = round(time.perf_counter() - started, 1)
    result.write_text(json.dumps(out, indent=1, default=str))
    return 0


# ---------------------------------------------------------------- the driver

def run_part(part: Part, work: Path, limit_s: float) -> dict:
    result = work / f"{part.name}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--run-part", part.name, "--work", str(work),
           "--result", str(result)]
    started = time.monotonic()
    with open(work / f"{part.name}.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the part's whole process group: trainers it started too
        proc.wait()
        return {"status": "timeout", "seconds": round(time.monotonic() - started, 1),
                "summary": f"timeout: stopped after its {limit_s:.0f} s limit; log tail: "
                           f"{_tail(work / f'{part.name}.log', 300)!r}"}
    try:
        return json.loads(result.read_text())
    except (OSError, ValueError):
        return {"status": "error", "seconds": round(time.monotonic() - started, 1),
                "summary": f"error: the part exited {proc.returncode} without a result; log tail: "
                           f"{_tail(work / f'{part.name}.log', 300)!r}"}


def table(report: dict) -> str:
    lines = [f"sigma GPU check on {report['host']} at {report['started']}: {report['device_summary']}",
             f"{'part':16} {'status':8} {'s':>6}  result"]
    for name, r in report["parts"].items():
        lines.append(f"{name:16} {r['status']:8} {r.get('seconds', 0):6.1f}  {r.get('summary', '')}")
    lines.append(f"total {report['seconds']:.0f} s of a {report['budget_s']} s budget; "
                 f"{report['failed']} part(s) failed or timed out")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("gpu-check"), help="report directory (default ./gpu-check)")
    parser.add_argument("--budget-s", type=float, default=480.0, help="the whole run's time (default 480 s)")
    parser.add_argument("--parts", default=",".join(BY_NAME), help="comma-separated parts (default: all)")
    parser.add_argument("--list", action="store_true", help="list the parts and exit")
    parser.add_argument("--run-part", help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_part:
        return run_part_here(args.run_part, args.work, args.result)
    if args.list:
        for p in PARTS:
            print(f"{p.name:16} {p.limit_s:4d} s  {'GPUs >= ' + str(p.min_gpus) if p.min_gpus else 'any machine':12}"
                  f"  {p.what}")
        return 0
    wanted = [n.strip() for n in args.parts.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in BY_NAME]
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}; valid: {', '.join(BY_NAME)}")
    args.out.mkdir(parents=True, exist_ok=True)
    started, t0 = time.strftime("%Y-%m-%d %H:%M:%S %Z"), time.monotonic()
    report = {"host": socket.gethostname(), "started": started, "budget_s": args.budget_s, "parts": {}}
    with tempfile.TemporaryDirectory(prefix="sigma-gpu-check-") as tmp:
        work = Path(tmp)
        device = run_part(BY_NAME["device"], work, BY_NAME["device"].limit_s)
        report["parts"]["device"] = device
        report["device"] = {k: v for k, v in device.items() if k not in ("summary", "seconds")}
        report["device_summary"] = device.get("summary", "device unknown")
        gpus = len(device.get("gpus") or [])
        for name in wanted:
            part = BY_NAME[name]
            if name == "device":
                continue
            left = args.budget_s - (time.monotonic() - t0)
            if gpus < part.min_gpus:
                why = (device.get("summary", "the device part failed") if gpus == 0 else
                       f"needs {part.min_gpus} GPUs, this machine has {gpus}")
                result = {"status": "skipped", "seconds": 0.0, "summary": f"skipped: {why}"}
            elif left < MIN_PART_S:
                result = {"status": "skipped", "seconds": 0.0,
                          "summary": f"skipped: {left:.0f} s of the {args.budget_s:.0f} s budget left"}
            else:
                result = run_part(part, work, min(part.limit_s, left))
            report["parts"][name] = result
            print(f"{name:16} {result['status']:8} {result.get('seconds', 0):6.1f}  {result.get('summary', '')}",
                  flush=True)
        numerics_ref = work / "numerics-ref"
        if numerics_ref.exists():  # the GPU reference travels with the report, to replay on any CPU later
            import shutil

            shutil.make_archive(str(args.out / "numerics-ref"), "gztar", numerics_ref)
    report["seconds"] = round(time.monotonic() - t0, 1)
    report["failed"] = sum(r["status"] in ("fail", "error", "timeout") for r in report["parts"].values())
    (args.out / "gpu-check.json").write_text(json.dumps(report, indent=1, default=str))
    text = table(report)
    (args.out / "gpu-check.txt").write_text(text + "\n")
    print("\n" + text)
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
