"""torch's AdamW without importing torch._dynamo, which costs 1-2 s of every rank's start-up (every restart too)
and which an eager run never uses.

torch imports it lazily, on first use, from the step's wrapper (a graph break for torch.compile) and from the
Optimizer methods it marks `torch._disable_dynamo` (add_param_group, called by the constructor, zero_grad,
state_dict, load_state_dict). Outside torch.compile both wrappers only call the function they wrap (the step's
with gradients off), so this class calls the wrapped functions directly: the same code and the same numbers.
Under torch.compile, or where a torch version no longer exposes the wrapped function, torch's own path is taken.
"""

from __future__ import annotations

import inspect

import torch


def _eager(method):
    """The function under torch's wrappers of `method`, or None under torch.compile (the wrappers matter there)."""
    if torch.compiler.is_compiling():
        return None
    inner = inspect.unwrap(method)
    return inner if inner is not method else None


class AdamW(torch.optim.AdamW):
    def step(self, closure=None):
        inner = _eager(torch.optim.AdamW.step)
        if inner is None or self.defaults["differentiable"]:
            return super().step(closure)
        with torch.no_grad():  # what torch's wrapper sets for an optimiser that is not differentiable
            return inner(self, closure)

    def add_param_group(self, param_group):
        inner = _eager(torch.optim.Optimizer.add_param_group)
        return inner(self, param_group) if inner else super().add_param_group(param_group)

    def zero_grad(self, set_to_none: bool = True):
        inner = _eager(torch.optim.Optimizer.zero_grad)
        return inner(self, set_to_none) if inner else super().zero_grad(set_to_none)

    def state_dict(self):
        inner = _eager(torch.optim.Optimizer.state_dict)
        return inner(self) if inner else super().state_dict()

    def load_state_dict(self, state_dict):
        inner = _eager(torch.optim.Optimizer.load_state_dict)
        return inner(self, state_dict) if inner else super().load_state_dict(state_dict)
