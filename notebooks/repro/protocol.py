"""The reproduction's protocol (``data/protocol.toml``): every modeling choice that can move a claim,
each with its source, read here and nowhere else.

* :func:`value` / :func:`source`: one entry by its dotted key (``"ddp.bucket_bytes"``);
* :func:`used`: the ``protocol`` cell of a claim row, ``key=value; ...`` for the entries it used,
  with the values the run actually used (a notebook parameter may override an entry; the row then
  shows it, and ``tests/test_protocol.py`` flags a committed row whose value the protocol does not
  hold);
* :func:`interval` / :data:`intervals`: an entry its sources leave open, ``(low, point, high)``
  with a source for each end; :func:`overridden` evaluates the model at another value;
* :func:`collective`: data parallelism's all-reduce on a topology (bus bandwidth and step latency
  per level from the link classes of ``[servers]`` and ``[links]``, and when a DDP bucket is
  ready), the cost model's keywords.
"""

from __future__ import annotations

import contextlib
from functools import cache
from pathlib import Path
from typing import Any

import tomllib

PATH = Path(__file__).resolve().parent / "data" / "protocol.toml"


@cache
def entries() -> dict[str, dict]:
    """Every entry by dotted key: ``{"value": ..., "source": ..., ["unit": ...]}``."""
    with PATH.open("rb") as f:
        data = tomllib.load(f)
    out: dict[str, dict] = {}

    def walk(prefix: str, node: dict) -> None:
        for k, v in node.items():
            key = f"{prefix}.{k}" if prefix else k
            if isinstance(v, dict) and "value" in v:
                if not str(v.get("source", "")).strip():
                    raise ValueError(f"protocol entry {key!r} has no source")
                out[key] = v
            elif isinstance(v, dict):
                walk(key, v)
            else:
                raise ValueError(f"protocol entry {key!r} must be a table with a value and a source")

    walk("", data)
    return out


#: Values :func:`overridden` puts in place of the file's while a row is evaluated at an interval's end.
OVERRIDES: dict[str, Any] = {}


def value(key: str) -> Any:
    """The protocol's value of ``key`` (or the one :func:`overridden` set); a KeyError names the closest keys."""
    table = entries()
    if key not in table:
        near = sorted(k for k in table if k.split(".")[0] == key.split(".")[0]) or sorted(table)
        raise KeyError(f"no protocol entry {key!r}; entries: {near}")
    return OVERRIDES.get(key, table[key]["value"])


def interval(key: str) -> tuple[Any, Any, Any]:
    """``(low, point, high)`` of ``key``: the entry's ``low`` and ``high`` (each with its own
    ``low_source`` / ``high_source``) where its sources leave it open, else the point three times."""
    v = value(key)
    e = entries()[key]
    if "low" not in e and "high" not in e:
        return v, v, v
    for end in ("low", "high"):
        if end not in e or not str(e.get(f"{end}_source", "")).strip():
            raise ValueError(
                f"protocol entry {key!r} has an interval end without {end} and {end}_source; give both ends"
            )
    return e["low"], e["value"], e["high"]


def intervals() -> list[str]:
    """The entries with a range (:func:`interval`), in file order."""
    return [k for k, e in entries().items() if "low" in e or "high" in e]


@contextlib.contextmanager
def overridden(values: dict[str, Any]):
    """Inside the block :func:`value` returns ``values[key]`` for each of ``values``' keys (an
    interval's end; the file stays as it is). Modules that cache what they computed from the
    protocol must drop it before and after (:func:`repro.paper_fit.evaluate_at`)."""
    for key in values:
        value(key)
    before = dict(OVERRIDES)
    OVERRIDES.update(values)
    try:
        yield
    finally:
        OVERRIDES.clear()
        OVERRIDES.update(before)


def source(key: str) -> str:
    value(key)
    return str(entries()[key]["source"])


