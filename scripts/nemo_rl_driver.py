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
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=Path, required=True, help="the tree's examples/configs")
    parser.add_argument("--out", type=Path, required=True, help="the JSON report (NeMo RL prints to stdout)")
    args = parser.parse_args()
    report = {"master_config": _master_config(args.configs), "policy": _policy(args.configs)}
    args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
