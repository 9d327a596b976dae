"""Taps on a model's components: what each one got, gave, and the gradients that crossed it, in one training step.

A *unit* is a row of the numerics table (embedding, attention, q/k norm, RoPE, router, experts, shared expert, dense
FFN, MoE dispatch/combine, residual add, norm, output head, loss): its inputs are kept whole so a candidate platform can
replay it alone. Every other module and the functions named in SUBOP_FUNCTIONS inside a unit are *sub-operations*:
only their (sampled) output and input gradients are kept, to name the first one that diverges.

Each unit and residual add draws its random numbers (router jitter, dropout) from a seed of (step, name), so a
replayed unit draws the same numbers as the recorded run on the same generator.
"""

from __future__ import annotations

import contextlib
import functools
import zlib

import torch
import torch.nn.functional as F
from torch import nn

import sigma.train.model as model_mod
import sigma.train.moe as moe_mod

SAMPLE = 16384  # elements kept per compared tensor of a unit or parameter (all of a smaller one)
SUBOP_SAMPLE = 2048  # per tensor of a sub-operation: enough to see which one diverges first


def kind_of(name: str, module: nn.Module | None) -> str | None:
    """The table row of a module, or None for a sub-operation."""
    from sigma.train.model import Attention, RMSNorm
    from sigma.train.moe import FeedForward, GroupedExperts, MoELayer, Router

    last = name.rsplit(".", 1)[-1]
    if name == "tok_embeddings":
        return "embedding"
    if name == "output":
        return "output_head"
    if isinstance(module, RMSNorm):
        return {"q_norm": "q_norm", "k_norm": "k_norm"}.get(last, "norm")
    if isinstance(module, Attention):
        return "attention"
    if isinstance(module, Router):
        return "router"
    if isinstance(module, GroupedExperts):
        return "experts"
    if isinstance(module, MoELayer):
        return "moe_combine"
    if isinstance(module, FeedForward):
        return "shared_expert" if last == "shared" else "dense_ffn"
    return None


@functools.lru_cache(maxsize=4096)
def sample_index(name: str, numel: int, size: int = SAMPLE) -> torch.Tensor | None:
    """Fixed positions (from the name) of up to `size` elements; None: all of them. Drawn with replacement: a
    permutation of a large tensor's every position cost seconds per check, and a repeated position does no harm."""
    if numel <= size:
        return None
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    return torch.randint(0, numel, (size,), generator=gen).sort().values


def sampled(name: str, tensor: torch.Tensor, size: int = SAMPLE) -> torch.Tensor:
    flat = tensor.detach().reshape(-1).float().cpu()
    index = sample_index(name, flat.numel(), size)
    return flat.clone() if index is None else flat[index]


def unit_seed(seed: int, step: int, name: str) -> int:
    return (seed * 1_000_003 + step * 10_007 + zlib.crc32(name.encode())) % (2**62)


def seed_rng(seed: int) -> None:
    """Seed the generators a unit draws from. Not torch.manual_seed: before CUDA is initialised (always, on a CPU
    machine) that queues a CUDA seeding with a formatted stack trace, a large share of a check's time."""
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(seed)


class _GradTap(torch.autograd.Function):
    """Identity whose backward hands the gradient to a callback."""

    @staticmethod
    def forward(ctx, x, callback):
        ctx.callback = callback
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.callback(grad)
        return grad, None


def _differentiable(value) -> bool:
    return isinstance(value, torch.Tensor) and value.requires_grad and value.is_floating_point()


def _detach(value, keep: bool):
    if isinstance(value, torch.Tensor):
        return value.detach().clone().cpu() if keep else None
    return value


class Record:
    """One call of a unit or sub-operation in one step."""

    def __init__(self, name: str, kind: str | None):
        self.name, self.kind = name, kind
        self.args: list = []  # units: every positional argument (tensors whole, on CPU)
        self.seed: int | None = None
        self.out: list = []  # sampled float outputs (None for non-float or missing ones)
        self.routes: torch.Tensor | None = None  # routers: the expert ids each token was sent to [N, k]
        self.grad_out: list = []  # units: full gradients of the outputs (None: no gradient reached it)
        self.grad_in: list = []  # sampled gradients of the float inputs, in argument order
        self.param_grads: dict[str, torch.Tensor] = {}

    def compared(self, field: str, index: int) -> torch.Tensor | None:
        """out[index] or grad_in[index] sampled as the recording sampled it (for a lazy tape's raw tensors)."""
        value = getattr(self, field)[index]
        if value is None:
            return None
        key = f"out{index}" if field == "out" else str(index)
        return sampled(f"{self.name}/{key}", value, SAMPLE if self.kind else SUBOP_SAMPLE)

    def to_dict(self) -> dict:
        return dict(name=self.name, kind=self.kind, args=self.args, seed=self.seed, out=self.out,
                    grad_out=self.grad_out, grad_in=self.grad_in, routes=self.routes)