def _text(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_text(x) for x in v) + "]"
    if isinstance(v, float) and v.is_integer():
        return str(int(v)) if abs(v) >= 1 else str(v)
    return str(v)


def used(*keys: str, **overrides: Any) -> str:
    """The ``protocol`` cell of a claim row: ``key=value`` for each of ``keys`` (the protocol's value)
    and of ``overrides`` (dotted keys spelled with ``__`` for ``.``: the value the run used)."""
    pairs = [(k, value(k)) for k in keys] + [(k.replace("__", "."), v) for k, v in overrides.items()]
    return "; ".join(f"{k}={_text(v)}" for k, v in pairs)


def parse_used(cell: str) -> dict[str, str]:
    """The pairs of a ``protocol`` cell (:func:`used`), values as text."""
    out = {}
    for part in str(cell or "").split("; "):
        if part:
            k, _, v = part.partition("=")
            out[k] = v
    return out


def text_of(key: str) -> str:
    """The protocol's value of ``key`` as a ``protocol`` cell writes it."""
    return _text(value(key))


def link_classes(server: str) -> list[str]:
    """The link class of each level (innermost first) of the server type ``server`` (a topology
    preset) or of a paper setting (``settings.<key>`` names its server type)."""
    if f"settings.{server}" in entries():
        server = str(value(f"settings.{server}"))
    return list(value(f"servers.{server}"))


def collective(server: str, bandwidths, *, efficiency_scale: float = 1.0) -> dict:
    """The cost model's keywords for data parallelism's all-reduce on a topology of ``server``'s
    links at nominal ``bandwidths`` (bytes/s per level, innermost first; a topology spanning fewer
    levels than the server type has takes its innermost ones): bus bandwidth ``efficiency x nominal``
    and step latency per level, and when DDP's buckets are ready (the buckets themselves are the
    stages of :func:`repro.dp_overhead.bucket_plan`). ``efficiency_scale``
    multiplies every efficiency (a diagnostic: what the claim would need; 1 in every modeled row)."""
    classes = link_classes(server)
    bws = list(bandwidths)
    if not 1 <= len(bws) <= len(classes):
        raise ValueError(f"{server!r} has {len(classes)} link levels, the topology {len(bws)}")
    levels = classes[: len(bws)]
    eff = [float(value(f"links.{c}.efficiency")) * efficiency_scale for c in levels]
    return dict(
        allreduce_bandwidth=[float(b) * e for b, e in zip(bws, eff)],
        allreduce_latency_ms=[float(value(f"links.{c}.step_latency_ms")) for c in levels],
        allreduce_ready=str(value("ddp.allreduce_ready")),
    )


def gpipe_microbatches(stages: int) -> int:
    """GPipe's microbatches per flush on ``stages`` stages: the protocol's
    ``baselines.gpipe_microbatches_per_stage`` times ``stages``."""
    return int(value("baselines.gpipe_microbatches_per_stage")) * int(stages)


def check_physical() -> list[str]:
    """Every entry outside its physical range (an efficiency outside (0, 1], a negative latency or
    size): one line each, empty when all hold."""
    bad = []
    for key, e in entries().items():
        for v in [e[k] for k in ("value", "low", "high") if k in e]:
            if key.endswith("efficiency") and not (isinstance(v, (int, float)) and 0 < v <= 1):
                bad.append(f"{key}={v}: no transport beats its link (an efficiency must be in (0, 1])")
            if key.endswith(("_latency_ms", "_bytes")) and not (isinstance(v, (int, float)) and v >= 0):
                bad.append(f"{key}={v}: must be >= 0")
        ends = [e[k] for k in ("low", "value", "high") if k in e]
        numeric = len(ends) == 3 and all(isinstance(v, (int, float)) for v in ends)
        if numeric and not e["low"] <= e["value"] <= e["high"]:  # a rule's two values have no order
            bad.append(f"{key}: low {e['low']} <= value {e['value']} <= high {e['high']} does not hold")
    return bad
