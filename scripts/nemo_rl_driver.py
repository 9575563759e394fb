"""NeMo RL's driver-side config checks, run as its ``run_*.py`` run them; started by ``scripts/nemo_rl_check.py``.

Runs in NeMo RL's environment (its source on ``sys.path``, this project not installed) and prints
one JSON object. Every ``run_*.py`` builds its pydantic ``MasterConfig`` from the YAML before Ray
starts a worker; ``Policy`` then picks the worker. This script does both, without Ray:

* ``master_config``: an example config of each section that has the key (GRPO's ``policy``,
  distillation's ``teacher``, PPO's ``value``), loaded as NeMo RL loads it, with
  ``<section>.automodel_cfg.distributed_timeout_minutes`` set to each value in turn (and once a
  misspelled key, ``distributed_timeout_minute``), then ``MasterConfig(**config)``. The outcome is
  ``accepted`` with the value as validated, or ``refused`` with pydantic's location and message.
* ``policy``: ``Policy(...)`` with a mock cluster, and ``RayWorkerGroup`` and ``RayQueue`` replaced,
  so neither Ray nor a worker starts, under the ``name_prefix`` each caller gives it: the reward
  model section (``env.reward_model``, which ``MasterConfig`` does not type) with the key at true,
  and the v1 DTensor worker, Megatron and a Megatron teacher at 45.
* ``shim_keys``: where this project's own keys may sit. For each section, ``MasterConfig(**config)`` with
  ``<section>.nemo_rl_shim`` holding every one of them beside ``automodel_cfg: {distributed_timeout_minutes: 45}``
  (``kept``: the block the validated section still carries, which is what ``Policy`` hands its worker), and with one
  of them in its old place inside ``automodel_cfg``; then, for GRPO's policy on the DTensor v2 worker, ``Policy(...)``
  built from the validated section, reporting the ``nemo_rl_shim`` block in the config its ``RayWorkerBuilder`` gets.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any
from unittest.mock import MagicMock, patch

__all__ = ["main"]

#: (label, example config, ``nemo_rl.algorithms`` module, section)
SECTIONS = (
    ("grpo policy", "grpo_math_1B.yaml", "grpo", "policy"),
    ("distillation teacher", "distillation_math.yaml", "distillation", "teacher"),
    ("ppo value", "ppo_math_1B.yaml", "ppo", "value"),
)
#: What ${oc.env:...} gives is a string: "45" among them.
VALUES = (True, "forty-five", 0.5, math.nan, math.inf, 0, -5, 1e308, 10081, 45, "45", None)
#: The label of the misspelled-key case in ``master_config``.
MISSPELLED = "distributed_timeout_minute: 45"
#: Every key of this project's ``nemo_rl_shim`` block (``nemo_rl_shim.config.SHIM_CFG_KEYS``, written out here: this
#: script runs where the project is not installed), each at a value its own checks accept.
SHIM_BLOCK = {
    "distributed_timeout_minutes_after_init": 10,
    "patch_automodel": True,
    "flight_recorder": {"enabled": True, "dump_dir": "/tmp/nemo-rl-shim-fr", "buffer_size": 2000},
    "learned_timeouts": None,
}
#: The labels of the ``shim_keys`` cases.
SHIM_BESIDE = "nemo_rl_shim beside automodel_cfg"
SHIM_OLD_PLACE = "patch_automodel inside automodel_cfg"
SHIM_TO_WORKER = "grpo policy, DTensor v2 worker"


def _outcome(call: Any) -> str:
    try:
        result = call()
    except Exception as e:  # the driver's refusal, reported as the user would read it
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        text = " | ".join(lines[1:3] if type(e).__name__ == "ValidationError" else lines[:3])
        return f"refused: {type(e).__name__}: {text[:300]}"
    return f"accepted: {result!r}"


def _master_config(configs: Path) -> dict[str, dict[str, str]]:
    import importlib

    from nemo_rl.utils.config import load_config_with_inheritance, register_omegaconf_resolvers
    from omegaconf import OmegaConf

    register_omegaconf_resolvers()
    results: dict[str, dict[str, str]] = {}
    for label, name, module, section in SECTIONS:
        master_config = importlib.import_module(f"nemo_rl.algorithms.{module}").MasterConfig
        base = OmegaConf.to_container(load_config_with_inheritance(str(configs / name)), resolve=True)
        results[label] = {}
        cases = {repr(v): {"distributed_timeout_minutes": v} for v in VALUES}
        cases[MISSPELLED] = {"distributed_timeout_minute": 45}
        for case, automodel_cfg in cases.items():
            config = copy.deepcopy(base)
            config[section]["automodel_cfg"] = automodel_cfg

            def validate(config: dict[str, Any] = config, section: str = section, master: Any = master_config) -> Any:
                automodel_cfg = getattr(master(**config), section).get("automodel_cfg", {})
                if isinstance(automodel_cfg, dict):  # unpatched: an untyped extra key
                    return automodel_cfg.get("distributed_timeout_minutes", "<dropped>")
                return automodel_cfg.distributed_timeout_minutes

            results[label][case] = _outcome(validate)
    return results


def _with_shim_block(base: dict[str, Any], section: str) -> dict[str, Any]:
    config = copy.deepcopy(base)
    config[section]["automodel_cfg"] = {"distributed_timeout_minutes": 45}
    config[section]["nemo_rl_shim"] = copy.deepcopy(SHIM_BLOCK)
    return config


def _shim_keys(configs: Path) -> dict[str, dict[str, str]]:
    import importlib

    from nemo_rl.utils.config import load_config_with_inheritance, register_omegaconf_resolvers
    from omegaconf import OmegaConf

    register_omegaconf_resolvers()
    results: dict[str, dict[str, str]] = {}
    for label, name, module, section in SECTIONS:
        master_config = importlib.import_module(f"nemo_rl.algorithms.{module}").MasterConfig
        base = OmegaConf.to_container(load_config_with_inheritance(str(configs / name)), resolve=True)
        beside = _with_shim_block(base, section)
        old_place = copy.deepcopy(base)
        old_place[section]["automodel_cfg"] = {"distributed_timeout_minutes": 45, "patch_automodel": True}

        def kept(config: dict[str, Any], section: str = section, master: Any = master_config) -> Any:
            return getattr(master(**config), section).get("nemo_rl_shim", "<dropped>")

        results[label] = {
            SHIM_BESIDE: _outcome(lambda config=beside: kept(config)),
            SHIM_OLD_PLACE: _outcome(lambda config=old_place: kept(config)),
        }
    return results


def _to_worker(configs: Path, model_dir: Path, cluster: Any) -> str:
    """The ``nemo_rl_shim`` block in the config ``Policy`` hands its DTensor v2 worker, from a validated section."""
    from nemo_rl.algorithms.grpo import MasterConfig
    from nemo_rl.models.policy.lm_policy import Policy
    from nemo_rl.utils.config import load_config_with_inheritance
    from omegaconf import OmegaConf

    base = OmegaConf.to_container(load_config_with_inheritance(str(configs / "grpo_math_1B.yaml")), resolve=True)
    config = _with_shim_block(base, "policy")
    config["policy"]["model_name"] = str(model_dir)

    def build() -> Any:
        policy_cfg = MasterConfig(**config).policy
        with (
            patch("nemo_rl.models.policy.lm_policy.RayWorkerGroup"),
            patch("nemo_rl.models.policy.lm_policy.RayQueue"),
            patch("nemo_rl.models.policy.lm_policy.RayWorkerBuilder") as builder,
        ):
            Policy(cluster=cluster, config=policy_cfg, tokenizer=MagicMock(), name_prefix="lm_policy")
        fqn, worker_config = builder.call_args.args[:2]
        return {"worker": fqn.rsplit(".", 1)[-1], "nemo_rl_shim": worker_config.get("nemo_rl_shim", "<dropped>")}

    return _outcome(build)


def _policy(configs: Path) -> dict[str, str]:
    from nemo_rl.models.policy.lm_policy import Policy
    from nemo_rl.utils.config import load_config_with_inheritance, register_omegaconf_resolvers
    from omegaconf import OmegaConf
    from transformers import LlamaConfig

    register_omegaconf_resolvers()
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")  # Policy requires it for Megatron
    model_dir = Path(tempfile.mkdtemp(prefix="nrl-driver-"))
    LlamaConfig(num_hidden_layers=1, hidden_size=64).save_pretrained(model_dir)  # no download
    grpo = OmegaConf.to_container(load_config_with_inheritance(str(configs / "grpo_math_1B.yaml")), resolve=True)
    reward = OmegaConf.to_container(load_config_with_inheritance(str(configs / "grpo_rm_1B.yaml")), resolve=True)
    policy = {**grpo["policy"], "model_name": str(model_dir), "automodel_cfg": {"distributed_timeout_minutes": 45}}
    v1 = copy.deepcopy(policy)
    v1["dtensor_cfg"]["_v2"] = False
    megatron = copy.deepcopy(policy)
    megatron["dtensor_cfg"] = {"enabled": False}
    megatron["megatron_cfg"] = {
        "enabled": True,
        "tensor_model_parallel_size": 1,
        "pipeline_model_parallel_size": 1,
        "context_parallel_size": 1,
    }
    reward_model = {**reward["env"]["reward_model"], "model_name": str(model_dir)}
    reward_model["automodel_cfg"] = {"distributed_timeout_minutes": True}
    reward_model.setdefault("generation", None)
    #: label -> (config, the name_prefix its caller gives Policy)
    cases = {
        "v1 DTensor worker, 45": (v1, "lm_policy"),
        "Megatron, 45": (megatron, "lm_policy"),
        "Megatron teacher, 45": (megatron, "teacher"),
        "env.reward_model, true": (reward_model, "reward_model_policy"),
    }
    cluster = MagicMock()
    cluster.world_size.return_value = 1
    cluster._sorted_bundle_indices = None
    results = {}
    with (
        patch("nemo_rl.models.policy.lm_policy.RayWorkerGroup"),
        patch("nemo_rl.models.policy.lm_policy.RayQueue"),
    ):
        for label, (config, prefix) in cases.items():
            results[label] = _outcome(
                lambda config=config, prefix=prefix: (
                    type(Policy(cluster=cluster, config=config, tokenizer=MagicMock(), name_prefix=prefix)).__name__
                )
            )
    results[SHIM_TO_WORKER] = _to_worker(configs, model_dir, cluster)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=Path, required=True, help="the tree's examples/configs")
    parser.add_argument("--out", type=Path, required=True, help="the JSON report (NeMo RL prints to stdout)")
    args = parser.parse_args()
    report = {
        "master_config": _master_config(args.configs),
        "policy": _policy(args.configs),
        "shim_keys": _shim_keys(args.configs),
    }
    args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
