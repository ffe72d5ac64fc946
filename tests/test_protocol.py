"""The reproduction's protocol (notebooks/repro/data/protocol.toml): every entry has a source
and lies in its physical range, the experiments read their choices from it, and every claim row of
the committed run used only values it holds."""

from __future__ import annotations

import pandas as pd
import pytest

from repro import dp_overhead as dpo
from repro import protocol
from repro import time_to_accuracy as tta


def test_every_entry_has_a_source_and_a_physical_value():
    table = protocol.entries()
    assert len(table) >= 30
    assert all(str(e["source"]).strip() for e in table.values())
    assert protocol.check_physical() == []
    assert all(0 < protocol.value(f"links.{c}.efficiency") <= 1 for c in ("nvlink", "pcie", "ethernet"))


def test_a_bad_entry_is_caught(monkeypatch):
    """The physical check can fail: an all-reduce faster than its links is flagged."""
    bad = dict(protocol.entries())
    bad["links.pcie.efficiency"] = dict(value=1.4, source="fitted")
    monkeypatch.setattr(protocol, "entries", lambda: bad)
    assert any("links.pcie.efficiency" in line for line in protocol.check_physical())
    with pytest.raises(KeyError, match="no protocol entry"):
        protocol.value("links.pcie.speed")


def test_the_experiments_read_their_choices_from_the_protocol():
    assert dpo.DDP_BUCKET_BYTES == protocol.value("ddp.bucket_bytes")
    assert dpo.MODELS["vgg16"].batch_size == protocol.value("fig1.batch_vgg16")
    assert dpo.MODELS["gnmt8"].batch_size == protocol.value("fig1.batch_gnmt")
    cfg = tta.Config()
    for k in ("model", "lr", "target", "epochs", "workers", "samples_per_update", "microbatches"):
        assert getattr(cfg, k) == protocol.value(f"statistical_efficiency.{k}"), k
    assert list(cfg.seeds) == protocol.value("statistical_efficiency.seeds")
    c = protocol.collective("8xV100-nvlink-25g", [25e9, 3.125e9])
    assert c["allreduce_bandwidth"] == pytest.approx(
        [25e9 * protocol.value("links.nvlink.efficiency"), 3.125e9 * protocol.value("links.ethernet.efficiency")]
    )
    assert c["allreduce_ready"] == protocol.value("ddp.allreduce_ready")


def _mismatches(claims: pd.DataFrame) -> list[str]:
    out = []
    for r in claims.itertuples(index=False):
        for key, val in protocol.parse_used(getattr(r, "protocol", "")).items():
            if key not in protocol.entries():
                out.append(f"{r.claim}: {key} is not in the protocol")
            elif val != protocol.text_of(key):
                out.append(f"{r.claim}: {key}={val}, the protocol holds {protocol.text_of(key)}")
    return out


def test_the_check_of_claim_rows_can_fail():
    rows = pd.DataFrame(
        [
            dict(claim="a", protocol=protocol.used("ddp.bucket_bytes")),
            dict(claim="b", protocol=protocol.used(statistical_efficiency__lr=0.05)),
            dict(claim="c", protocol="links.pcie.speed=3"),
        ]
    )
    bad = _mismatches(rows)
    assert len(bad) == 2 and "statistical_efficiency.lr=0.05" in bad[0] and "not in the protocol" in bad[1]


def test_committed_claim_rows_use_only_the_protocols_values(committed_run):
    """Every modeled row of notebooks 02 and 03 names the protocol entries it used, and each value
    it used is the protocol's."""
    from repro.reproduce import collect_claims

    claims = collect_claims(committed_run)
    assert "protocol" in claims.columns, "the committed run predates the protocol column"
    modeled = claims[  # an untestable row models nothing (its explanation says why), so it uses no entry
        claims["notebook"].isin(["02_dp_communication_overhead", "03_time_to_accuracy"])
        & claims["label"].str.startswith("modeled")
        & (claims["verdict"] != "untestable")
    ]
    assert len(modeled) >= 20 and modeled["protocol"].fillna("").str.len().gt(0).all()
    assert _mismatches(claims.fillna({"protocol": ""})) == []


def test_the_stand_ins_sizes_come_from_the_protocol_and_their_rows_name_them():
    """AWD-LM's and S2VT's stand-in profiles (roofline projections) are built at the protocol's
    ``stand_ins.*`` sizes, and every claim row that reads one of those profiles lists the entries."""
    from repro import paper_fit

    awd = dpo.MODELS["awd-lstm"]
    assert awd.batch_size == protocol.value("stand_ins.awd_lstm_batch")
    assert dict(awd.options) == {
        "vocab_size": protocol.value("stand_ins.awd_lstm_vocab"),
        "seq_len": protocol.value("stand_ins.awd_lstm_seq_len"),
    }
    s2vt = paper_fit.model_profile("s2vt", "Titan X")
    assert s2vt.meta["batch_size"] == protocol.value("stand_ins.s2vt_batch")
    rows, _ = paper_fit.claim_rows()
    for row, num in zip(rows, paper_fit.PAPER):
        if num.model in dpo.STAND_IN_KEYS:
            assert all(k in row["protocol"] for k in dpo.STAND_IN_KEYS[num.model]), row["claim"]
        else:
            assert "stand_ins." not in row["protocol"], row["claim"]


def test_open_entries_carry_an_interval_with_a_source_for_each_end():
    keys = protocol.intervals()
    assert "links.ethernet.efficiency" in keys
    for key in keys:
        low, point, high = protocol.interval(key)
        if all(isinstance(v, (int, float)) for v in (low, point, high)):
            assert low <= point <= high and low < high, key
        else:  # a rule (or a set of seeds) and the one it held before: two alternatives, no order
            assert low != high and point in (low, high), key
        e = protocol.entries()[key]
        assert str(e["low_source"]).strip() and str(e["high_source"]).strip(), key
    assert protocol.interval("links.ethernet.efficiency")[::2] == (0.49, 0.94)
    assert protocol.interval("ddp.bucket_bytes")[0] == protocol.interval("ddp.bucket_bytes")[2]


def test_overridden_puts_a_value_in_place_and_back():
    key = "links.ethernet.efficiency"
    before = protocol.value(key)
    with protocol.overridden({key: 0.94}):
        assert protocol.value(key) == 0.94
    assert protocol.value(key) == before
    with pytest.raises(KeyError, match="no protocol entry"):
        with protocol.overridden({"links.ethernet.nonsense": 1}):
            pass


def test_an_interval_without_a_source_is_refused(monkeypatch):
    table = dict(protocol.entries())
    table["links.ethernet.efficiency"] = dict(table["links.ethernet.efficiency"], high_source="")
    monkeypatch.setattr(protocol, "entries", lambda: table)
    with pytest.raises(ValueError, match="high_source"):
        protocol.interval("links.ethernet.efficiency")
