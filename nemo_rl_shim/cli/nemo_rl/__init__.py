"""What the command knows of NeMo RL: reading a recipe, the training world it asks for, and which worker runs a role.

* :mod:`.recipe` - a config read as NeMo RL reads it (``defaults:``, ``_override_``, Hydra overrides,
  resolvers); the only module of the project that imports OmegaConf and Hydra;
* :mod:`.training_world` - how many ranks the policy (or PPO value model) trains on, with NeMo RL's rule;
* :mod:`.worker` - whether NeMo RL runs a role on the Automodel path at all.
"""

from __future__ import annotations

from nemo_rl_shim.cli.nemo_rl.recipe import RecipeError, load_recipe, read_config
from nemo_rl_shim.cli.nemo_rl.training_world import World, training_world, training_world_of
from nemo_rl_shim.cli.nemo_rl.worker import worker_note

__all__ = ["RecipeError", "World", "load_recipe", "read_config", "training_world", "training_world_of", "worker_note"]
