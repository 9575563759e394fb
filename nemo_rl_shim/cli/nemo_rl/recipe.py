"""Read a NeMo RL config as NeMo RL reads it: ``defaults:`` chains, ``_override_``, Hydra overrides, resolvers.

The same libraries and the same rules as ``nemo_rl.utils.config`` (NVIDIA-NeMo/RL at 7ea279abf:
``load_config_with_inheritance``, ``merge_with_override``, ``parse_hydra_overrides``,
``register_omegaconf_resolvers``) and as ``examples/run_grpo.py`` calls them: load the file
with its parents, apply the command-line overrides, then ``OmegaConf.to_container(config,
resolve=True)``. Our own code, not a copy; what differs is only what happens on bad input:

* ``defaults:`` is one file name or a list of them, each relative to the file that names it
  (absolute paths are kept). Parents are loaded depth-first and merged in order, so a later
  parent wins over an earlier one and the file itself wins over all of them.
* ``_override_: true`` on a *top-level* mapping of a file replaces that section instead of
  merging into it. As in NeMo RL, the marker is looked for at the top level only: a nested
  one is merged like any other key (and stays in the result).
* Mandatory values (``???``) are left for a child or an override to fill; unfilled, they stay
  ``"???"`` in the result, as NeMo RL's ``to_container`` leaves them.
* Overrides use hydra-core's own grammar (``OverridesParser``): ``key=value`` changes a key
  that exists (a missing one is refused, as NeMo RL refuses it, since it sets the config to
  struct mode first), ``+key=value`` adds a key that is absent, ``++key=value`` adds or
  changes, ``~key`` (or ``~key=value``) deletes.
* Resolvers ``add``, ``mul``, ``div``, ``max`` are registered when absent, like NeMo RL's
  ``register_omegaconf_resolvers``: a resolver of the same name that is already registered
  is kept, not replaced.

Each file is read bounded (:mod:`.config_file`: a regular file under a size cap, UTF-8, its YAML nodes counted:
a FIFO, a device or an alias bomb is refused in milliseconds), and the recipe as a whole has a budget, each rule
refused with its own words: at most :data:`~.config_file.MAX_RECIPE_NODES` YAML nodes over every file it reads
(:class:`~.config_file.NodeBudget`: the keys rule, and the aliases rule), a ``defaults:`` chain at most
:data:`MAX_DEFAULTS_DEPTH` files deep (NeMo RL would recurse until Python's limit: a 2,000-file chain gave a
``RecursionError``) and at most :data:`MAX_RECIPE_FILES` file reads (a file that names one parent twice, whose
parent does too, doubles them at every level). The time its interpolations take is not bounded here: OmegaConf
resolves ``${a}`` again at each use, so a key that adds the one before to itself, level after level, doubles the
work per level; :mod:`.bounded_read` reads a recipe in a child process under a CPU, memory and wall budget, and is
what the command and :func:`read_config` use.

Errors are :class:`RecipeError` (a ``ValueError``), one line naming the file chain or the override: a missing
parent (``a.yaml -> b.yaml -> missing.yaml: no such file``), a cycle in ``defaults``, a budget passed (the rule
named), a bad override (quoted), or an interpolation that cannot be resolved (its key named, in a parent too).

OmegaConf and Hydra are imported here only, when a config is read: ``import nemo_rl_shim``
loads neither.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nemo_rl_shim.cli.nemo_rl.config_file import ConfigFileError, NodeBudget, load_yaml
from nemo_rl_shim.one_line.exception import first_line

if TYPE_CHECKING:
    from hydra.core.override_parser.types import Override
    from omegaconf import DictConfig

__all__ = [
    "MAX_DEFAULTS_DEPTH",
    "MAX_RECIPE_FILES",
    "RESOLVERS",
    "RecipeError",
    "RecipeReading",
    "apply_overrides",
    "load_recipe",
    "load_recipe_config",
    "register_resolvers",
    "resolve",
]

#: The deepest ``defaults:`` chain read, in files (NeMo RL's deepest at 7ea279abf: 6).
MAX_DEFAULTS_DEPTH = 32
#: The most file reads one recipe makes, a parent named twice read twice (NeMo RL's most at 7ea279abf: 6).
MAX_RECIPE_FILES = 64

#: NeMo RL's resolvers (``nemo_rl.utils.config.register_omegaconf_resolvers``), by name.
RESOLVERS: dict[str, Callable[[Any, Any], Any]] = {
    "add": lambda a, b: a + b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "max": lambda a, b: max(a, b),
}


class RecipeError(ValueError):
    """A NeMo RL config that cannot be read as NeMo RL would read it; the message is one line."""


@dataclass
class RecipeReading:
    """What one recipe's reading has spent of its budget: YAML nodes, file reads, bytes read."""

    nodes: NodeBudget = field(default_factory=NodeBudget)
    files: int = 0
    bytes: int = 0
    #: What the loading is doing, in words (``"merging b.yaml into a.yaml"``): where a budget ran out.
    step: str = ""


