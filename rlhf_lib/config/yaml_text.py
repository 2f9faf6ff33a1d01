"""Config files read strictly: UTF-8 text of at most `MAX_BYTES`, no duplicate keys, and at most `MAX_NODES` values
once YAML aliases are expanded (a few hundred bytes of nested aliases can otherwise expand to gigabytes). Each refusal
is a `ConfigError` naming the file and, where there is one, the line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlhf_lib.config.base import ConfigError

MAX_BYTES = 1 << 20  # 1 MiB: the largest preset is 5 KB
MAX_NODES = 100_000  # values after alias expansion: a full config has ~300


def _loader_class():
    import yaml

    class StrictLoader(yaml.SafeLoader):
        """SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last one silently)."""

        def construct_mapping(self, node, deep=False):
            if isinstance(node, yaml.MappingNode):
                seen: dict[Any, int] = {}
                for key_node, _ in node.value:
                    key = self.construct_object(key_node, deep=True)
                    line = key_node.start_mark.line + 1
                    try:
                        first = seen.setdefault(key, line)
                    except TypeError:  # an unhashable key: SafeLoader's own error names it
                        break
                    if first != line:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"duplicate key {key!r} (first on line {first})", key_node.start_mark)
            return super().construct_mapping(node, deep=deep)

    return StrictLoader


def expanded_size(node, limit: int = MAX_NODES) -> int:
    """Values in the YAML node graph `node` once every alias is expanded, counted without expanding (a shared node
    counts each time it is used); stops early past `limit`. A recursive alias counts as over the limit."""
    import yaml

    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(n) -> int:
        if id(n) in sizes:
            return sizes[id(n)]
        if id(n) in active:
            return limit + 1
        active.add(id(n))
        total = 1
        if isinstance(n, yaml.SequenceNode):
            children = n.value
        elif isinstance(n, yaml.MappingNode):
            children = [c for pair in n.value for c in pair]
        else:
            children = []
        for child in children:
            total += size(child)
            if total > limit:
                break
        active.discard(id(n))
        sizes[id(n)] = total
        return total

    return size(node)


def parse_yaml(text: str, origin: str) -> Any:
    """The YAML document `text` (from `origin`, for errors) as Python values, refused as the module says."""
    import yaml

    loader = _loader_class()(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if (n := expanded_size(node)) > MAX_NODES:
            raise ConfigError(f"{origin}: the YAML expands to more than {MAX_NODES:,} values (aliases: &/* "
                              f"references); a config has a few hundred")
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        raise ConfigError(_one_line(e, origin)) from None
    finally:
        loader.dispose()


def _one_line(e, origin: str) -> str:
    """PyYAML's error as one line: `origin:line:column: invalid YAML: what` (its own spans several, with a caret)."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    where = f"{origin}:{mark.line + 1}:{mark.column + 1}" if mark is not None else origin
    what = "; ".join(str(p) for p in (getattr(e, "context", None), getattr(e, "problem", None)) if p) or str(e)
    return f"{where}: invalid YAML: {what}"


def read_yaml(path: Path) -> Any:
    """The YAML file `path`, refused as the module says."""
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise ConfigError(f"{path}: {size:,} bytes; a config file is at most {MAX_BYTES:,}")
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read it: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text (byte {raw[e.start]:#04x} at offset {e.start}); save the "
                          "file as UTF-8") from None
    if "\x00" in text:
        line = text[: text.index("\x00")].count("\n") + 1
        raise ConfigError(f"{path}:{line}: a NUL byte; a config file is YAML text")
    return parse_yaml(text, str(path))
