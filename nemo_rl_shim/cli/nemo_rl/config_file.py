"""One YAML config file, read as OmegaConf reads it, but bounded: a regular file, decoded, its nodes counted.

``OmegaConf.load`` opens whatever path it is given and hands the text to PyYAML, whose aliases (``*a``) repeat a
node without copying it: a 540-byte file of nine anchors, each a list of ten aliases to the one before, stands for
10**9 nodes, and ``OmegaConf.create`` copies every one (it hung ``preflight``). A FIFO given as the path blocks the
open forever; ``/dev/urandom`` never ends, or fails to decode with a message that names no file. :func:`load_yaml`
is OmegaConf's ``load`` with those closed:

* the file is read by :func:`~nemo_rl_shim.untrusted.files.read_untrusted`: a regular file (a symlink is
  followed; what it points to must be one), at most :data:`CONFIG_CAP` bytes;
* it is decoded as UTF-8, and a decoding error names the file and the byte;
* it is composed (PyYAML's node graph, with OmegaConf's own loader), counting the nodes written in it as they are
  composed: past the recipe's :class:`NodeBudget` (:data:`MAX_RECIPE_NODES` over every file one recipe reads), it is
  refused as soon as the count passes, before the rest is composed (the keys rule: 500,000 keys are refused after
  :data:`MAX_RECIPE_NODES`, not after all of them);
* the nodes its aliases expand to are counted before anything is built (each node once: linear in the file): past
  what is left of the budget, or an alias that contains itself, it is refused (the aliases rule);
* then it is built and handed to ``OmegaConf.create``, exactly as ``OmegaConf.load`` does.

Errors are :class:`ConfigFileError` (a ``ValueError``), one line naming the file and the rule. OmegaConf and PyYAML are
imported inside the functions, as in :mod:`.recipe`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_rl_shim.one_line.exception import first_line
from nemo_rl_shim.one_line.printable import shown_path
from nemo_rl_shim.untrusted.files import UntrustedFileError, read_untrusted

__all__ = [
    "CONFIG_CAP",
    "LARGEST_NEMO_RL_RECIPE_NODES",
    "MAX_RECIPE_NODES",
    "ConfigFileError",
    "NodeBudget",
    "expanded_nodes",
    "load_yaml",
]

#: A config file is at most this large (NeMo RL's recipes are a few KiB).
CONFIG_CAP = 16 << 20
#: The most YAML nodes (keys, values, lists, with every alias expanded) that NeMo RL's largest recipe builds, over all
#: its files: ``distillation_math_megatron.yaml`` at NVIDIA-NeMo/RL 7ea279abf (295 files of examples/configs read).
LARGEST_NEMO_RL_RECIPE_NODES = 1_604
#: The YAML nodes one recipe may build over every file it reads (each read counted, aliases expanded): 30 times NeMo
#: RL's largest. PyYAML composes 50,000 nodes in about 1.3 s of CPU here, and OmegaConf builds them in as much again.
MAX_RECIPE_NODES = 50_000


@dataclass
class NodeBudget:
    """The YAML nodes one recipe may still build: :data:`MAX_RECIPE_NODES` over every file it reads."""

    limit: int = MAX_RECIPE_NODES
    used: int = 0

    @property
    def left(self) -> int:
        return max(0, self.limit - self.used)


class ConfigFileError(ValueError):
    """A config file that is not read: its message is one line naming the file."""


def expanded_nodes(root: Any, limit: int = MAX_RECIPE_NODES) -> int:
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


class _TooManyNodes(Exception):
    """Raised by the counting loader as its count passes the budget."""


def _counting_loader(text: str, budget: int) -> Any:
    """OmegaConf's YAML loader over ``text``, which raises :class:`_TooManyNodes` as the nodes written in the text
    (an alias is not one: it repeats a node) pass ``budget``; ``loader.composed`` is the count."""
    from omegaconf._utils import get_yaml_loader
    from yaml.events import AliasEvent

    class CountingLoader(get_yaml_loader()):  # type: ignore[misc]
        composed = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            if not self.check_event(AliasEvent):
                self.composed += 1
                if self.composed > budget:
                    raise _TooManyNodes
            return super().compose_node(parent, index)

    return CountingLoader(text)


def _nodes_refused(path: Path, budget: NodeBudget) -> ConfigFileError:
    where = "holds" if budget.used == 0 else "takes the recipe, with the files read before it, to"
    return ConfigFileError(
        f"{shown_path(path)}: {where} more than {budget.limit:,} YAML nodes (keys, values and lists; NeMo RL's "
        f"largest recipe has {LARGEST_NEMO_RL_RECIPE_NODES:,}): refused"
    )


def _compose(loader: Any, path: Path, budget: NodeBudget) -> Any:
    """The file's node graph, its nodes counted into ``budget`` (aliases expanded); refused past it."""
    try:
        node = loader.get_single_node()
    except RecursionError:
        raise ConfigFileError(f"{shown_path(path)}: nested too deep to read") from None
    except _TooManyNodes:
        raise _nodes_refused(path, budget) from None
    if node is None:
        return None
    try:
        built = expanded_nodes(node, budget.left)
    except ValueError as e:  # within the budget as written, past it once the aliases repeat their nodes
        raise ConfigFileError(f"{shown_path(path)}: {first_line(e, with_type=False)}: refused") from None
    budget.used += built
    return node


def load_yaml(path: Path, budget: NodeBudget | None = None) -> Any:
    """``OmegaConf.load(path)``, bounded (see the module docstring): a ``DictConfig`` or a ``ListConfig``.

    ``budget``: the nodes the recipe may still build (:class:`NodeBudget`; a fresh one when not given), less this
    file's. :class:`ConfigFileError` where the file is refused; PyYAML's and OmegaConf's own errors pass, as from
    ``OmegaConf.load``."""
    from omegaconf import OmegaConf

    budget = budget if budget is not None else NodeBudget()
    loader = _counting_loader(_text(path), budget.left)
    try:
        node = _compose(loader, path, budget)
        data = loader.construct_document(node) if node is not None else None
    finally:
        loader.dispose()
    if data is not None and not isinstance(data, list | dict | str):
        raise ConfigFileError(f"{shown_path(path)}: holds a {type(data).__name__}, not a config")
    return OmegaConf.create() if data is None else OmegaConf.create(data)
