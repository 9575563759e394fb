"""The knob and its checks: the ``automodel_cfg`` and ``nemo_rl_shim`` blocks, each key validated, the integer check.

Owns :mod:`.settings` (every key of ``automodel_cfg`` and of ``nemo_rl_shim``, its validation, the settings
each block becomes), :mod:`.integers` (the positive-integer check every size, count and flag goes through) and
:mod:`.numbers` (the one read of a number: a config value made a plain ``int`` or ``float`` once, what each kind
takes, ASCII digits for text). Re-exports :mod:`.settings`' names, so that
``from nemo_rl_shim import config as cfg; cfg.distributed_timeout_minutes(...)`` reads as it always did.

May import: the standard library alone. It knows nothing of torch.distributed: every check runs before any
process group exists, so a bad value leaves nothing half-initialized (``tests/test_layers.py`` holds it to that).
"""

from __future__ import annotations

from nemo_rl_shim.config import settings as _settings
from nemo_rl_shim.config.settings import *  # noqa: F403  the names are settings' __all__, written there once

__all__ = _settings.__all__
