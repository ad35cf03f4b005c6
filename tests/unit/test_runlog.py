import json

import pytest

from qeebm.errors import QeebmError
from qeebm.utils.runlog import best_validation, read_metrics, validations


def write_log(run_dir, rows):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def test_validations_and_the_best_one(tmp_path):
    write_log(tmp_path, [{"step": 10, "loss": 3.0}, {"step": 50, "val/chrf": 30.5, "val/kiwi": 0.2},
                         {"step": 100, "val/chrf": 31.0}, {"step": 150, "val/chrf": 31.0}, {"step": 200, "val/chrf": 29.0}])
    assert [r["step"] for r in validations(tmp_path)] == [50, 100, 150, 200]
    assert [r["step"] for r in validations(tmp_path, "val/kiwi")] == [50]
    assert best_validation(tmp_path) == (31.0, 150)  # a tie goes to the later step
    assert len(read_metrics(tmp_path / "metrics.jsonl")) == 5


def test_a_broken_log_names_its_file_and_line(tmp_path):
    write_log(tmp_path, [{"step": 1}])
    with open(tmp_path / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write('{"step": 2, "loss": \n')
    with pytest.raises(QeebmError, match=r"metrics.jsonl:2: not valid JSON"):
        read_metrics(tmp_path)
    write_log(tmp_path, [{"step": 1}, {"loss": 2.0}])
    with pytest.raises(QeebmError, match=r"metrics.jsonl:2: expected an object with a 'step' key"):
        read_metrics(tmp_path)


def test_a_missing_log_or_metric_is_an_error(tmp_path):
    with pytest.raises(QeebmError, match="no training log"):
        read_metrics(tmp_path / "nowhere")
    write_log(tmp_path, [{"step": 1, "loss": 2.0}])
    with pytest.raises(QeebmError, match="no validation logged val/chrf"):
        best_validation(tmp_path)
