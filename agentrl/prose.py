"""Numbers for the chapters' prose, taken from the run that printed them (hand-written module).

A chapter records a computed value with ``glue(name=text)`` in a code cell and quotes it in a
markdown cell as ``{glue:text}`name```. The value is stored in the recorded notebook (as myst-nb's
``glue`` stores it, without displaying it), the site pastes it into the sentence, and nbval
compares it with every other output. Re-recording a chapter on another machine therefore
updates its prose. Outside a notebook ``glue`` does nothing, so a chapter's code runs anywhere.
"""
from __future__ import annotations

import re

__all__ = ["glue", "bounded", "span"]

GLUE_PREFIX = "application/papermill.record/"   # myst-nb's mime prefix for hidden glue
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def glue(**values) -> None:
    """Record each ``name=value`` for ``{glue:text}`name``` in the prose; value a str or an int.

    Floats are refused on purpose: format them as the sentence should read them
    (``f"{x:.3f}"``), so the recorded text is exactly the text on the page.
    """
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise TypeError(f"glue({name}=...): expected a str or an int, got "
                            f"{type(value).__name__} {value!r}; format numbers as they should "
                            f"read, e.g. {name}=f'{{x:.3f}}'")
        if not _NAME_RE.match(name):
            raise ValueError(f"glue name {name!r} is not an identifier")
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:          # no IPython: plain Python, nothing to record
        return
    if get_ipython() is None:
        return
    for name, value in values.items():
        display({GLUE_PREFIX + "text/plain": repr(value)}, raw=True,
                metadata={"scrapbook": {"name": name, "mime_prefix": GLUE_PREFIX}})


def bounded(x: float, bound: float = 1e-12) -> str:
    """x for printing: ``'<1e-12'`` when |x| is below ``bound``, else x to two digits.

    A gap that is float64 rounding has digits that depend on the CPU's order of summation, so a
    chapter prints the bound it is under (true on any CPU), never the rounding itself. A gap
    above the bound is a real difference and prints as a value (``'3.1e-02'``).
    """
    if not bound > 0:
        raise ValueError(f"bound must be positive, got {bound!r}")
    return f"<{bound:.0e}" if abs(x) < bound else f"{x:.1e}"


def span(values, fmt: str) -> str:
    """``'lowest to highest'`` of values, each formatted with fmt (``'.2f'``); one value when
    the two read alike. Refuses an empty sequence."""
    values = list(values)
    if not values:
        raise ValueError("span needs at least one value")
    low, high = f"{min(values):{fmt}}", f"{max(values):{fmt}}"
    return low if low == high else f"{low} to {high}"
