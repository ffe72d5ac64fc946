"""Jupyter tools (ipywidgets + plotly ``FigureWidget``): :class:`PartitionTuner` and
:class:`ScheduleExplorer`. The computation behind them is in :mod:`workbench.viz.widgets.core`
(no widgets), the in-place figures in :mod:`workbench.viz.widgets.figures`."""

from workbench.viz.widgets.explorer import ScheduleExplorer, closed_form_bubble, explore
from workbench.viz.widgets.tuner import PartitionTuner

__all__ = ["PartitionTuner", "ScheduleExplorer", "closed_form_bubble", "explore"]
