"""Text from outside the agent (a tool's output, a journal field, a state file) made safe to
count with, to keep and to print (pure; no imports: ``gpuagent status`` imports this).

Python's ``str.isdigit`` and ``int`` take more than ASCII digits (``²`` is a digit to
``isdigit`` and no number to ``int``), and ``int`` refuses more than 4,300 of them: a
number is read here from ASCII digits only, and only up to a length.  A value that goes into
a message or a file is cut to a length, so no tool's answer makes a message (or a file the
agent reads back) of any size.  Text for a terminal has each character that is not
printable replaced by ``?`` (as ``gpuagent status`` has always shown them), so no journal
field or tool's answer can move the cursor, erase a line or hide what follows.
"""

from __future__ import annotations

__all__ = ["DIGITS", "MESSAGE_MAX", "VALUE_MAX", "capped", "printable", "whole"]

# A regular-expression class of one ASCII digit: ``\d`` matches every script's digits.
DIGITS = "[0-9]"
# Longest value of untrusted text put into a message (an IMEX node's address, a licence
# status): far more than any real one.
VALUE_MAX = 200
# Longest message a finding carries: a few values and NVIDIA's words around them.
MESSAGE_MAX = 2000
_ASCII_DIGITS = frozenset("0123456789")
_MORE = "…"


def whole(text: str, digits: int = 18) -> int | None:
    """``text`` as a whole number of ASCII digits, at most ``digits`` of them (18: below
    2**63); None for anything else (a sign, a space, ``²``, ``٣``, a longer number)."""
    if not text or len(text) > digits or not _ASCII_DIGITS.issuperset(text):
        return None
    return int(text)


def capped(text: str, limit: int = VALUE_MAX) -> str:
    """``text`` cut to at most ``limit`` characters, ``…`` ending one that was cut."""
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + _MORE


def printable(value: object) -> str:
    """``str(value)`` for a terminal: each character that is not printable (a control
    character, an escape sequence's ESC, a newline, a bidirectional override) is ``?``."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else "?" for c in text)
