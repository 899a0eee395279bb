"""The stored figures under benchmarks/: every file is in the folder's index and every file the
index names is there, and every stored sweep still reads through today's report (so a change to
the report that cannot read a committed result shows here, not when someone compares against
it)."""

import json
import re
from pathlib import Path

import pytest

FOLDER = Path(__file__).resolve().parents[1] / "benchmarks"
INDEX = FOLDER / "README.md"


def _indexed() -> set[str]:
    # the index table's first column names each file in backquotes
    return set(re.findall(r"^\| `([^`]+)` \|", INDEX.read_text(), flags=re.MULTILINE))


def test_every_stored_file_is_indexed_and_every_indexed_file_is_stored():
    stored = {p.name for p in FOLDER.iterdir() if p.is_file() and p.name != "README.md"}
    indexed = _indexed()
    assert stored, "no stored figures found"
    assert not stored - indexed, f"stored but not in benchmarks/README.md: {sorted(stored - indexed)}"
    assert not indexed - stored, f"in benchmarks/README.md but not stored: {sorted(indexed - stored)}"


SWEEPS = sorted(p.name for p in FOLDER.glob("*sweep*.json"))


def test_the_latest_sweeps_are_stored():
    assert "h200-sweep.json" in SWEEPS and "h100-sweep.json" in SWEEPS


@pytest.mark.parametrize("name", SWEEPS)
def test_a_stored_sweep_reads_through_the_report(name):
    from parallel_mlp.bench.sweep_report import format_sweep

    results = json.loads((FOLDER / name).read_text())
    rows = [r for r in results["rows"] if "variants" in r]
    assert rows and results["meta"].get("device"), name
    text = format_sweep(results)
    assert "Summary:" in text
    for row in rows:
        assert row["label"] in text, (name, row["label"])
