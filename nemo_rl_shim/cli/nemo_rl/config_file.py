"""One YAML config file, read as OmegaConf reads it, but bounded: a regular file, decoded, its aliases counted.

``OmegaConf.load`` opens whatever path it is given and hands the text to PyYAML, whose aliases (``*a``) repeat a
node without copying it: a 540-byte file of nine anchors, each a list of ten aliases to the one before, stands for
10**9 nodes, and ``OmegaConf.create`` copies every one (it hung ``preflight``). A FIFO given as the path blocks the
open forever; ``/dev/urandom`` never ends, or fails to decode with a message that names no file. :func:`load_yaml`
is OmegaConf's ``load`` with those closed:

* the file is read by :func:`~nemo_rl_shim.cli.untrusted_file.read_untrusted`: a regular file (a symlink is
  followed; what it points to must be one), at most :data:`CONFIG_CAP` bytes;
* it is decoded as UTF-8, and a decoding error names the file and the byte;
* it is composed (PyYAML's node graph, with OmegaConf's own loader), and the nodes its aliases expand to are counted
  before anything is built (each node once: linear in the file): past :data:`MAX_EXPANDED_NODES`, or an alias that
  contains itself, it is refused;
* then it is built and handed to ``OmegaConf.create``, exactly as ``OmegaConf.load`` does.

Errors are :class:`ConfigFileError` (a ``ValueError``), one line naming the file. OmegaConf and PyYAML are imported
inside the functions, as in :mod:`.recipe`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nemo_rl_shim.cli.untrusted_file import UntrustedFileError, read_untrusted
from nemo_rl_shim.one_line.exception import first_line
from nemo_rl_shim.one_line.printable import shown_path

__all__ = ["CONFIG_CAP", "MAX_EXPANDED_NODES", "ConfigFileError", "expanded_nodes", "load_yaml"]

#: A config file is at most this large (NeMo RL's recipes are a few KiB).
CONFIG_CAP = 16 << 20
#: The nodes one file's aliases may expand to, counting each repetition (NeMo RL's largest recipe: a few thousand).
MAX_EXPANDED_NODES = 1_000_000


class ConfigFileError(ValueError):
    """A config file that is not read: its message is one line naming the file."""


def expanded_nodes(root: Any, limit: int = MAX_EXPANDED_NODES) -> int:
    """How many nodes the YAML node graph ``root`` stands for with every alias expanded (each node's count made once,
    so the count costs the graph's size); ``ValueError`` past ``limit`` or on an alias that contains itself."""
    from yaml.nodes import MappingNode, SequenceNode

    def children(node: Any) -> list[Any]:
        if isinstance(node, SequenceNode):
            return list(node.value)
        if isinstance(node, MappingNode):
            return [part for pair in node.value for part in pair]
        return []

    sizes: dict[int, int] = {}
    visiting: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        key = id(node)
        if key in sizes:
            continue
        if expanded:
            visiting.discard(key)
            sizes[key] = 1 + sum(sizes[id(child)] for child in children(node))
            if sizes[key] > limit:
                raise ValueError(f"its aliases expand to more than {limit:,} nodes")
            continue
        if key in visiting:
            raise ValueError("an alias contains itself")
        visiting.add(key)
        stack.append((node, True))
        stack += [(child, False) for child in children(node) if id(child) not in sizes]
    return sizes[id(root)]


def _text(path: Path) -> str:
    try:
        data = read_untrusted(path, cap=CONFIG_CAP, what="config")
    except UntrustedFileError as e:
        raise ConfigFileError(str(e)) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        byte = data[e.start : e.start + 1].hex()
        raise ConfigFileError(f"{shown_path(path)}: not UTF-8 text (byte 0x{byte} at offset {e.start:,})") from None


def load_yaml(path: Path) -> Any:
    """``OmegaConf.load(path)``, bounded (see the module docstring): a ``DictConfig`` or a ``ListConfig``.
    :class:`ConfigFileError` where the file is refused; PyYAML's and OmegaConf's own errors pass, as from
    ``OmegaConf.load``."""
    from omegaconf import OmegaConf
    from omegaconf._utils import get_yaml_loader

    loader = get_yaml_loader()(_text(path))
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise ConfigFileError(f"{shown_path(path)}: nested too deep to read") from None
        if node is not None:
            try:
                expanded_nodes(node)
            except ValueError as e:
                raise ConfigFileError(f"{shown_path(path)}: {first_line(e, with_type=False)}: refused") from None
        data = loader.construct_document(node) if node is not None else None
    finally:
        loader.dispose()
    if data is not None and not isinstance(data, list | dict | str):
        raise ConfigFileError(f"{shown_path(path)}: holds a {type(data).__name__}, not a config")
    return OmegaConf.create() if data is None else OmegaConf.create(data)
