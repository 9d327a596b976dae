"""`sigma numerics check`: replay a reference on this platform, unit by unit, and compare.

Every unit runs alone on the reference's recorded inputs (and is given the reference's gradient of its outputs), so
a wrong component shows in its own row and nowhere else. Its parameters follow their own trajectory: the candidate
starts from the reference's initial weights and applies its own gradients (clipped by the reference's global clip
factor) with AdamW every step, so an error that accumulates over steps shows in the parameter columns.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

import sigma.train.numerics.tape as tape_mod
from sigma.train.model import apply_rope
from sigma.train.numerics.record import DTYPES, resolve_device
from sigma.train.numerics.reference import (NumericsError, check_model_matches, check_state_matches, load_meta,
                                            load_tensors, step_path)
from sigma.train.numerics.tape import Tape, sampled

# (minimum cosine similarity, maximum relative error) per candidate dtype and table row. The cosine bound is the
# paper's; the relative-error bounds sit well above what clean candidates reach (docs/stability.md, bench/numerics.py).
# In bfloat16 the router picks other experts for near-tied tokens, so its gradients differ more (and legitimately).
# Keys: "default", a row ("router") or a row and metric ("router.grad").
THRESHOLDS = {"float32": {"default": (0.99, 1e-3)},
              "bfloat16": {"default": (0.99, 0.2)}}
# Routing is discrete: the router's values and gradients are compared with the reference's expert choice forced
# (teacher-forced routing), and the share of tokens whose own choice differs is a metric of its own. In bfloat16,
# near-tied router scores legitimately pick other experts for some tokens.
MAX_FLIPS = {"float32": 0.01, "bfloat16": 0.1}
PSEUDO_UNITS = ("residual", "rope", "loss")
METRICS = ("out", "grad", "param")


def similarity(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """(cosine similarity, ||a - b|| / ||b||) of two flat tensors; two zero tensors are equal."""
    a, b = a.double().reshape(-1), b.double().reshape(-1)
    na, nb, diff = float(a.norm()), float(b.norm()), float((a - b).norm())
    if nb == 0.0:
        return (1.0, 0.0) if na == 0.0 else (0.0, math.inf)
    cos = max(-1.0, min(1.0, float(a @ b) / (na * nb))) if na > 0 else 0.0
    return cos, diff / nb


@dataclass
class UnitResult:
    name: str
    kind: str
    cos: dict = field(default_factory=lambda: {m: 1.0 for m in METRICS})
    rel: dict = field(default_factory=lambda: {m: 0.0 for m in METRICS})
    flips: float = 0.0  # routers: largest share of tokens routed to other experts than in the reference
    first_step: int | None = None
    first_data: str | None = None
    subop: str | None = None

    def add(self, metric: str, cos: float, rel: float, step: int, data: str, limits: dict) -> bool:
        limits = limits.get(f"{self.kind}.{metric}", limits.get(self.kind, limits["default"]))
        self.cos[metric] = min(self.cos[metric], cos)
        self.rel[metric] = max(self.rel[metric], rel)
        bad = cos < limits[0] or rel > limits[1]
        if bad and self.first_step is None:
            self.first_step, self.first_data = step, data
        return bad

    @property
    def flagged(self) -> bool:
        return self.first_step is not None

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "min_cos": self.cos, "max_rel": self.rel, "flips": self.flips,
                "first_step": self.first_step, "first_data": self.first_data, "flagged": self.flagged,
                "subop": self.subop}


@dataclass
class CheckResult:
    reference: str
    device: str
    dtype: str
    thresholds: dict
    units: dict[str, UnitResult]
    seconds: float = 0.0

    @property
    def flagged(self) -> list[str]:
        return [n for n, u in self.units.items() if u.flagged]

    @property
    def culprits(self) -> list[str]:
        """Flagged units that hold no other flagged unit (an attention whose RoPE is wrong points at the RoPE)."""
        flagged = self.flagged
        return [n for n in flagged if not any(o != n and o.startswith(n + ".") for o in flagged)]

    def to_dict(self) -> dict:
        return {"reference": self.reference, "device": self.device, "dtype": self.dtype,
                "thresholds": {k: {"min_cos": c, "max_rel": r} for k, (c, r) in self.thresholds.items()},
                "verdict": "fail" if self.flagged else "pass", "culprits": self.culprits,
                "culprit_kinds": sorted({self.units[n].kind for n in self.culprits}),
                "units": [u.to_dict() for u in self.units.values()], "seconds": round(self.seconds, 2)}


@contextlib.contextmanager
def forced_topk(routes: torch.Tensor):
    """Within a router's replay: its top-k returns the reference's expert ids (values gathered there); how many
    tokens' own choice differs goes to seen["flips"]."""
    original = torch.Tensor.topk
    seen = {"flips": 0.0}

    def topk(self, k, dim=-1, *args, **kwargs):
        mine = original(self, k, dim, *args, **kwargs)
        if self.shape[:-1] != routes.shape[:-1] or k != routes.shape[-1]:
            return mine
        same = (mine.indices.sort(-1).values == routes.sort(-1).values).all(-1)
        seen["flips"] = 1.0 - float(same.float().mean())
        return torch.return_types.topk((self.gather(-1, routes), routes))

    torch.Tensor.topk = topk
    try:
        yield seen
    finally:
        torch.Tensor.topk = original


