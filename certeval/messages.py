"""How a message shows what a user gave: every value echoed cut to a readable length, every line one line.

A 10⁶-character id in a scores table or a flag used to be echoed whole into a 1 MB stderr line; a value holding a
line break split the one-line refusal in two. :func:`shown` is the echo of one value, :func:`one_line` what the
command line prints every refusal and failure through. Light on purpose: the CLI imports it before any command.
"""

from __future__ import annotations

import re
from typing import Any

SHOWN_CHARS = 300  # a value echoed in a message (a long file path fits whole): longer ones are cut to this many


def shown(value: Any, width: int = SHOWN_CHARS) -> str:
    """``repr(value)`` for a message, cut to ``width`` characters (a 10⁶-character id would make a 1 MB line)."""
    return clip(repr(value), width)


def clip(text: str, width: int = SHOWN_CHARS) -> str:
    """``text`` cut in the middle to about ``width`` characters, saying how much was left out."""
    if len(text) <= width:
        return text
    keep = max(width - 30, 10)
    return f"{text[:keep * 2 // 3]}…[{len(text) - keep} chars]…{text[-(keep - keep * 2 // 3):]}"


def one_line(message: str, word: int = 300, total: int = 2000) -> str:
    """A message as one readable line: line breaks escaped, every word longer than ``word`` characters cut (the
    echoed values), the whole cut to ``total``. The CLI prints every error through it."""
    text = message.replace("\r", "\\r").replace("\n", "\\n")
    text = re.sub(rf"\S{{{word + 1},}}", lambda m: clip(m.group(0), word), text)
    return clip(text, total)
