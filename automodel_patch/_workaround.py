"""One workaround of Automodel as a unit: slug, detection, the layer it adds, and how to remove it.

Each workaround module (``keep_cpu_backend``, ``cpu_mesh_timeout``) builds one
:class:`Workaround`. :mod:`automodel_patch._apply` stacks the layers of the active ones
over Automodel's genuine functions, so either can be applied, reverted or deleted from
the code base on its own day.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from automodel_patch._verdict import Detection, Verdict

__all__ = ["SHIM_USERS", "Functions", "Layer", "Probe", "Workaround"]

#: The files of ``nemo_rl_shim`` that import ``automodel_patch``
#: (``tests/automodel_patch/test_workaround_tags.py`` checks this against the sources): where the package is used
#: once the last workaround has gone.
SHIM_USERS = (
    "nemo_rl_shim/setup/decision.py",
    "nemo_rl_shim/setup/distributed.py",
    "nemo_rl_shim/setup/support.py",
    "nemo_rl_shim/cli/status.py",
    "nemo_rl_shim/cli/preflight/fake_backend.py",
    "nemo_rl_shim/cli/preflight/_fork_server.py",
)

#: The genuine ``mesh_utils`` attributes a probe judges, by name (absent ones missing).
Functions = Mapping[str, Any]
#: ``(mesh_utils, current attributes) -> replacements``: a layer over what is installed below it.
Layer = Callable[[ModuleType, Mapping[str, Any]], dict[str, Callable[..., Any]]]
Probe = Callable[[Functions], Detection]


@dataclass(frozen=True, eq=False)  # identity: a workaround is one object, hashed for the probe cache
class Workaround:
    """A temporary fix of Automodel, with everything needed to apply it and, one day, delete it."""

    slug: str
    #: One line: what goes wrong without it.
    symptom: str
    #: What the run loses without it where it matters and is needed (a decision's reason).
    problem: str
    #: What "fixed" means, said of the installed Automodel ("... natively" when its own code does it).
    fixed: str
    #: What a run gets where it is needed and not applied (``patch_automodel`` false, or it cannot apply).
    without_it: str
    #: Whether the timeout still goes to ``MeshContext.build`` in that case. False where forwarding
    #: would break the run (a sub-group without the CPU half under CPU offload): then only the default
    #: group gets the timeout.
    forward_without_it: bool
    #: A behaviour of the installed Automodel, checked by :attr:`probe`, that makes it dead code.
    removal_condition: str
    #: The test that fails on the day the removal condition holds.
    tripwire: str
    #: Every file carrying ``AUTOMODEL-WORKAROUND(<slug>)`` (repository-relative), with what to do there.
    places: Mapping[str, str]
    #: Default-group backends under which it matters (``backend_for`` values).
    default_backends: frozenset[str]
    #: The ``mesh_utils`` names the probe reads and the layer may replace.
    names: tuple[str, ...]
    probe: Probe
    layer: Layer

    @property
    def tag(self) -> str:
        return f"AUTOMODEL-WORKAROUND({self.slug})"

    def detect(self, functions: Functions) -> Detection:
        """The probe's verdict on ``functions``; never raises (a probe failure is UNKNOWN)."""
        key = tuple((name, functions.get(name)) for name in self.names)
        return _cached_detect(self, key)

    def removal_steps(self, version: object) -> str:
        """What to delete once the pin (``version``) meets the removal condition: every tagged place."""
        lines = [
            f"nemo-automodel {version} now satisfies the removal condition of the {self.slug} workaround: "
            f"{self.removal_condition}.",
            f'Delete the {self.tag} code; `grep -rn "{self.tag}" .` lists exactly these places:',
        ]
        lines += [f"  {i}. {path}: {what}" for i, (path, what) in enumerate(sorted(self.places.items()), 1)]
        lines.append(
            "If no other workaround remains in automodel_patch.WORKAROUNDS after that, the whole automodel_patch "
            "package can go with it; it is used in " + ", ".join(SHIM_USERS) + " (`grep -rln automodel_patch "
            "nemo_rl_shim` lists them), which still need its feature detection (build_accepts_timeout, "
            "installed_version) from a new home."
        )
        return "\n".join(lines)


@functools.cache
def _cached_detect(workaround: Workaround, key: tuple[tuple[str, Any], ...]) -> Detection:
    # Keyed on the function objects: a new release (or a reload) re-probes; repeated calls cost a lookup.
    try:
        return workaround.probe(dict(key))
    except Exception as e:  # a probe must never crash its caller: it cannot judge, and says why
        return Detection(workaround.slug, Verdict.UNKNOWN, f"the probe failed: {type(e).__name__}: {e}")
