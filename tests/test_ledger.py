"""The protocol's ledger (repro.ledger), derived from the git history: which entry was set after a
committed run had shown the rows it moves. Skipped, with the reason, where the checkout has no history."""

import pytest

from repro import ledger, protocol


@pytest.fixture(scope="module")
def entries():
    try:
        return {e.key: e for e in ledger.ledger()}
    except ledger.NoHistory as e:
        pytest.skip(f"no git history to derive the ledger from: {e}")


def test_every_entry_has_the_commit_that_set_it(entries):
    assert set(entries) == set(protocol.entries())
    committed = ledger.protocol_history(ledger.repo_root())[-1][2]
    assert all(len(e.set_commit) == 40 for k, e in entries.items() if k in committed)
    assert all(e.set_commit == "" for k, e in entries.items() if k not in committed)  # not committed yet


def test_the_ethernet_efficiency_was_changed_after_its_rows_were_seen(entries):
    e = entries["links.ethernet.efficiency"]
    assert (e.previous, e.value) == (0.94, 0.49)
    assert e.changed_after_seen and e.shown_by.startswith("reproduce-")
    # the commit the ledger names is the one whose diff wrote the value (pickaxe check)
    diff = ledger._git(ledger.repo_root(), "show", "--format=", e.set_commit)
    assert "+efficiency = { value = 0.49" in diff.replace("+ ", "+")


def test_an_unchanged_entry_is_not_flagged(entries):
    e = entries["ddp.bucket_bytes"]
    assert e.previous is None and not e.changed_after_seen


def test_every_changed_entry_is_read_over_its_value_before(entries):
    """No headline rests on an entry changed after its rows were seen: each such entry carries an
    interval, one of whose ends is the value it held before (derived from git here, not typed), so
    that every row naming it is judged at the old value as well as the new one."""
    flagged = {k: e for k, e in entries.items() if e.changed_after_seen}
    assert flagged, "the ledger finds no changed entry at all: the history walk is broken"
    assert set(flagged) <= set(protocol.intervals()), sorted(set(flagged) - set(protocol.intervals()))
    for key, e in flagged.items():
        low, point, high = protocol.interval(key)
        assert point == e.value and e.previous in (low, high), (key, e.previous, low, high)


def test_no_history_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(protocol, "PATH", tmp_path / "protocol.toml")
    with pytest.raises(ledger.NoHistory, match="git"):
        ledger.repo_root()
