"""The first line of an exception, as every one-line report gives it: ``"ImportError: cannot import ..."``."""

from __future__ import annotations

__all__ = ["first_line"]


def first_line(error: BaseException, *, with_type: bool = True) -> str:
    """``"TypeName: first line of the message"``; the type alone when the message is empty.

    ``with_type=False`` gives the message's first line alone (the type where there is no message).
    """
    lines = str(error).strip().splitlines()
    text = lines[0].strip() if lines else ""
    name = type(error).__name__
    if not with_type:
        return text or name
    return f"{name}: {text}" if text else name
