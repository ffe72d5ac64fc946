"""Jupyter tools (ipywidgets + plotly ``FigureWidget``): :class:`PartitionTuner` and
:class:`ScheduleExplorer`. The computation behind them is in :mod:`workbench.widgets.core`
(no widgets), the in-place figures in :mod:`workbench.widgets.figures`."""

from .explorer import ScheduleExplorer, closed_form_bubble, explore
from .tuner import PartitionTuner

__all__ = ["PartitionTuner", "ScheduleExplorer", "closed_form_bubble", "explore"]