def _finite(tensor: torch.Tensor, what: str) -> None:
    if not tensor.is_floating_point() or math.isfinite(float(tensor.detach().sum(dtype=torch.float32))):
        return  # a NaN or Inf makes the sum non-finite; the sum is far cheaper than an element-wise test
    if not bool(torch.isfinite(tensor).all()):  # the sum can overflow with finite elements: test them
        raise NumericsError(f"the candidate's {what} holds NaN or Inf: this platform computes garbage there "
                            "(no table: its numbers would mean nothing)")


class Replayer:
    def __init__(self, ref: str | Path, device: str = "cpu", dtype: str = "float32", config=None,
                 thresholds: tuple[float, float] | None = None, data: list[str] | None = None):
        from sigma.train.config import model_config_from_dict
        from sigma.train.train_config import train_config_from_dict

        self.ref = Path(ref)
        self.meta = load_meta(self.ref)
        if dtype not in DTYPES:
            raise NumericsError(f"--dtype {dtype}: use one of {', '.join(DTYPES)}")
        self.device, self.dtype, self.amp = resolve_device(device), dtype, DTYPES[dtype]
        self.limits = dict(THRESHOLDS[dtype]) if thresholds is None else {"default": tuple(thresholds)}
        self.max_flips = MAX_FLIPS[dtype]
        self.data = data or self.meta["data"]
        unknown = [d for d in self.data if d not in self.meta["data"]]
        if unknown:
            raise NumericsError(f"--data {','.join(unknown)}: the reference holds {', '.join(self.meta['data'])}")
        if config is not None:
            from sigma.train.config import load_model_config
            model_cfg = load_model_config(config.model, {**config.model_overrides, "activation_checkpointing": False})
            check_model_matches(self.meta, model_cfg.to_dict(), "--config")
        try:
            self.model_cfg = model_config_from_dict(self.meta["model"], str(self.ref / "meta.json"))
            self.train_cfg = train_config_from_dict(self.meta["train"])
        except Exception as exc:
            raise NumericsError(f"{self.ref / 'meta.json'}: the recorded config does not load in this version: "
                                f"{exc}") from None
        self.init = load_tensors(self.ref / "init.pt", "initial weights")

    # ------------------------------------------------------------------ set-up
    def _fresh_model(self):
        from sigma.train.model import MoETransformer

        model = MoETransformer(self.model_cfg).to(self.device)
        check_state_matches(self.init, model.state_dict(), str(self.ref / "init.pt"))
        model.load_state_dict(self.init)
        model.train()
        return model

    def _units(self, model) -> list[tuple[str, str]]:
        modules = dict(model.named_modules())
        units = [tuple(u) for u in self.meta["units"]]
        for name, kind in units:
            if kind not in PSEUDO_UNITS and name not in modules:
                raise NumericsError(f"the reference has a {kind} at {name}; this model has no such module")
        return units

    @staticmethod
    def _owners(model, units) -> dict[str, str]:
        """Each parameter belongs to the innermost unit holding it."""
        module_units = sorted((n for n, k in units if k not in PSEUDO_UNITS), key=len, reverse=True)
        owners = {}
        for pname, _ in model.named_parameters():
            owner = next((u for u in module_units if pname.startswith(u + ".")), None)
            if owner is None:
                raise NumericsError(f"parameter {pname} belongs to no unit of the reference")
            owners[pname] = owner
        return owners

    # ------------------------------------------------------------------ the replay
    def run(self, faults=None, log=None) -> CheckResult:
        from sigma.train.trainer import build_optimizer

        t0 = time.perf_counter()
        model = self._fresh_model()
        units = self._units(model)
        results = {name: UnitResult(name, kind) for name, kind in units}
        self._kinds = dict(units)
        owners = self._owners(model, units)
        self._owned = {name: [p for p, o in owners.items() if o == name] for name, _ in units}
        for index, data in enumerate(self.data):
            if index:  # every data kind starts from the reference's initial weights (one model: building is slow)
                model.load_state_dict(self.init)
            optimizer, _, _ = build_optimizer(model, self.train_cfg.optim, self.device)
            params = dict(model.named_parameters())
            tape = Tape(model, self.train_cfg.seed, keep_args=False, lazy=True).install(residuals=False)
            try:
                with tape.functions():
                    for step in range(1, self.meta["steps"] + 1):
                        if faults is not None:
                            faults.step = step
                        ref = load_tensors(step_path(self.ref, data, step), f"{data} data, step {step}")
                        self._step(model, tape, optimizer, params, owners, units, results, ref, step, data)
            finally:
                tape.remove()
            if log:
                log(f"replayed {self.meta['steps']} steps of {data} data")
        return CheckResult(str(self.ref), self.device.type, self.dtype, self.limits, results,
                           time.perf_counter() - t0)

    def _step(self, model, tape, optimizer, params, owners, units, results, ref, step, data):
        records = ref["records"]
        with torch.no_grad():
            for name, value in ref.get("buffers", {}).items():
                model.get_buffer(name).copy_(value)
        optimizer.zero_grad(set_to_none=True)
        for name, kind in units:
            if name not in records:
                raise NumericsError(f"{data} data, step {step}: the reference has no record of {name}")
            owned = self._owned[name]
            tape.new_step(step)
            bad = self._replay(model, tape, records[name], owned, params, ref, results[name], step, data)
            if bad and results[name].subop is None and results[name].kind not in PSEUDO_UNITS:
                results[name].subop = self._first_subop(name, tape, ref, forward="out" in bad)
        for p in params.values():
            if p.grad is not None:
                p.grad.mul_(ref["clip_coef"])
        for group in optimizer.param_groups:
            group["lr"] = ref["lr"]
        optimizer.step()
        for pname, p in params.items():
            _finite(p.detach(), f"parameter {pname} after step {step}")
            cos, rel = similarity(sampled(pname, p), ref["params"][pname])
            unit = results[owners[pname]]
            unit.add("param", cos, rel, step, data, self.limits)

    def _call(self, model, rec):
        name, kind, args = rec["name"], rec["kind"], rec["args"]
        if kind == "residual":
            x, branch, p, training = args
            tape_mod.seed_rng(rec["seed"])
            branch = branch.to(self.amp) if self.amp != torch.float32 else branch
            return x + (F.dropout(branch, p, training) if p else branch)
        if kind == "rope":
            return apply_rope(*args[:3], **args[3])
        if kind == "loss":
            logits, targets = args
            return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
        if kind == "router" and rec.get("routes") is not None:
            with forced_topk(rec["routes"].to(self.device)) as seen:
                out = model.get_submodule(name)(*args)
            self._flips = seen["flips"]
            return out
        return model.get_submodule(name)(*args)

    def _replay(self, model, tape, rec, owned, params, ref, result: UnitResult, step: int, data: str) -> set[str]:
        """Replay one unit; returns the metrics ("out", "grad") that left the thresholds at this step."""
        name, bad = rec["name"], set()
        limits = self.limits
        args, leaves = [], []
        for value, grad in zip(rec["args"], rec["grad_in"] + [None] * (len(rec["args"]) - len(rec["grad_in"]))):
            if isinstance(value, torch.Tensor):
                value = value.to(self.device)
                if grad is not None and value.is_floating_point():
                    value = value.detach().requires_grad_(True)
                    leaves.append((len(args), value))
            args.append(value)
        rec = {**rec, "args": args}
        self._flips = None
        with torch.autocast(self.device.type, dtype=self.amp, enabled=self.amp != torch.float32):
            out = self._call(model, rec)
        if self._flips is not None:
            result.flips = max(result.flips, self._flips)
            if self._flips > self.max_flips:
                bad.add("route")
                if result.first_step is None:
                    result.first_step, result.first_data = step, data
        outs = out if isinstance(out, tuple) else (out,)
        pairs = []
        for i, (o, ref_out) in enumerate(zip(outs, rec["out"])):
            if ref_out is None or not isinstance(o, torch.Tensor):
                continue
            _finite(o.detach(), f"output of {name} at step {step} ({data} data)")
            cos, rel = similarity(sampled(f"{name}/out{i}", o), ref_out)
            if result.add("out", cos, rel, step, data, limits):
                bad.add("out")
            grad_out = rec["grad_out"][i] if i < len(rec["grad_out"]) else None
            if grad_out is not None and o.requires_grad:
                pairs.append((o, grad_out.to(self.device, o.dtype)))
        inputs = [leaf for _, leaf in leaves] + [params[p] for p in owned]
        if not pairs or not inputs:
            return bad
        grads = torch.autograd.grad([o for o, _ in pairs], inputs, [g for _, g in pairs], allow_unused=True)
        for (index, _), grad in zip(leaves, grads):
            if grad is not None:
                _finite(grad, f"input gradient of {name} at step {step} ({data} data)")
                cos, rel = similarity(sampled(f"{name}/{index}", grad), rec["grad_in"][index])
                if result.add("grad", cos, rel, step, data, limits):
                    bad.add("grad")
        for pname, grad in zip(owned, grads[len(leaves):]):
            if grad is None:
                continue
            _finite(grad, f"gradient of {pname} at step {step} ({data} data)")
            cos, rel = similarity(sampled(pname, grad), ref["param_grads"][pname])
            if result.add("grad", cos, rel, step, data, limits):
                bad.add("grad")
            params[pname].grad = grad.detach().to(params[pname].dtype)
        return bad

    def _first_subop(self, unit: str, tape: Tape, ref: dict, forward: bool) -> str:
        """The first operation inside the unit whose output (forward order, when the unit's output diverged) or
        input gradient (backward order) leaves the thresholds."""
        prefix = unit + "."
        records = ref["records"]
        if not any(name.startswith(prefix) for name in ref["forward_order"]):
            return None  # a unit without sub-operations
        order, field, metric, what = (("forward_order", "out", "out", "output") if forward
                                      else ("backward_order", "grad_in", "grad", "gradient"))
        for name in ref[order]:
            mine = tape.records.get(name)
            if not name.startswith(prefix) or mine is None:
                continue
            for index, b in enumerate(records[name][field][:len(getattr(mine, field))]):
                a = mine.compared(field, index)
                if a is not None and b is not None and self._diverges(a, b, unit, metric):
                    return f"{name} ({what})"
        return f"{unit} itself (its sub-operations agree)"

    def _diverges(self, a: torch.Tensor, b: torch.Tensor, unit: str, metric: str) -> bool:
        cos, rel = similarity(a, b)
        kind = self._kinds.get(unit, "default")
        limits = self.limits.get(f"{kind}.{metric}", self.limits.get(kind, self.limits["default"]))
        return cos < limits[0] or rel > limits[1]


def check(ref: str | Path, device: str = "cpu", dtype: str = "float32", config=None, thresholds=None,
          data=None, faults=None, log=None) -> CheckResult:
    return Replayer(ref, device, dtype, config, thresholds, data).run(faults, log)


__all__ = ["check", "CheckResult", "Replayer", "THRESHOLDS", "MAX_FLIPS", "similarity"]
