"""Timeouts that follow the run: the phases (start-up, steady, a slow phase) and the timeouts learned from it.

Owns:

* :mod:`.phases`: every group's timeout through the run's phases (``after_first_step``, ``extended_timeout``,
  ``set_timeouts``), behind a barrier where lowering could cut a slow peer short;
* :mod:`.learned_rule`: the learned timeouts' rule and state, plain arithmetic (no torch);
* :mod:`.learned_run`: the learned timeouts in a run (``Learner``: times steps and phases, agrees across ranks,
  sets through :func:`.phases.set_timeouts`); ``learned_timeouts(ctx)`` makes one.

May import: torch, and the rooms below: :mod:`nemo_rl_shim.config`, :mod:`nemo_rl_shim.process_groups`,
:mod:`nemo_rl_shim.flight_recorder` (a dump when the barrier times out). It takes ``setup_distributed``'s result
as an argument and imports nothing of :mod:`nemo_rl_shim.setup`.

Exports what ``nemo_rl_shim.timeouts`` always offered, lazily (PEP 562): ``TIMEOUT_API``, ``set_group_timeout``
and ``restore_torch_defaults`` come from :mod:`nemo_rl_shim.process_groups`, which owns them. So
``nemo_rl_shim.timeouts.learned_rule`` imports no torch.
"""

from __future__ import annotations

from nemo_rl_shim._lazy import lazy_exports

TYPE_CHECKING = False  # typing's own constant, without importing typing (~10 ms at every start)

if TYPE_CHECKING:
    from nemo_rl_shim.process_groups.later import restore_torch_defaults
    from nemo_rl_shim.process_groups.setting import TIMEOUT_API, set_group_timeout
    from nemo_rl_shim.timeouts.learned_run import Learner
    from nemo_rl_shim.timeouts.phases import (
        after_first_step,
        current_timeouts,
        extended_timeout,
        learned_timeouts,
        run_groups,
        set_timeouts,
    )

__all__ = [
    "TIMEOUT_API",
    "Learner",
    "after_first_step",
    "current_timeouts",
    "extended_timeout",
    "learned_timeouts",
    "restore_torch_defaults",
    "run_groups",
    "set_group_timeout",
    "set_timeouts",
]

__getattr__, __dir__ = lazy_exports(
    __name__, __all__, ("..process_groups.setting", "..process_groups.later", ".learned_run", ".phases")
)
