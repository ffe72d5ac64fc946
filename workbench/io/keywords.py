"""Keyword checking shared by the API's entry points: an unknown keyword (a typo included) is one
``TypeError`` naming the closest accepted name, raised before any work starts."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def check_keywords(given: Iterable[str], accepted: Iterable[str], where: str, note: str = "") -> None:
    """Raise ``TypeError`` for the first name of ``given`` not in ``accepted``, naming the closest
    accepted name (``difflib.get_close_matches``) or, when none is close, listing them all; ``note``
    ends the message."""
    names = sorted(accepted)
    for key in given:
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; the keywords are {', '.join(names)}"
            raise TypeError(f"{where}() got an unexpected keyword {key!r}{hint}{note}")


#: the most characters of a name a message echoes
SHOWN = 60


def shown(name) -> str:
    """``name`` as a message quotes it: its repr, cut to :data:`SHOWN` characters (a 5000-character
    name is not echoed whole); a non-string by its type's name."""
    text = repr(name) if isinstance(name, str) else type(name).__name__
    return text if len(text) <= SHOWN else f"{text[: SHOWN - 3]}...' ({len(name)} characters)"


def did_you_mean(name, names: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the accepted name closest to ``name`` (``difflib``), else ``""``."""
    if not isinstance(name, str) or len(name) > SHOWN:
        return ""
    close = difflib.get_close_matches(name.lower(), sorted(names), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
