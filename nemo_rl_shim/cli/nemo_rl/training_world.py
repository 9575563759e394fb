"""The training world a NeMo RL config asks for: how many ranks the policy (or PPO value model) trains on.

Mirrors the cluster set-up of NVIDIA-NeMo/RL at 7ea279abf, ``nemo_rl/algorithms/grpo.py``
``setup()`` ("Cluster" block) and ``nemo_rl/algorithms/ppo.py`` ``setup()``, which agree on it
(``distillation.py`` ``setup()`` too, without the reward model, and the single-controller
``single_controller_utils/setup.py`` with looser checks; ``sft.py``, ``dpo.py`` and ``rm.py``
take the whole cluster). The training workers fill every bundle of the training
cluster, so the world is that cluster's GPU count:

* **colocated generation** (or no generation section, as in SFT/DPO/RM):
  ``cluster.num_nodes x cluster.gpus_per_node``;
* **non-colocated generation** (``policy.generation.colocated.enabled: false``), with
  ``policy.generation.colocated.resources`` the GPUs it takes:

  - one node: generation shares it, and its ``gpus_per_node`` come off that node
    (``resources.num_nodes`` must be 1 or null, ``resources.gpus_per_node`` set and > 0);
  - several nodes: generation takes whole nodes (``resources.gpus_per_node`` must equal
    ``cluster.gpus_per_node``, ``resources.num_nodes`` > 0), and training keeps the rest;

* a **reward-model environment** (``env_name: reward_model`` in ``data``) takes
  ``env.reward_model.resources``: its nodes on a multi-node cluster, its GPUs on a one-node one.

NeMo RL's assertions for impossible splits are raised here as ``ValueError`` with the same
rule. PPO's value model is built on the same training cluster as the policy
(``ppo.py``: ``cluster=train_cluster``), so ``role="value"`` gives the same world. Not
mirrored: GRPO's non-colocated on-policy-distillation teachers
(``on_policy_distillation.non_colocated_teachers``), which reserve nodes by a rule of
their own; such a config raises ``ValueError`` asking for ``--world``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nemo_rl_shim.config.integers import is_positive_int, positive_int
from nemo_rl_shim.config.numbers import plain_int, shown

__all__ = ["World", "training_world", "training_world_of", "world_from_flag"]


@dataclass(frozen=True)
class World:
    """The number of training ranks and where it came from, in words."""

    size: int
    #: e.g. ``"cluster.num_nodes 2 x cluster.gpus_per_node 8 = 16 (colocated generation)"`` or ``"--world 64"``.
    source: str
    #: Training nodes and GPUs per training node; None when the size came from ``--world``.
    nodes: int | None = None
    gpus_per_node: int | None = None
    #: GPUs taken off the cluster for non-colocated generation (0 when colocated).
    generation_gpus: int = 0
    #: GPUs taken off for a reward-model environment.
    reward_model_gpus: int = 0


def world_from_flag(size: int) -> World:
    """The world ``--world N`` sets."""
    return World(positive_int(size, "--world"), f"--world {size}")


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'s' * (count != 1)}"


def _mapping(config: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    node: Any = config
    for part in key.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node if isinstance(node, Mapping) else {}


def _count(block: Mapping[str, Any], key: str, where: str, *, optional: bool = False) -> int | None:
    value = block.get(key)
    if not optional:
        return positive_int(value, f"{where}.{key}")
    whole = plain_int(value)
    if value is None or (whole is not None and whole >= 0):
        return whole
    raise ValueError(f"{where}.{key} must be a non-negative integer, got {shown(value)}")


def _reward_model(config: Mapping[str, Any]) -> tuple[int, int]:
    """(nodes, GPUs per node) of a reward-model environment the data uses; (0, 0) without one.

    ``nemo_rl.data.datasets.utils.extract_necessary_env_names``: ``env_name`` of ``data.train``,
    ``data.validation`` and ``data.default`` (each one entry or a list).
    """
    data = _mapping(config, "data")
    names = set()
    for key in ("train", "validation", "default"):
        entries = data.get(key)
        for entry in entries if isinstance(entries, list) else [entries]:
            if isinstance(entry, Mapping) and "env_name" in entry:
                names.add(entry["env_name"])
    if "reward_model" not in names:
        return 0, 0
    resources = _mapping(config, "env.reward_model.resources")
    where = "env.reward_model.resources"
    nodes = _count(resources, "num_nodes", where, optional=True) or 0
    return nodes, _count(resources, "gpus_per_node", where, optional=True) or 0


def _non_colocated(
    nodes: int, gpus: int, policy_nodes: int, rm_gpus: int, resources: Mapping[str, Any], rm: str
) -> World:
    where = "policy.generation.colocated.resources"
    gen_gpus, gen_nodes = resources.get("gpus_per_node"), resources.get("num_nodes")
    if policy_nodes == 1:
        if not is_positive_int(gen_gpus):
            raise ValueError(
                f"{where}.gpus_per_node must be set to a positive integer when the policy has one node and "
                f"generation is non-colocated, got {gen_gpus!r}"
            )
        gen_gpus = positive_int(gen_gpus, f"{where}.gpus_per_node")
        if gen_nodes not in (None, 1):
            raise ValueError(
                f"{where}.num_nodes must be 1 or null when the policy has one node and generation is "
                f"non-colocated, got {gen_nodes!r}"
            )
        off_rm = rm_gpus if nodes == 1 else 0
        train = gpus - gen_gpus - off_rm
        if train <= 0:
            raise ValueError(
                f"no GPUs left for training: cluster.gpus_per_node {gpus} - {where}.gpus_per_node {gen_gpus}"
                + (f" - env.reward_model.resources.gpus_per_node {off_rm}" if off_rm else "")
                + f" = {train}"
            )
        source = (
            f"cluster.gpus_per_node {gpus} less {_n(gen_gpus, 'generation GPU')}"
            + (f" and {_n(off_rm, 'reward-model GPU')}" if off_rm else "")
            + f" on 1 node (non-colocated generation) = {train}"
        )
        return World(train, source, 1, train, gen_gpus, off_rm)
    if not is_positive_int(gen_nodes):
        raise ValueError(
            f"{where}.num_nodes must be a positive integer when the policy has several nodes and generation is "
            f"non-colocated, got {gen_nodes!r}"
        )
    gen_nodes = positive_int(gen_nodes, f"{where}.num_nodes")
    if gen_gpus != gpus:
        raise ValueError(
            f"{where}.gpus_per_node must equal cluster.gpus_per_node ({gpus}) when the policy has several nodes "
            f"and generation is non-colocated (it takes whole nodes), got {gen_gpus!r}"
        )
    train_nodes = policy_nodes - gen_nodes
    if train_nodes <= 0:
        raise ValueError(
            f"no nodes left for training: {policy_nodes} policy nodes{rm} - {where}.num_nodes {gen_nodes} = "
            f"{train_nodes}; non-colocated generation needs both"
        )
    source = (
        f"(cluster.num_nodes {nodes}{rm} less {_n(gen_nodes, 'generation node')} = {train_nodes}) x "
        f"cluster.gpus_per_node {gpus} (non-colocated generation) = {train_nodes * gpus}"
    )
    return World(train_nodes * gpus, source, train_nodes, gpus, gen_nodes * gpus, 0)


def training_world(config: Mapping[str, Any], role: str = "policy") -> World:
    """The number of training ranks NeMo RL would start for ``config`` (a resolved config), with NeMo RL's rule.

    ``role`` is ``"policy"`` or ``"value"`` (PPO's value model shares the policy's training
    cluster). Raises ``ValueError`` naming the key when ``cluster`` is missing or the split is
    impossible (the assertions of NeMo RL's ``grpo.setup`` / ``ppo.setup``).
    """
    if role not in ("policy", "value"):
        raise ValueError(f"role must be policy or value, got {role!r}")
    cluster = config.get("cluster")
    if not isinstance(cluster, Mapping):
        raise ValueError(f"the config has no cluster section (a mapping), got {cluster!r}")
    nodes, gpus = _count(cluster, "num_nodes", "cluster"), _count(cluster, "gpus_per_node", "cluster")
    assert nodes is not None and gpus is not None
    if _mapping(config, "on_policy_distillation").get("enabled") and _mapping(
        config, "on_policy_distillation.non_colocated_teachers"
    ).get("enabled"):
        raise ValueError(
            "on_policy_distillation.non_colocated_teachers.enabled: NeMo RL reserves nodes for the teachers by a "
            "rule not mirrored here: give the training world with --world N"
        )
    rm_nodes, rm_gpus = _reward_model(config)
    policy_nodes = nodes if nodes == 1 else nodes - rm_nodes
    if policy_nodes <= 0:
        raise ValueError(
            f"no nodes left for the policy: cluster.num_nodes {nodes} - env.reward_model.resources.num_nodes "
            f"{rm_nodes} = {policy_nodes}"
        )
    rm = f" less {_n(rm_nodes, 'reward-model node')}" if policy_nodes != nodes else ""
    generation = _mapping(config, "policy.generation")
    colocated = _mapping(generation, "colocated")
    if generation and colocated.get("enabled", True) is False:
        return _non_colocated(nodes, gpus, policy_nodes, rm_gpus, _mapping(colocated, "resources"), rm)
    per_node = gpus - rm_gpus if nodes == 1 else gpus
    if per_node <= 0:
        raise ValueError(
            f"no GPUs left for the policy: cluster.gpus_per_node {gpus} - env.reward_model.resources.gpus_per_node "
            f"{rm_gpus} = {per_node}"
        )
    how = "colocated generation" if generation else "no generation section"
    if nodes == 1 and rm_gpus:
        source = f"cluster.gpus_per_node {gpus} less {_n(rm_gpus, 'reward-model GPU')} on 1 node ({how}) = {per_node}"
    elif rm:
        source = f"(cluster.num_nodes {nodes}{rm} = {policy_nodes}) x cluster.gpus_per_node {gpus} ({how})"
        source += f" = {policy_nodes * per_node}"
    else:
        source = f"cluster.num_nodes {nodes} x cluster.gpus_per_node {gpus} = {nodes * gpus} ({how})"
    return World(policy_nodes * per_node, source, policy_nodes, per_node, 0, rm_gpus if nodes == 1 else 0)


def training_world_of(config: Mapping[str, Any] | None, role: str, flag: int | None) -> World | None:
    """``--world`` (``flag``) when given, else NeMo RL's rule on the config's ``cluster`` section, else None."""
    if flag is not None:
        return world_from_flag(flag)
    if config is None or config.get("cluster") is None:
        return None
    return training_world(config, role)
