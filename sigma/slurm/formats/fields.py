"""Fail-closed reading of SLURM's JSON: every field used is checked against the shape its format family gives it.

A field of another shape (a list where a string was, an object where a number was) is never guessed at: it raises
SlurmFormatError naming the Slurm release, the data parser, the command and the field's path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sigma.slurm.command import SlurmError

MISSING = ...  # `default=...`: the field must be there


@dataclass(frozen=True)
class Source:
    """Where a JSON answer came from, for error messages."""

    release: str  # "24.11.5"
    parser: str  # "data_parser/v0.0.42", "openapi/v0.0.38"
    argv: tuple[str, ...]

    @property
    def command(self) -> str:
        return " ".join(self.argv)


class SlurmFormatError(SlurmError):
    """SLURM answered in a shape sigma does not know: never acted on, always named."""

    def __init__(self, source: Source, field: str, problem: str):
        self.source = source
        self.field = field
        message = (f"`{source.command}` of Slurm {source.release} ({source.parser}) gave field {field} {problem}; "
                   f"sigma reads Slurm 22.05 to 26.05 (see docs/slurm-versions.md)")
        super().__init__(source.argv, 0, message)
        self.args = (message,)


class Record:
    """One JSON object of a SLURM answer, read field by field."""

    def __init__(self, data: Any, source: Source, path: str):
        if not isinstance(data, dict):
            raise SlurmFormatError(source, path, f"as {type(data).__name__}, not an object")
        self.data = data
        self.source = source
        self.path = path

    def _get(self, key: str, default: Any) -> Any:
        value = self.data.get(key, MISSING)
        if value is MISSING:
            if default is MISSING:
                raise SlurmFormatError(self.source, f"{self.path}.{key}", "missing")
            return default
        return value

    def _wrong(self, key: str, value: Any, expected: str):
        return SlurmFormatError(self.source, f"{self.path}.{key}", f"as {type(value).__name__} {_short(value)}, "
                                                                  f"not {expected}")

    def str(self, key: str, default: Any = "") -> str:
        value = self._get(key, default)
        if value is None:
            return "" if default is MISSING else default
        if not isinstance(value, str):
            raise self._wrong(key, value, "a string")
        return value

    def int(self, key: str, default: Any = 0) -> int | None:
        """An integer, plain (v0.0.38) or as a number object {set, infinite, number}; unset gives default."""
        value = self._get(key, default)
        if isinstance(value, dict) and {"set", "number"} <= value.keys():
            if not value["set"] or value.get("infinite"):
                return None if default is MISSING else default
            value = value["number"]
        if value is None:
            return None if default is MISSING else default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._wrong(key, value, "an integer or a number object")
        return value

    def bool(self, key: str, default: Any = False) -> bool:
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise self._wrong(key, value, "a boolean")
        return value

    def strs(self, key: str, default: Any = ()) -> tuple[str, ...]:
        value = self._get(key, default)
        if value is None:
            return ()
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise self._wrong(key, value, "a list of strings")
        return tuple(value)

    def ident(self, key: str, default: Any = MISSING) -> str:
        """An id SLURM prints as a string or a number (22.05: step id "batch" or 0)."""
        value = self._get(key, default)
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return self.str(key, default)

    def record(self, key: str, default: Any = MISSING) -> "Record":
        value = self._get(key, default)
        return Record({} if value is None else value, self.source, f"{self.path}.{key}")

    def records(self, key: str, default: Any = MISSING) -> list["Record"]:
        value = self._get(key, default)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self._wrong(key, value, "a list of objects")
        return [Record(v, self.source, f"{self.path}.{key}[{i}]") for i, v in enumerate(value)]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
