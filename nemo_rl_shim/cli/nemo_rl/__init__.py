"""What the command knows of NeMo RL: reading a recipe, the training world it asks for, and which worker runs a role.

* :mod:`.recipe` - a config read as NeMo RL reads it (``defaults:``, ``_override_``, Hydra overrides,
  resolvers), under a budget of nodes, files and depth; the only module of the project that imports OmegaConf and
  Hydra (with :mod:`.config_file`, one file read bounded);
* :mod:`.bounded_read` - :func:`read_config`: a recipe read in a child process (:mod:`._read_child`) under a CPU,
  memory and wall budget, the one bound on the time OmegaConf's resolution takes;
* :mod:`.training_world` - how many ranks the policy (or PPO value model) trains on, with NeMo RL's rule;
* :mod:`.worker` - whether NeMo RL runs a role on the Automodel path at all.
"""

from __future__ import annotations

from nemo_rl_shim.cli.nemo_rl.bounded_read import RecipeTimedOut, read_config
from nemo_rl_shim.cli.nemo_rl.recipe import RecipeError, load_recipe
from nemo_rl_shim.cli.nemo_rl.training_world import World, training_world, training_world_of
from nemo_rl_shim.cli.nemo_rl.worker import worker_note

__all__ = [
    "RecipeError",
    "RecipeTimedOut",
    "World",
    "load_recipe",
    "read_config",
    "training_world",
    "training_world_of",
    "worker_note",
]