def register_resolvers() -> None:
    """Register NeMo RL's ``add``, ``mul``, ``div`` and ``max`` resolvers, keeping any already registered."""
    from omegaconf import OmegaConf

    for name, resolver in RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)


# --- loading with inheritance ----------------------------------------------------------------


def _chain_text(chain: Sequence[Path]) -> str:
    if len(chain) > 8:  # a deep chain: its ends, and how many files
        return f"{' -> '.join(str(p) for p in chain[:3])} -> ... -> {chain[-1]} ({len(chain)} files)"
    return " -> ".join(str(path) for path in chain)


def _read_file(path: Path, chain: tuple[Path, ...], reading: RecipeReading) -> DictConfig:
    """One file of the chain, as ``OmegaConf.load`` reads it but bounded (:mod:`.config_file`: a regular file under a
    size cap, decoded naming the file, its nodes counted into the recipe's budget)."""
    from omegaconf import DictConfig
    from omegaconf.errors import OmegaConfBaseException
    from yaml import YAMLError

    if not path.exists() and not path.is_symlink():
        raise RecipeError(f"{_chain_text(chain)}: no such file")
    reading.files += 1
    if reading.files > MAX_RECIPE_FILES:
        raise RecipeError(
            f"{_chain_text(chain)}: the recipe reads more than {MAX_RECIPE_FILES} files through its defaults "
            "(a parent named twice is read twice; NeMo RL's recipes read at most 6): refused"
        )
    try:
        config = load_yaml(path, reading.nodes)
        reading.bytes += path.stat().st_size
    except ConfigFileError as e:
        where = f"{_chain_text(chain[:-1])} -> " if len(chain) > 1 else ""
        raise RecipeError(f"{where}{e}") from None
    except (YAMLError, OmegaConfBaseException) as e:
        raise RecipeError(f"{_chain_text(chain)}: not a valid YAML config: {first_line(e, with_type=False)}") from e
    if not isinstance(config, DictConfig):
        raise RecipeError(f"{_chain_text(chain)}: must hold a mapping at the top level, got a {type(config).__name__}")
    return config


def _parents(config: DictConfig, chain: tuple[Path, ...]) -> list[str]:
    """The file's ``defaults:`` entries (and removes the key), as NeMo RL reads them."""
    from omegaconf import ListConfig

    defaults = config.pop("defaults")
    if isinstance(defaults, str):
        return [defaults]
    if isinstance(defaults, ListConfig):
        return [str(entry) for entry in defaults]
    raise RecipeError(f"{_chain_text(chain)}: defaults must be a file name or a list of file names, got {defaults!r}")


def _merge(base: DictConfig, child: DictConfig) -> DictConfig:
    """``child`` over ``base``; a top-level section of ``child`` marked ``_override_: true`` replaces base's."""
    from omegaconf import DictConfig, OmegaConf

    for key in list(child.keys()):
        if OmegaConf.is_missing(child, key):  # "???" stays for a later file or an override to fill
            continue
        section = child[key]
        if isinstance(section, DictConfig) and section.get("_override_", False):
            section.pop("_override_")
            if key in base:
                base.pop(key)
    merged = OmegaConf.merge(base, child)
    assert isinstance(merged, DictConfig)
    return merged


def _merged(base: DictConfig, child: DictConfig, chain: tuple[Path, ...]) -> DictConfig:
    """:func:`_merge`, where an interpolation NeMo RL's merge resolves (a top-level key's) fails naming the chain."""
    from omegaconf.errors import OmegaConfBaseException

    try:
        return _merge(base, child)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        raise RecipeError(f"{_chain_text(chain)}: cannot resolve {key}: {first_line(e, with_type=False)}") from None


def _load_tree(path: Path, chain: tuple[Path, ...], reading: RecipeReading) -> DictConfig:
    """``path`` with its parents merged in, depth-first; ``chain`` is the files that led here, ``path`` last."""
    from omegaconf import OmegaConf

    seen = [p.resolve() for p in chain[:-1]]
    if path.resolve() in seen:
        start = seen.index(path.resolve())
        raise RecipeError(f"cycle in defaults: {_chain_text(chain[start:])}")
    if len(chain) > MAX_DEFAULTS_DEPTH:
        raise RecipeError(
            f"{_chain_text(chain)}: a defaults chain deeper than {MAX_DEFAULTS_DEPTH} files (NeMo RL's deepest is 6): "
            "refused"
        )
    reading.step = f"reading {path}"
    config = _read_file(path, chain, reading)
    if "defaults" not in config:
        return config
    base = OmegaConf.create({})
    for name in _parents(config, chain):
        parent = Path(name) if name.startswith("/") else path.parent / name
        parent_chain = (*chain, parent)
        tree = _load_tree(parent, parent_chain, reading)
        reading.step = f"merging {parent}"
        base = _merged(base, tree, parent_chain)
    reading.step = f"merging {path} over its defaults"
    return _merged(base, config, chain)


