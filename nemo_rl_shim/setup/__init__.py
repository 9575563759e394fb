"""Set-up: the default process group, the decision, which torch x nemo-automodel pairs run, ``setup_distributed``.

Owns:

* :mod:`.default_group`: the default group's backend and timeout (``backend_for``, ``init_process_group``);
* :mod:`.decision`: what happens to the timeout on this Automodel, and why (``decide``, ``Decision``);
* :mod:`.support`: which pairs run together (``check``, ``require_supported``, ``UnsupportedVersions``);
* :mod:`.distributed`: ``setup_distributed`` and its result, NeMo RL's ``DistributedContext``.

May import: torch, ``automodel_patch`` (and through it nemo-automodel, on first use), and the rooms below:
:mod:`nemo_rl_shim.config`, :mod:`nemo_rl_shim.one_line`, :mod:`nemo_rl_shim.process_groups`,
:mod:`nemo_rl_shim.flight_recorder`, and (though nothing here needs them) :mod:`nemo_rl_shim.timeouts` and
:mod:`nemo_rl_shim.audit`, which take its result as an argument and never import it. The package's own names
(``from nemo_rl_shim import setup_distributed``) come from here; this ``__init__`` re-exports nothing.
"""
