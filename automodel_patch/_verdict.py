"""What detection says about one workaround on the installed Automodel, and why."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

__all__ = ["Detection", "Verdict"]


class Verdict(enum.StrEnum):
    """Whether the installed Automodel still needs a workaround."""

    #: The installed code misbehaves in the way the workaround fixes: apply it.
    NEEDED = "needed"
    #: The installed code behaves right by itself: the workaround is dead weight there.
    NOT_NEEDED = "not_needed"
    #: The probe could not judge (it raised, or returned something it cannot read).
    UNKNOWN = "unknown"
    #: Nothing to probe or replace: Automodel missing, or the function absent or with
    #: another signature (0.3.0, 0.4.0 have no mesh timeout at all).
    ABSENT = "absent"


@dataclass(frozen=True)
class Detection:
    """One workaround's verdict on the installed Automodel, with a one-line reason."""

    slug: str
    verdict: Verdict
    reason: str

    @property
    def needed(self) -> bool:
        return self.verdict is Verdict.NEEDED

    def to_dict(self) -> dict[str, Any]:
        return {"workaround": self.slug, "verdict": self.verdict.value, "reason": self.reason}
