"""A training run's log, ``<run_dir>/metrics.jsonl``: what the loop writes (``loop.MetricsLog``,
one JSON object per logged step, validations included) and the one reader of it, for the demo, the
sweep, the comparison's curves and the experiment scripts."""

from __future__ import annotations

import json
from pathlib import Path

from qeebm.errors import QeebmError

FILENAME = "metrics.jsonl"


def log_path(run: str | Path) -> Path:
    """The log of a run directory (or the log file itself)."""
    run = Path(run)
    return run if run.suffix == ".jsonl" else run / FILENAME


def read_metrics(run: str | Path) -> list[dict]:
    """Every record of a run's log in order; a missing file or a malformed line is an error naming
    the file and the line."""
    path = log_path(run)
    if not path.is_file():
        raise QeebmError(f"{path}: no training log (is {path.parent} a run directory?)")
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise QeebmError(f"{path}:{number}: not valid JSON ({err.msg})") from None
        if not isinstance(record, dict) or "step" not in record:
            raise QeebmError(f"{path}:{number}: expected an object with a 'step' key")
        records.append(record)
    return records


def validations(run: str | Path, key: str = "val/chrf") -> list[dict]:
    """The records of a run's validations (those that carry ``key``)."""
    return [r for r in read_metrics(run) if key in r]


def best_validation(run: str | Path, key: str = "val/chrf") -> tuple[float, int]:
    """The best value of a validation metric (higher is better) and its step (the later one on a tie)."""
    rows = validations(run, key)
    if not rows:
        raise QeebmError(f"{log_path(run)}: no validation logged {key}")
    return max((r[key], r["step"]) for r in rows)
