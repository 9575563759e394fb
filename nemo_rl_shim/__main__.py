"""``python -m nemo_rl_shim``: the ``nemo-rl-shim`` command."""

from __future__ import annotations

import sys

from nemo_rl_shim.cli import main

if __name__ == "__main__":
    sys.exit(main())
