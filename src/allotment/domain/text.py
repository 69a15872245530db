"""Text a user writes that others will see: names, labels, users, tenants.

Control characters (NUL, escape, line breaks, DEL, the C1 range) and the Unicode line
separators and bidirectional overrides can rewrite a terminal or forge lines in a listing,
so names refuse them at the door (:func:`check_plain`, :data:`PlainText`) and the CLI
escapes them on the way out (:func:`escape_controls`) for anything stored before.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

from allotment.domain.errors import InvalidInput

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def control_characters(text: str) -> list[str]:
    """The control characters in ``text``, each once, as escapes (``\\x1b``), in order."""
    seen: list[str] = []
    for match in _CONTROL.finditer(text):
        shown = _escape(match.group())
        if shown not in seen:
            seen.append(shown)
    return seen


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def plain_problem(text: str) -> str | None:
    """Why ``text`` is not plain (the characters found), or None."""
    found = control_characters(text)
    if not found:
        return None
    return (
        f"must not contain control characters or line breaks (found {', '.join(found)}); "
        "use printable text"
    )


def check_plain(text: str, *, name: str) -> str:
    """``text`` when plain; else :class:`InvalidInput` naming ``name``."""
    problem = plain_problem(text)
    if problem is not None:
        raise InvalidInput(
            f"{name} {problem}", fields={"name": name, "characters": control_characters(text)}
        )
    return text


def _plain(text: str) -> str:
    problem = plain_problem(text)
    if problem is not None:
        raise ValueError(problem)
    return text


PlainText = Annotated[str, AfterValidator(_plain)]
"""Text without control characters (a pydantic field type)."""


def escape_controls(text: str) -> str:
    """``text`` with each control character shown as its escape (``\\x1b``), for output
    to a terminal."""
    return _CONTROL.sub(lambda m: _escape(m.group()), text)
