"""Per-layer profiles: PipeDream's T_l (forward + backward ms), a_l (activation bytes) and w_l
(parameter bytes) for every layer of a layer-sequential model.

A :class:`Profile` wraps a DataFrame with one row per layer in execution order and at least the
columns ``name, fwd_ms, bwd_ms, act_bytes, param_bytes``. ``act_bytes`` is the size of everything
that crosses the cut *after* this layer (the layer's output, plus any skip tensors carried past it)
for one minibatch. ``meta["kind"]`` says whether the numbers were ``measured`` (and where) or
``modeled`` (and from what).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

REQUIRED = ("name", "fwd_ms", "bwd_ms", "act_bytes", "param_bytes")


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
                raise ValueError(f"profile column {c!r} must be finite and >= 0; layer {i} "
                                 f"({df['name'].iloc[i]!r}) has {df[c].iloc[i]!r}")
        df = df.reset_index(drop=True).copy()
        for c in REQUIRED[1:]:
            df[c] = df[c].astype(float)
        object.__setattr__(self, "layers", df)

    # ---- constructors -----------------------------------------------------------------
    @classmethod
    def from_frame(cls, df: pd.DataFrame, **meta) -> "Profile":
        return cls(df, dict(meta))

    @classmethod
    def from_pipedream(cls, path) -> "Profile":
        from .pipedream_graph import read_graph

        return read_graph(path)

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

    def summary(self) -> str:
        df = self.layers
        kind = self.meta.get("kind", "unknown")
        where = self.meta.get("device", "")
        cols = [c for c in ("name", "fwd_ms", "bwd_ms", "act_bytes", "param_bytes", "flops") if c in df]
        with pd.option_context("display.max_rows", 60, "display.width", 140):
            table = df[cols].to_string()
        return (f"{len(df)} layers, {self.total_ms:.3f} ms fwd+bwd per minibatch, "
                f"{self.total_param_bytes / 2**20:.2f} MiB parameters ({kind}{', ' + where if where else ''})\n{table}")

    # ---- persistence ------------------------------------------------------------------
    def save(self, path) -> Path:
        """Write JSON (``.json``) or CSV (anything else; meta goes to ``<path>.meta.json``)."""
        path = Path(path)
        if path.suffix == ".json":
            path.write_text(json.dumps({"meta": self.meta, "layers": self.layers.to_dict(orient="list")},
                                       indent=1, default=_jsonable))
        else:
            self.layers.to_csv(path, index=False)
            Path(str(path) + ".meta.json").write_text(json.dumps(self.meta, indent=1, default=_jsonable))
        return path

    @classmethod
    def load(cls, path) -> "Profile":
        path = Path(path)
        if not path.exists():
            raise ValueError(f"profile file {path} does not exist")
        if path.name == "graph.txt" or path.suffix == ".txt":
            return cls.from_pipedream(path)
        try:
            if path.suffix == ".json":
                d = json.loads(path.read_text())
                return cls(pd.DataFrame(d["layers"]), d.get("meta", {}))
            meta_path = Path(str(path) + ".meta.json")
            meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
            return cls(pd.read_csv(path), meta)
        except (KeyError, json.JSONDecodeError, pd.errors.ParserError, UnicodeDecodeError) as e:
            raise ValueError(f"{path} is not a profile (CSV/JSON from Profile.save or a PipeDream graph.txt): {e}") from None


def _jsonable(x):
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, float) and math.isnan(x):
        return None
    return str(x)
