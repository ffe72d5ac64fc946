"""The ipywidgets controls of the tools, made one way: label width fitted to the description, fixed
widget width, and sliders and text boxes that report a value when it is set (not on every drag step
or keystroke), so that one change runs one update."""

from __future__ import annotations

import ipywidgets as W


def _style() -> dict:
    return {"description_width": "initial"}


def int_slider(value: int, lo: int, hi: int, description: str, width: str) -> W.IntSlider:
    """An integer slider over ``lo..hi`` that reports on release."""
    return W.IntSlider(
        value=value,
        min=lo,
        max=hi,
        description=description,
        style=_style(),
        continuous_update=False,
        layout=W.Layout(width=width),
    )


def float_box(value: float, lo: float, hi: float, step: float, description: str, *, width: str) -> W.BoundedFloatText:
    """A number box bounded to ``lo..hi``."""
    return W.BoundedFloatText(
        value=value, min=lo, max=hi, step=step, description=description, style=_style(), layout=W.Layout(width=width)
    )


def int_box(value: int, lo: int, hi: int, description: str, width: str) -> W.BoundedIntText:
    """A whole-number box bounded to ``lo..hi``."""
    return W.BoundedIntText(
        value=value, min=lo, max=hi, description=description, style=_style(), layout=W.Layout(width=width)
    )


def dropdown(options, value, description: str, width: str) -> W.Dropdown:
    return W.Dropdown(
        options=options, value=value, description=description, style=_style(), layout=W.Layout(width=width)
    )


def text_box(description: str, width: str) -> W.Text:
    """A text box that reports on Enter or when it loses focus."""
    return W.Text(description=description, style=_style(), layout=W.Layout(width=width), continuous_update=False)
