"""The reference directory written by `sigma numerics record` and its validation.

    REF/meta.json           what was recorded: versions, run and model config, steps, batch shape, units, parameters
    REF/init.pt             the initial weights and buffers (the candidate starts from exactly these)
    REF/<data>/step-<s>.pt  per data kind (random, real) and optimiser step: every unit's inputs, sampled outputs,
                            gradients, and the sampled parameters and gradients after the step
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

FORMAT = 2  # 2: tensors sampled at positions drawn with replacement


class NumericsError(ValueError):
    """A reference or candidate that cannot be compared; the message names what does not match."""


def meta_path(ref: Path) -> Path:
    return Path(ref) / "meta.json"


def load_meta(ref: str | Path) -> dict:
    path = meta_path(Path(ref))
    if not Path(ref).is_dir():
        raise NumericsError(f"{ref}: no such reference directory (write one with `sigma numerics record`)")
    if not path.is_file():
        raise NumericsError(f"{path}: missing; {ref} is not a reference written by `sigma numerics record`")
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise NumericsError(f"{path}: corrupt reference metadata ({exc})") from None
    missing = [k for k in ("format", "sigma_version", "model", "train", "steps", "data", "units", "params")
               if k not in meta]
    if missing:
        raise NumericsError(f"{path}: corrupt reference metadata, missing field(s) {', '.join(missing)}")
    if meta["format"] != FORMAT:
        raise NumericsError(f"{path}: reference format {meta['format']}, this sigma reads format {FORMAT}: record "
                            "the reference again with this version")
    return meta


def load_tensors(path: Path, what: str) -> dict:
    if not path.is_file():
        raise NumericsError(f"{path}: missing from the reference ({what})")
    try:
        # mmap: the storages are mapped, not copied out of the file one by one (several times faster)
        return torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except Exception as exc:  # torch raises several types for a truncated or overwritten file
        raise NumericsError(f"{path}: corrupt reference file ({what}): {type(exc).__name__}: {exc}") from None


def step_path(ref: Path, data: str, step: int) -> Path:
    return Path(ref) / data / f"step-{step}.pt"


def check_model_matches(meta: dict, model_cfg: dict, where: str) -> None:
    """The candidate's model config (from --config) equals the reference's; else name the differing keys."""
    ref = meta["model"]
    diff = [f"{k}: reference {ref.get(k)!r}, {where} {model_cfg.get(k)!r}"
            for k in sorted(set(ref) | set(model_cfg)) if ref.get(k) != model_cfg.get(k)]
    if diff:
        raise NumericsError(f"the reference was recorded for another model config; differing keys: {'; '.join(diff)}")


def check_state_matches(state: dict, model_state: dict, source: str) -> None:
    missing = sorted(set(model_state) - set(state))
    extra = sorted(set(state) - set(model_state))
    if missing or extra:
        raise NumericsError(f"{source}: the reference's weights do not fit this model: missing "
                            f"{', '.join(missing) or 'none'}; not in the model: {', '.join(extra) or 'none'}")
    for key, value in model_state.items():
        if tuple(state[key].shape) != tuple(value.shape):
            raise NumericsError(f"{source}: {key} has shape {tuple(state[key].shape)} in the reference, "
                                f"{tuple(value.shape)} in this model")
