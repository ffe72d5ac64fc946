"""The Profile type: one row per layer in execution order (PipeDream's T_l, a_l, w_l), and its files.

A :class:`Profile` wraps a DataFrame with one row per layer in execution order and at least the
columns ``name, fwd_ms, bwd_ms, act_bytes, param_bytes`` (see :mod:`workbench.profiling.measure`, which
measures them). This module imports nothing of the workbench but the ground floor: readers of other
formats (PipeDream's ``graph.txt``) register themselves here (:func:`register_reader`) when the
profiling package is imported.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from workbench.io.cards import card, one_line
from workbench.io.folders import json_ready

REQUIRED = ("name", "fwd_ms", "bwd_ms", "act_bytes", "param_bytes")
#: A measured profile is flagged (:meth:`Profile.trust_note`) when its timed runs spread by more
#: than this share of the median (``meta["spread"]``) ...
SPREAD_LIMIT = 0.3
#: ... or when other work was running: a 1-minute load average before profiling above the cores
#: the profile left idle (``cores - threads``) by more than this many runnable processes.
LOAD_MARGIN = 1.0


@dataclass(frozen=True)
class Profile:
    layers: pd.DataFrame
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        df = self.layers
        missing = [c for c in REQUIRED if c not in df.columns]
        if missing:
            raise ValueError(f"profile is missing column(s) {missing}; need {list(REQUIRED)}")
        if len(df) == 0:
            raise ValueError("profile has no layers; profile a model with at least one layer")
        for c in REQUIRED[1:]:
            col = pd.to_numeric(df[c], errors="coerce").to_numpy(dtype=float)
            bad = np.flatnonzero(~np.isfinite(col) | (col < 0))
            if bad.size:
                i = int(bad[0])
                raise ValueError(
                    f"profile column {c!r} must be finite and >= 0; layer {i} "
                    f"({df['name'].iloc[i]!r}) has {_plain(df[c].iloc[i])}"
                )
        df = df.reset_index(drop=True).copy()
        for c in REQUIRED[1:]:
            df[c] = df[c].astype(float)
        object.__setattr__(self, "layers", df)

    # ---- constructors -----------------------------------------------------------------
    @classmethod
    def from_frame(cls, df: pd.DataFrame, **meta) -> Profile:
        return cls(df, dict(meta))

    @classmethod
    def from_pipedream(cls, path) -> Profile:
        """PipeDream's ``graph.txt`` (:func:`workbench.profiling.pipedream.read_graph`)."""
        return _reader("pipedream")(path)

    # ---- derived ----------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.layers)

    @property
    def compute_ms(self) -> np.ndarray:
        """T_l = forward + backward time per layer (ms)."""
        return (self.layers["fwd_ms"] + self.layers["bwd_ms"]).to_numpy()

    @property
    def total_ms(self) -> float:
        return float(self.compute_ms.sum())

    @property
    def total_param_bytes(self) -> float:
        return float(self.layers["param_bytes"].sum())

    def scaled(self, compute: float = 1.0, samples: float = 1.0, note: str = "") -> Profile:
        """This profile on a GPU ``1/compute`` times as fast and at ``samples`` times the minibatch.

        Per layer: ``fwd_ms, bwd_ms (and flops) x compute·samples``, ``act_bytes x samples`` (and
        the parts in ``act_parts``), ``param_bytes`` unchanged; in ``meta``: the input bytes, the
        batch size and the node DAG PipeDream's optimizer reads (``meta["graph"]``: each node's
        times and activation bytes alike), so every reader of the profile sees the same numbers.
        Compute time is taken as proportional to the samples (a GPU kept as busy at the other
        batch; at a smaller batch it usually runs less efficiently, so the saving is an upper
        bound). ``note`` is appended to ``meta["source"]``."""
        if not (compute > 0 and samples > 0 and np.isfinite(compute) and np.isfinite(samples)):
            raise ValueError(f"scaled needs finite factors > 0, got compute={compute!r}, samples={samples!r}")
        t = compute * samples
        df = self.layers.assign(
            fwd_ms=self.layers["fwd_ms"] * t,
            bwd_ms=self.layers["bwd_ms"] * t,
            act_bytes=self.layers["act_bytes"] * samples,
        )
        if "flops" in df:
            df["flops"] = df["flops"] * samples
        if "act_parts" in df:
            df["act_parts"] = [
                ";".join(f"{float(v) * samples:.12g}" for v in str(p).split(";")) for p in df["act_parts"]
            ]
        meta = dict(self.meta)
        for key in ("input_bytes", "batch_size", "batch_size_if_imagenet"):
            if meta.get(key) is not None:
                v = meta[key] * samples
                meta[key] = round(v) if key.startswith("batch") else v
        if "input_parts_bytes" in meta:
            meta["input_parts_bytes"] = [v * samples for v in meta["input_parts_bytes"]]
        if "graph" in meta:  # LayerGraph.to_dict: nodes [id, desc, fwd_ms, bwd_ms, act_bytes, param_bytes]
            g = meta["graph"]
            nodes = [[i, d, f * t, b * t, a * samples, p] for i, d, f, b, a, p in g["nodes"]]
            meta["graph"] = {**g, "nodes": nodes}
        meta["scaled"] = dict(
            compute=self.meta.get("scaled", {}).get("compute", 1.0) * compute,
            samples=self.meta.get("scaled", {}).get("samples", 1.0) * samples,
        )
        if note:
            meta["source"] = f"{meta.get('source', '')}{note}"
        return Profile(df, meta)

    def trust_note(self) -> str:
        """One line when a measured profile's numbers are not trustworthy, else "": the timed runs
        spread widely (``meta["spread"]`` > :data:`SPREAD_LIMIT`), or other processes competed for
        the cores (``load_before > cores - threads + LOAD_MARGIN``: on a busy CPU a thread waits for
        time slices of several ms, so small layers come out many times too slow)."""
        m = self.meta
        if m.get("kind") != "measured" or "threads" not in m:
            return ""
        why = []
        load, cores, threads = m.get("load_before"), m.get("cores"), int(m.get("threads") or 1)
        if load is not None and cores and load > cores - threads + LOAD_MARGIN:
            why.append(f"load average {load:.1f} on {cores} cores while profiling with {threads} thread(s)")
        if m.get("spread", 0.0) > SPREAD_LIMIT:
            why.append(f"repeated runs spread by {m['spread']:.0%} of the median (p90 - p10)")
        if not why:
            return ""
        fewer = " or with fewer threads (threads=1, --threads 1)" if threads > 1 else ""
        return (
            "warning: these measured times may be too slow and noisy: "
            + "; ".join(why)
            + f"; profile again on a quiet machine{fewer}"
        )

    def summary(self) -> str:
        df = self.layers
        kind = self.meta.get("kind", "unknown")
        where = self.meta.get("device", "")
        cols = [c for c in ("name", "fwd_ms", "bwd_ms", "act_bytes", "param_bytes", "flops") if c in df]
        with pd.option_context("display.max_rows", 60, "display.width", 140):
            table = df[cols].to_string()
        note = f"\n{self.trust_note()}" if self.trust_note() else ""
        return (
            f"{len(df)} layers, {self.total_ms:.3f} ms fwd+bwd per minibatch, "
            f"{self.total_param_bytes / 2**20:.2f} MiB parameters ({kind}{', ' + where if where else ''})\n"
            f"{table}{note}"
        )

    # ---- Jupyter manners -----------------------------------------------------------------
    def _rows(self) -> list:
        df = self.layers
        batch = self.meta.get("batch_size")
        return [
            ("layers", len(df), ""),
            ("batch size", batch if batch else "not recorded", "samples" if batch else ""),
            ("fwd+bwd", self.total_ms, "ms per minibatch"),
            ("parameters", self.total_param_bytes / 2**20, "MiB"),
            ("largest cut", float(df["act_bytes"].max()) / 2**20, "MiB"),
        ]

    def _label(self) -> str:
        kind = self.meta.get("kind", "kind not recorded")
        where = self.meta.get("device") or self.meta.get("source") or ""
        return f"{kind}{' on ' + str(where) if where and kind == 'measured' else (', ' + str(where) if where else '')}"

    def __repr__(self) -> str:

        return one_line(
            "Profile",
            [("model", self.meta.get("model", "unnamed"), "")] + self._rows()[:4] + [("kind", self._label(), "")],
        )

    def _repr_html_(self) -> str:

        cols = [c for c in ("name", "fwd_ms", "bwd_ms", "act_bytes", "param_bytes") if c in self.layers]
        note = self.trust_note()
        return card(
            f"Profile of {self.meta.get('model', 'a model')}",
            self._rows(),
            label=self._label() + (f" — {note}" if note else ""),
            table=self.layers[cols],
        )

    # ---- persistence ------------------------------------------------------------------
    def save(self, path) -> Path:
        """Write JSON (``.json``) or CSV (anything else; meta goes to ``<path>.meta.json``)."""
        path = Path(path)
        if path.suffix == ".json":
            path.write_text(
                json.dumps(json_ready({"meta": self.meta, "layers": self.layers.to_dict(orient="list")}), indent=1)
            )
        else:
            self.layers.to_csv(path, index=False)
            Path(str(path) + ".meta.json").write_text(json.dumps(json_ready(self.meta), indent=1))
        return path

    @classmethod
    def load(cls, path) -> Profile:
        """Read a profile file (see :meth:`save`, or a PipeDream graph.txt); a file whose layers all
        have zero compute time is refused (nothing to partition or simulate)."""
        prof = cls._load(Path(path))
        if prof.total_ms <= 0:
            raise ValueError(
                f"profile {path} has zero compute time (fwd_ms + bwd_ms) in all {len(prof)} layers; "
                "nothing to balance: measure the model (workbench profile) or fill in per-layer times"
            )
        return prof

    @classmethod
    def _load(cls, path: Path) -> Profile:
        if not path.exists():
            raise ValueError(f"profile file {path} does not exist")
        if path.name == "graph.txt" or path.suffix == ".txt":
            return cls.from_pipedream(path)
        try:
            if path.suffix == ".json":
                d = json.loads(path.read_text())
                if not isinstance(d, dict) or not isinstance(d.get("layers"), (dict, list)):
                    raise ValueError(
                        f"{path} holds a JSON {type(d).__name__}, not a profile: expected an object "
                        '{"meta": {...}, "layers": {column: [values per layer]}} as Profile.save writes'
                    )
                return cls(pd.DataFrame(d["layers"]), d.get("meta", {}) if isinstance(d.get("meta"), dict) else {})
            meta_path = Path(str(path) + ".meta.json")
            meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
            return cls(pd.read_csv(path), meta)
        except (
            KeyError,
            json.JSONDecodeError,
            pd.errors.ParserError,
            pd.errors.EmptyDataError,
            UnicodeDecodeError,
        ) as e:
            raise ValueError(
                f"{path} is not a profile (CSV/JSON from Profile.save or a PipeDream graph.txt): {e}"
            ) from None


def _plain(value) -> str:
    """A cell as a message shows it: ``nan``, ``-1.0``, ``'abc'`` (not ``np.float64(nan)``)."""
    return repr(value.item() if isinstance(value, np.generic) else value)


_READERS: dict[str, Callable[..., Profile]] = {}


def register_reader(kind: str, fn: Callable[..., Profile]) -> None:
    """Register ``fn(path) -> Profile`` for files of ``kind`` (``"pipedream"``: a ``graph.txt``)."""
    _READERS[kind] = fn


def _reader(kind: str) -> Callable[..., Profile]:
    if kind not in _READERS:  # workbench/profiling/__init__.py imports every reader's module, so this is a bug
        raise ValueError(f"no reader for {kind} profiles is registered; known: {sorted(_READERS)}")
    return _READERS[kind]
