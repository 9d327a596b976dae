"""Change values in a YAML file's text and keep everything else (comments, order, spacing): a site's configs are the
shipped files with a few values set, so an admin reads them like the shipped ones and diffs them after an upgrade."""

from __future__ import annotations

import yaml


def set_values(text: str, changes: dict[str, object], where: str = "config") -> str:
    """text with each dotted key's value replaced; a key missing from a mapping the file has is added at its end
    (the typed loaders refuse a misspelt one); lists and mappings are written as block YAML at the key's
    indentation."""
    root = yaml.compose(text)
    spans = []
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = root
        for part in parents:
            node = _child(node, part, dotted, where)
            if node is None:
                raise KeyError(f"{where}: no key {dotted!r} to set")
        found = _child(node, last, dotted, where)
        if found is None:  # a new key: a line after the mapping's last one, at its indentation
            if not node.value or node.flow_style:
                raise KeyError(f"{where}: no key {dotted!r} to set")
            column = node.value[0][0].start_mark.column
            end = _end(text, node)
            spans.append((end, end, "\n" + " " * column + f"{last}: " + _render(value, column + 2)))
            continue
        end = _end(text, found)
        if yaml.SafeLoader("").construct_document(found) == value:
            continue  # already so: the line stays as written
        spans.append((found.start_mark.index, end, _render(value, found.start_mark.column)))
    for start, end, replacement in sorted(spans, reverse=True):
        text = text[:start] + replacement + text[end:]
    return text


def _child(node, key: str, dotted: str, where: str):
    if not isinstance(node, yaml.MappingNode):
        raise KeyError(f"{where}: {dotted}: {key!r} is not inside a mapping")
    return next((v for k, v in node.value if k.value == key), None)


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
    if not isinstance(value, (list, dict)):  # plain where YAML reads it back as the same value, else quoted
        return yaml.safe_dump(value, default_flow_style=True).removesuffix("\n...\n").strip()
    lines = yaml.safe_dump(value, default_flow_style=False, sort_keys=False).rstrip("\n").split("\n")
    return lines[0] + "".join("\n" + " " * column + line for line in lines[1:])
