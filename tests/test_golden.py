"""Golden runs: a fixed-seed run of a few steps of every system on the micro world, under the demo's
quick protocol and each system's tiny recipe, must log what ``tests/golden/micro_runs.json`` stores
(every logged number but timings, to 1e-6). A change that claims to leave training as it was proves
it here. A change meant to alter training rewrites the file and says why in its commit:

    QEEBM_WRITE_GOLDEN=1 .venv/bin/python -m pytest tests/test_golden.py
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch

from qeebm.config import SYSTEMS, load_config
from qeebm.demo import CONFIGS, budget, run_overrides, tiny_recipe
from qeebm.loop import train
from qeebm.runlog import read_metrics

GOLDEN = Path(__file__).resolve().parent / "golden" / "micro_runs.json"
STEPS = 3


def logged_numbers(run_dir: Path) -> list[dict]:
    """Each record's numbers, timings left out (they are the one thing allowed to change)."""
    return [{k: v for k, v in r.items() if isinstance(v, (int, float)) and "seconds" not in k and k != "elapsed"}
            for r in read_metrics(run_dir)]


@pytest.fixture(scope="module")
def runs(micro_world, tmp_path_factory) -> dict[str, list[dict]]:
    torch.set_num_threads(1)  # as the demo's workers: the numbers depend on the thread count
    out = tmp_path_factory.mktemp("golden")
    b = budget(quick=True) | {"steps": STEPS}
    logs = {}
    for name in SYSTEMS:
        run_dir = out / name
        overrides = run_overrides(name, micro_world, run_dir, b, seed=42) + ["logging.every=1"]
        train(load_config(CONFIGS / tiny_recipe(name), overrides))
        logs[name] = logged_numbers(run_dir)
    if os.environ.get("QEEBM_WRITE_GOLDEN"):
        GOLDEN.write_text(json.dumps(logs, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return logs


@pytest.mark.parametrize("name", SYSTEMS)
def test_a_short_run_logs_the_stored_numbers(runs, name):
    stored = json.loads(GOLDEN.read_text(encoding="utf-8"))[name]
    logged = runs[name]
    assert [r["step"] for r in logged] == [r["step"] for r in stored], "a different logging schedule"
    for got, want in zip(logged, stored):
        # New diagnostics may be added; every stored one must still be logged, with the same value.
        missing = sorted(set(want) - set(got))
        assert not missing, f"step {want['step']}: no longer logged: {missing}"
        changed = {k: (got[k], v) for k, v in want.items() if not math.isclose(got[k], v, rel_tol=1e-6, abs_tol=1e-6)}
        assert not changed, f"{name}, step {want['step']}: (logged, stored) {changed}"
