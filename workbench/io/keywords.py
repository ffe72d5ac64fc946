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
