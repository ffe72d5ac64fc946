"""Schedules as data, both ways: PyTorch's schedule CSV (``torch.distributed.pipelining``).

Torch's "compute_only" format (``PipelineScheduleMulti._dump_csv`` / ``_load_csv``,
``_PipelineScheduleRuntime._load_csv``) is one CSV row per rank, one cell per action, each cell
``_Action.__repr__``: ``{stage}{type}{microbatch}`` with type ``F`` forward, ``B`` full backward,
``I`` backward for the input (our ``BI``), ``W`` backward for the weights (our ``BW``); an empty
cell is a no-op slot (torch pads its unit-time order with ``None``). The "compute_comms" format
adds ``SEND_F``/``RECV_F``/``SEND_B``/``RECV_B``, ``UNSHARD``/``RESHARD`` and ``REDUCE_GRAD``;
our IR keeps sends and receives implicit (:meth:`Schedule.dependencies`), so reading ignores them.
Cells are parsed with torch's own ``_Action.from_str``; ``OVERLAP_F_B`` actions are expanded into
their sub-actions in order.

A torch schedule is one iteration of M microbatches followed by ``optimizer.step()`` outside the
schedule: :func:`from_torch_csv` gives every stage one synchronous update at the end (AR of a
replicated stage does not arise: each stage lives on one rank) and gradient accumulation over the
M microbatches (``update="sync"``, ``microbatches_per_step = M``). :func:`to_torch_csv` writes the
compute ops of a workbench schedule with one update per stage (flush schedules with ``steps=1``);
schedules whose updates interleave with the microbatches (PipeDream, 2BW, data parallel with
several rounds), replicated stages, and remote weights (master family) have no torch equivalent
and are refused with the reason.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from torch.distributed.pipelining.schedules import _Action

from workbench.schedules.core import COMPUTE, Op, Schedule, in_flight_peak, validate

TO_TORCH = {"F": "F", "B": "B", "BI": "I", "BW": "W"}
FROM_TORCH = {v: k for k, v in TO_TORCH.items()}
IGNORED = ("SEND_F", "RECV_F", "SEND_B", "RECV_B", "UNSHARD", "RESHARD", "REDUCE_GRAD")


def torch_order(schedule: Schedule) -> dict[int, list[str]]:
    """Per-rank action strings of ``schedule``'s compute ops (torch's ``_Action`` repr), checking
    that torch's runtime can express it (module docstring)."""
    if schedule.num_segments > 1:
        raise ValueError(
            f"{schedule.name}: cuts sequences into segments; torch's actions have no segment "
            f"(export an unsegmented schedule, e.g. segments=1)"
        )
    if any(len(ws) > 1 for ws in schedule.stage_workers):
        raise ValueError(
            f"{schedule.name}: a replicated stage has no torch pipelining equivalent (one rank per "
            "stage); export a straight pipeline"
        )
    steps = {(op.stage, op.step) for _, op in schedule if op.kind == "STEP"}
    if any(t > 0 for _, t in steps) or schedule.update != "sync":
        raise ValueError(
            f"{schedule.name}: torch's schedule is one iteration with one update per stage after it; "
            f"this schedule updates {1 + max(t for _, t in steps)} times (rule {schedule.update!r}); "
            "build a flush schedule with steps=1"
        )
    if any(op.weights_worker is not None and op.weights_worker != w for w, op in schedule):
        raise ValueError(
            f"{schedule.name}: reads weights from other workers (master family); torch's CSV has no "
            "placement of weights"
        )
    return {
        w: [f"{op.stage}{TO_TORCH[op.kind]}{op.microbatch}" for op in ops if op.kind in COMPUTE]
        for w, ops in enumerate(schedule.ops)
    }


def to_torch_csv(schedule: Schedule, path=None) -> str:
    """The schedule in torch's compute_only CSV (one row per rank); written to ``path`` if given
    (a new file: an existing one is not overwritten). Returns the CSV text."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    for _, row in sorted(torch_order(schedule).items()):
        writer.writerow(row)
    text = buf.getvalue()
    if path is not None:
        path = Path(path)
        if path.exists():
            raise ValueError(f"{path} exists; choose a new file name")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return text


def _actions(cell: str, where: str):

    try:
        action = _Action.from_str(cell)
    except RuntimeError as e:
        raise ValueError(f"{where}: {e}") from None
    if action is None:
        return []
    if action.sub_actions is not None:  # OVERLAP_F_B: its sub-actions, in order
        return [a for sub in action.sub_actions for a in _actions(repr(sub), where)]
    kind = action.computation_type.value
    if kind in IGNORED:
        return []
    if kind not in FROM_TORCH or action.microbatch_index is None:
        raise ValueError(f"{where}: action {cell!r} is not a compute action with a microbatch (F, B, I, W)")
    return [(FROM_TORCH[kind], action.stage_index, action.microbatch_index)]


def from_torch_csv(source, name: str = "torch-csv") -> Schedule:
    """A workbench Schedule from torch's schedule CSV (a path, or the CSV text itself when it
    contains a newline or a comma). Rank r's row becomes worker r's op list; each stage gets one
    synchronous update (STEP, last stage first) at the end of the iteration. Raises ValueError
    naming the row and cell of anything it cannot read."""
    text = str(source)
    label = "CSV text"
    if "\n" not in text and "," not in text:
        path = Path(text)
        if not path.is_file():
            raise ValueError(f"{path}: no such schedule CSV file")
        text, label = path.read_text(), str(path)
    rows = list(csv.reader(io.StringIO(text)))
    while rows and not any(c.strip() for c in rows[-1]):
        rows.pop()
    if not rows:
        raise ValueError(f"{label}: no actions; expected one CSV row of actions (e.g. 0F0,0F1,0B0) per rank")
    orders: list = []
    owner: dict = {}
    for r, row in enumerate(rows):
        order = []
        for c, cell in enumerate(row):
            for kind, s, b in _actions(cell, f"{label} row {r + 1} cell {c + 1}"):
                if owner.setdefault(s, r) != r:
                    raise ValueError(
                        f"{label}: stage {s} appears on ranks {owner[s]} and {r}; a stage lives on one rank"
                    )
                order.append(Op(kind, s, b))
        orders.append(order)
    S = max(owner) + 1
    missing = sorted(set(range(S)) - set(owner))
    if missing:
        raise ValueError(f"{label}: stages {missing} have no actions; stages must be 0..{S - 1}")
    M = 1 + max(op.microbatch for ops in orders for op in ops)
    ops = [
        tuple(o) + tuple(Op("STEP", s, step=0) for s in sorted((s for s, w in owner.items() if w == r), reverse=True))
        for r, o in enumerate(orders)
    ]
    layout = tuple((owner[s],) for s in range(S))
    sched = Schedule(
        name,
        S,
        len(ops),
        M,
        tuple(ops),
        layout,
        "sync",
        M,
        tuple(max(1, in_flight_peak(o)) for o in ops),
        {"source": label},
    )
    validate(sched)
    return sched
