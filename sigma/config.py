"""Typed YAML configs: dataclasses with a comment per default; errors name the file, line and key.

    @dataclass
    class Policy:
        hang_timeout_s: float = 120.0  # no step progress for this long is a hang

    policy = load_config(Policy, "configs/controller.yaml")            # whole file
    policy = load_config(Policy, "configs/controller.yaml", "watchdog")  # one top-level section

Strict: unknown keys are errors that list the valid ones; a key given twice in one mapping is an error (YAML
itself would keep the last one silently); values are checked against the field types (int, float, str, bool,
lists, dicts, Optional, nested dataclasses, lists of dataclasses), so a scalar where a list belongs fails at load
time, not later at run time; numbers must be finite. Every error names the file, the line and the key.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")

YAML_SUFFIXES = (".yaml", ".yml")  # both spellings are YAML files wherever a directory of configs is read


def yaml_files(directory: str | Path) -> list[Path]:
    """The YAML files of a directory, sorted by name, whichever extension they use."""
    return sorted(p for p in Path(directory).iterdir() if p.suffix in YAML_SUFFIXES and p.is_file())


class ConfigError(ValueError):
    """A config problem located at file:line and a dotted key path."""

    def __init__(self, where: str, message: str):
        self.where = where
        super().__init__(f"{where}: {message}")


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml where PyYAML has it: the rules load 10x faster


class _Source:
    """Maps key paths to line numbers of one YAML document."""

    def __init__(self, path: str, text: str):
        self.path = path
        self.lines: dict[tuple, int] = {}
        try:
            root = yaml.compose(text, Loader=_LOADER)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = f":{mark.line + 1}" if mark else ""
            raise ConfigError(f"{path}{line}", f"invalid YAML: {getattr(exc, 'problem', exc)}") from None
        if root is not None:
            self._index(root, ())

    def _index(self, node, key: tuple) -> None:
        self.lines.setdefault(key, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for k, v in node.value:
                line = k.start_mark.line + 1
                if k.value in seen and k.tag != "tag:yaml.org,2002:merge":
                    dotted = ".".join(str(x) for x in key + (k.value,))
                    raise ConfigError(f"{self.path}:{line} [{dotted}]",
                                      f"duplicate key {k.value!r} (first given at line {seen[k.value]})")
                seen[k.value] = line
                self.lines[key + (k.value,)] = line
                self._index(v, key + (k.value,))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self._index(item, key + (i,))

    def where(self, key: tuple) -> str:
        probe = key
        while probe and probe not in self.lines:
            probe = probe[:-1]
        line = self.lines.get(probe)
        dotted = ".".join(str(k) for k in key)
        return f"{self.path}{f':{line}' if line else ''}{f' [{dotted}]' if dotted else ''}"


def load_yaml(path: str | Path) -> tuple[Any, _Source]:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(str(path), f"cannot read config: {exc.strerror}") from None
    source = _Source(str(path), text)
    return yaml.load(text, Loader=_LOADER), source  # noqa: S506 - a safe loader


def load_config(cls: type[T], path: str | Path, section: str | None = None) -> T:
    data, source = load_yaml(path)
    key: tuple = ()
    if section is not None:
        if not isinstance(data, dict) or section not in data:
            return from_dict(cls, {}, source, (section,))
        data, key = data[section], (section,)
    return from_dict(cls, data if data is not None else {}, source, key)


def from_dict(cls: type[T], data: Any, source: _Source | None = None, key: tuple = ()) -> T:
    """Build dataclass cls from plain data, checking keys and types."""
    source = source or _Source("<config>", "")
    return _convert(cls, data, source, key)


def _convert(tp, value, source: _Source, key: tuple):
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(source.where(key), f"expected a mapping for {tp.__name__}, got {_kind(value)}")
        hints = typing.get_type_hints(tp)
        fields = {f.name: f for f in dataclasses.fields(tp) if f.init}
        unknown = [k for k in value if k not in fields]
        if unknown:
            raise ConfigError(source.where(key + (unknown[0],)),
                              f"unknown key {unknown[0]!r}; valid keys: {', '.join(sorted(fields))}")
        kwargs = {name: _convert(hints[name], value[name], source, key + (name,))
                  for name in fields if name in value}
        missing = [n for n, f in fields.items() if n not in kwargs and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        if missing:
            raise ConfigError(source.where(key), f"missing required key {missing[0]!r}")
        try:
            return tp(**kwargs)
        except (TypeError, ValueError) as exc:  # __post_init__ validation
            raise ConfigError(source.where(key), str(exc)) from None
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:  # Optional[X]: X's own error, located where it happened
            return _convert(options[0], value, source, key)
        errors = []
        for option in options:
            try:
                return _convert(option, value, source, key)
            except ConfigError as exc:
                errors.append(str(exc).split(": ", 1)[-1])
        raise ConfigError(source.where(key), " or ".join(errors))
    if origin is None and tp in (list, tuple, dict):  # a bare `list` / `dict` annotation: still a list / a mapping
        return _convert(tp[Any] if tp is not dict else dict[Any, Any], value, source, key)
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise ConfigError(source.where(key), f"expected a list, got {_kind(value)}")
        item = args[0] if args else Any
        items = [_convert(item, v, source, key + (i,)) for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(source.where(key), f"expected a mapping, got {_kind(value)}")
        kt, vt = args or (Any, Any)
        return {_convert(kt, k, source, key): _convert(vt, v, source, key + (k,)) for k, v in value.items()}
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(source.where(key), f"must be one of {', '.join(map(repr, args))}, not {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(source.where(key), f"expected a number, got {_kind(value)}")
        if not math.isfinite(value):
            raise ConfigError(source.where(key), f"expected a finite number, got {value!r}")
        return float(value)
    if tp in (int, str, bool):
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            raise ConfigError(source.where(key), f"expected {tp.__name__}, got {_kind(value)}")
        return value
    return value


def _kind(value) -> str:
    return f"{type(value).__name__} {value!r}" if not isinstance(value, (dict, list)) else type(value).__name__