class Tape:
    """Hooks on a model; `step(s)` opens the records of one step. `units` keeps the table rows in forward order.

    lazy: keep the outputs and gradients as they are (detached, on their device) instead of sampling them to CPU at
    once; a check looks at them only inside a failing unit, so sampling every one of them was wasted work."""

    def __init__(self, model: nn.Module, seed: int, keep_args: bool = True, lazy: bool = False):
        self.model, self.seed, self.keep_args, self.lazy = model, seed, keep_args, lazy
        self.records: dict[str, Record] = {}
        self.forward_order: list[str] = []
        self.backward_order: list[str] = []
        self.step_no = 0
        self._stack: list[str] = []
        self._calls: dict[str, int] = {}
        self._handles = []
        self._names = {m: n for n, m in model.named_modules()}

    # ------------------------------------------------------------------ records
    def new_step(self, step: int) -> None:
        self.step_no = step
        self.records, self.forward_order, self.backward_order, self._calls = {}, [], [], {}

    def _record(self, name: str, kind: str | None) -> Record:
        rec = Record(name, kind)
        self.records[name] = rec
        return rec

    def _grad_callback(self, rec: Record, slot: list, index: int, full: bool):
        def callback(grad):
            if rec.name not in self.backward_order:
                self.backward_order.append(rec.name)
            if self.lazy:
                slot[index] = grad.detach()
            elif full:
                slot[index] = grad.detach().float().cpu().clone()
            else:
                slot[index] = sampled(f"{rec.name}/{index}", grad, SAMPLE if rec.kind else SUBOP_SAMPLE)
        return callback

    def tap_inputs(self, rec: Record, args: tuple, keep: bool) -> tuple:
        if keep:
            rec.args = [_detach(a, True) for a in args]
        rec.grad_in = [None] * len(args)
        return tuple(_GradTap.apply(a, self._grad_callback(rec, rec.grad_in, i, False)) if _differentiable(a) else a
                     for i, a in enumerate(args))

    def tap_outputs(self, rec: Record, output):
        outs = output if isinstance(output, tuple) else (output,)
        size = SAMPLE if rec.kind else SUBOP_SAMPLE
        rec.out = [(o.detach() if self.lazy else sampled(f"{rec.name}/out{i}", o, size))
                   if isinstance(o, torch.Tensor) and o.is_floating_point() else None for i, o in enumerate(outs)]
        if rec.kind == "router" and not self.lazy:
            rec.routes = outs[0].detach().cpu().clone()
        self.forward_order.append(rec.name)
        if rec.kind is None:  # a sub-operation: its input gradients name it; the output gradient is not needed
            return output
        rec.grad_out = [None] * len(outs)
        tapped = tuple(_GradTap.apply(o, self._grad_callback(rec, rec.grad_out, i, True)) if _differentiable(o) else o
                       for i, o in enumerate(outs))
        return tapped if isinstance(output, tuple) else tapped[0]

    # ------------------------------------------------------------------ hooks
    def install(self, residuals: bool = True):
        """residuals: the residual-add records, which need whole blocks to run (not in a unit-by-unit replay)."""
        from sigma.train.model import Block

        for name, module in self.model.named_modules():
            if residuals and isinstance(module, Block):
                self._install_residuals(name, module)
        for name, module in self.model.named_modules():
            if name and not isinstance(module, (Block, nn.ModuleList)):
                self._install_module(name, module, kind_of(name, module))
        return self

    def _install_module(self, name: str, module: nn.Module, kind: str | None):
        def pre(mod, args):
            self._stack.append(name)
            rec = self._record(name, kind)
            if kind is not None:
                rec.seed = unit_seed(self.seed, self.step_no, name)
                seed_rng(rec.seed)
            return self.tap_inputs(rec, args, keep=kind is not None and self.keep_args)

        def post(mod, args, output):
            self._stack.pop()
            return self.tap_outputs(self.records[name], output)

        self._handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]

    def _install_residuals(self, name: str, block: nn.Module):
        """The two residual adds of a block: x + drop(attn(...)) and x1 + drop(ffn(...)); units of their own."""
        first, second = f"{name}.residual_attn", f"{name}.residual_ffn"
        state: dict = {}

        def block_pre(mod, args):
            state["x"] = args[0]

        def branch_done(which: str, slot):
            def hook(mod, args, output):
                branch = output[0] if isinstance(output, tuple) else output
                rec = self._record(slot, "residual")
                rec.seed = unit_seed(self.seed, self.step_no, slot)
                seed_rng(rec.seed)  # the dropout of this add draws from here
                source = state["x"] if which == "attn" else state["x1"]
                rec.args = [_detach(source, self.keep_args), _detach(branch, self.keep_args), float(mod_drop(block)),
                            block.training]
                rec.grad_in = [None, None]
                rec.branch = self._names[mod]  # its gradient of the branch is that unit's output gradient
                state["rec_" + which] = rec
            return hook

        def ffn_norm_pre(mod, args):
            x1 = args[0]
            state["x1"] = x1
            rec = state["rec_attn"]
            self._finish_residual(rec, x1)

        def block_post(mod, args, output):
            x2, aux = output
            return self._finish_residual(state["rec_ffn"], x2, tap=True), aux

        self._handles += [block.register_forward_pre_hook(block_pre),
                          block.attn.register_forward_hook(branch_done("attn", first)),
                          block.ffn.register_forward_hook(branch_done("ffn", second)),
                          block.ffn_norm.register_forward_pre_hook(ffn_norm_pre),
                          block.register_forward_hook(block_post)]

    def _finish_residual(self, rec: Record, out: torch.Tensor, tap: bool = False):
        rec.out = [sampled(f"{rec.name}/out0", out)]
        rec.grad_out = [None]
        self.forward_order.append(rec.name)
        if out.requires_grad:
            callback = self._grad_callback(rec, rec.grad_out, 0, True)
            if tap:
                return _GradTap.apply(out, callback)
            out.register_hook(lambda g: callback(g))  # every consumer's gradient of x1
        return out

    def finish_step(self) -> None:
        """After the backward: a residual add's gradient of its branch input is the branch unit's output gradient."""
        for rec in self.records.values():
            branch = getattr(rec, "branch", None)
            if branch is not None and branch in self.records:
                grad = self.records[branch].grad_out[0]
                rec.grad_in = [None, None if grad is None else sampled(f"{rec.name}/1", grad)]

    def remove(self):
        for handle in self._handles:
            handle.remove()
        self._handles = []

    # ------------------------------------------------------------------ sub-operation functions
    @contextlib.contextmanager
    def functions(self):
        """RoPE, SDPA and the grouped GEMM as sub-operations of the unit they run in (RoPE is a unit too)."""
        originals = {(model_mod, "apply_rope"): model_mod.apply_rope,
                     (F, "scaled_dot_product_attention"): F.scaled_dot_product_attention,
                     (moe_mod, "grouped_mm"): moe_mod.grouped_mm}
        try:
            for (owner, attr), fn in originals.items():
                setattr(owner, attr, self._wrap(attr, fn))
            yield self
        finally:
            for (owner, attr), fn in originals.items():
                setattr(owner, attr, fn)

    def _wrap(self, attr: str, fn):
        short = {"apply_rope": "rope", "scaled_dot_product_attention": "sdpa", "grouped_mm": "grouped_mm"}[attr]

        def wrapped(*args, **kwargs):
            parent = self._stack[-1] if self._stack else "model"
            count = self._calls.get(f"{parent}.{short}", 0)
            self._calls[f"{parent}.{short}"] = count + 1
            name = f"{parent}.rope_{'qk'[count]}" if short == "rope" and count < 2 else f"{parent}.{short}{count}"
            kind = "rope" if short == "rope" else None
            rec = self._record(name, kind)
            args = self.tap_inputs(rec, args, keep=kind is not None and self.keep_args)
            if kind:
                rec.args.append(kwargs)
            self._stack.append(name)
            try:
                out = fn(*args, **kwargs)
            finally:
                self._stack.pop()
            return self.tap_outputs(rec, out)
        return wrapped


def mod_drop(block) -> float:
    return getattr(block, "dropout", 0.0)
