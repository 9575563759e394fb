"""The ``nemo-rl-shim`` command line: ``status``, ``preflight`` and ``hang-report``, with their launchers and reports.

The library a training worker imports (:mod:`nemo_rl_shim`) never imports this package;
this package imports the library. :func:`main` is the console script.
"""

from __future__ import annotations

from nemo_rl_shim.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