# --- overrides -------------------------------------------------------------------------------


def _apply_one(config: DictConfig, override: Override) -> None:
    """One parsed override, with the rules of Hydra's ``ConfigLoaderImpl._apply_overrides_to_config``."""
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    line = override.input_line
    key = override.key_or_group
    if override.package is not None:
        raise RecipeError(f"override {line!r}: '@package' selects a config group, and a NeMo RL config has none")
    if override.is_sweep_override():
        raise RecipeError(f"override {line!r}: a sweep gives several values, a run takes one")
    value = override.value()
    if override.is_delete():
        current = OmegaConf.select(config, key, throw_on_missing=False)
        if current is None:
            raise RecipeError(f"override {line!r}: cannot delete {key}: it is not in the config (or is null)")
        if value is not None and value != current:
            raise RecipeError(f"override {line!r}: cannot delete {key}: its value is {current!r}, not {value!r}")
        parent_key, _, leaf = key.rpartition(".")
        with open_dict(config):
            parent = OmegaConf.select(config, parent_key) if parent_key else config
            del parent[leaf]
    elif override.is_add():
        current = OmegaConf.select(config, key, throw_on_missing=False)
        if current is not None and not isinstance(value, (dict, list)):
            raise RecipeError(
                f"override {line!r}: {key} is already set ({current!r}): drop the '+' to change it, "
                f"or use '+{line}' to add or change it"
            )
        OmegaConf.update(config, key, value, merge=True, force_add=True)
    elif override.is_force_add():
        OmegaConf.update(config, key, value, merge=True, force_add=True)
    else:
        try:
            OmegaConf.update(config, key, value, merge=True)
        except (ConfigAttributeError, ConfigKeyError) as e:
            raise RecipeError(
                f"override {line!r}: {key} is not in the config, and NeMo RL refuses to set a missing key: "
                f"add it with '+{line}'"
            ) from e


def apply_overrides(config: DictConfig, overrides: Sequence[str]) -> DictConfig:
    """Apply Hydra command-line overrides to ``config`` in place (struct mode on, as NeMo RL sets it)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    OmegaConf.set_struct(config, True)
    parser = OverridesParser.create()
    for line in overrides:
        try:
            parsed = parser.parse_override(line)
        except HydraException as e:
            raise RecipeError(f"override {line!r}: not a Hydra override (key=value, +key=value, ++key=value, ~key): "
                              f"{first_line(e, with_type=False)}") from e  # fmt: skip
        try:
            _apply_one(config, parsed)
        except OmegaConfBaseException as e:
            raise RecipeError(f"override {line!r}: {first_line(e, with_type=False)}") from e
    return config


# --- the whole read --------------------------------------------------------------------------


def load_recipe_config(
    path: str | Path, overrides: Sequence[str] = (), reading: RecipeReading | None = None
) -> DictConfig:
    """The unresolved OmegaConf config: ``path`` with its ``defaults`` chain, then ``overrides``; ``reading`` (a fresh
    :class:`RecipeReading` when not given) counts what the files spent of the recipe's budget.

    NeMo RL's resolvers are registered first, as ``examples/run_*.py`` do: a merge resolves the top-level values of
    the file merged in (``merge_with_override`` reads ``override_config[key]``), so they are needed while loading."""
    register_resolvers()
    path = Path(path)
    reading = reading if reading is not None else RecipeReading()
    config = _load_tree(path, (path,), reading)
    if overrides:
        reading.step = "applying the overrides"
        apply_overrides(config, list(overrides))
    return config


def resolve(config: DictConfig, path: str | Path) -> dict[str, Any]:
    """``OmegaConf.to_container(config, resolve=True)`` with NeMo RL's resolvers; a failure names ``path`` and the key.

    Unbounded in time (see the module docstring): for a recipe that is not trusted, :mod:`.bounded_read`."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    register_resolvers()
    try:
        resolved = OmegaConf.to_container(config, resolve=True)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        raise RecipeError(f"{path}: cannot resolve {key}: {first_line(e, with_type=False)}") from e
    assert isinstance(resolved, dict)
    return {str(k): v for k, v in resolved.items()}


def load_recipe(path: str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The config NeMo RL's ``examples/run_*.py`` would train with, as a plain dict with every interpolation resolved,
    in this process (the time its interpolations take is not bounded: :mod:`.bounded_read` bounds it).

    Raises :class:`RecipeError` (one line naming the file chain, the override or the key) on bad input.
    """
    register_resolvers()
    return resolve(load_recipe_config(path, overrides), path)
