"""Change values in a YAML file's text and keep everything else (comments, order, spacing): a site's configs are the
shipped files with a few values set, so an admin reads them like the shipped ones and diffs them after an upgrade."""

from __future__ import annotations

import json

import yaml


def set_values(text: str, changes: dict[str, object], where: str = "config") -> str:
    """text with each dotted key's value replaced (the key must exist: a misspelt one would silently add nothing);
    scalars are written as JSON (which YAML reads), lists and mappings as block YAML at the key's indentation."""
    root = yaml.compose(text)
    spans = []
    for dotted, value in changes.items():
        node = root
        for part in dotted.split("."):
            if not isinstance(node, yaml.MappingNode):
                raise KeyError(f"{where}: {dotted}: {part!r} is not inside a mapping")
            found = [v for k, v in node.value if k.value == part]
            if not found:
                raise KeyError(f"{where}: no key {dotted!r} to set")
            node = found[0]
        end = _end(text, node)
        if yaml.SafeLoader("").construct_document(node) == value:
            continue  # already so: the line stays as written
        spans.append((node.start_mark.index, end, _render(value, node.start_mark.column)))
    for start, end, replacement in sorted(spans, reverse=True):
        text = text[:start] + replacement + text[end:]
    return text


def _end(text: str, node) -> int:
    """Where the value's own text ends: a block collection's end mark lies past the blank and comment lines that
    follow it, which belong to what comes next."""
    end = node.end_mark.index
    if isinstance(node, yaml.ScalarNode):
        return end
    while end > node.start_mark.index and text[end - 1] in " \n":
        end -= 1
    return end


def _render(value, column: int) -> str:
    if not isinstance(value, (list, dict)):
        return json.dumps(value)
    lines = yaml.safe_dump(value, default_flow_style=False, sort_keys=False).rstrip("\n").split("\n")
    return lines[0] + "".join("\n" + " " * column + line for line in lines[1:])
