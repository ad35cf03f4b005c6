"""QE-dynamic's diagnostics: the reference-above-sample rate, the judged held-out file, and the
held-out correlation of a tiny CometKiwi scored by the fast path."""

from __future__ import annotations

import json

import pytest
import torch
from scipy import stats

from qeebm.errors import QeebmError
from qeebm.qe.heldout import HeldoutProbe, read_judged, ref_above_rate, write_judged

from support.qe import fresh, toy_quality_triples


def test_ref_above_rate_by_hand():
    ref = torch.tensor([1.0, 0.0])
    # Source 0: beats 0.5, loses to 2.0, ties 1.0.  Source 1: beats -1.0, ties 0.0 twice.
    samples = torch.tensor([0.5, 2.0, 1.0, -1.0, 0.0, 0.0])
    assert ref_above_rate(ref, samples) == pytest.approx(2 / 6)
    assert ref_above_rate(ref + 10, samples) == 1.0 and ref_above_rate(ref - 10, samples) == 0.0
    with pytest.raises(ValueError):
        ref_above_rate(ref, samples[:5])


def test_judged_files_round_trip_and_cap(tmp_path):
    rows = [("a b", "x y", "x z", 0.5), ("c", "w", "w", 1.0), ("d e f", "", "q r", 0.0)]
    src, mt, score = read_judged(write_judged(tmp_path / "h.tsv", rows))
    assert (src, mt, score) == (["a b", "c", "d e f"], ["x y", "w", ""], [0.5, 1.0, 0.0])
    assert read_judged(tmp_path / "h.tsv", max_rows=2)[2] == [0.5, 1.0]
    jsonl = tmp_path / "h.jsonl"
    jsonl.write_text("".join(json.dumps({"src": s, "mt": m, "score": y}) + "\n" for s, m, _, y in rows))
    assert read_judged(jsonl) == (src, mt, score)
    # Columns are found by name, in any order, with others ignored.
    (tmp_path / "o.tsv").write_text("score\tlang\tmt\tsrc\n0.25\tmn\tb\ta\n0.75\tmn\td\tc\n")
    assert read_judged(tmp_path / "o.tsv") == (["a", "c"], ["b", "d"], [0.25, 0.75])


@pytest.mark.parametrize("name,text,where", [
    ("missing.tsv", None, "no such file: {path}"),
    ("noheader.tsv", "a\tb\t0.5\nc\td\t0.1\n", "{path}:1: the header must name the columns src, mt, score"),
    ("columns.tsv", "src\tmt\tscore\na\tb\t0.5\nc\td\n", "{path}:3: expected 3 tab-separated columns"),
    ("nan.tsv", "src\tmt\tscore\na\tb\t0.5\nc\td\tgood\n", "{path}:3: 'score' is not a number"),
    ("inf.tsv", "src\tmt\tscore\na\tb\tinf\nc\td\t0.1\n", "{path}:2: 'score' is not a finite number"),
    ("bad.jsonl", '{"src": "a", "mt": "b", "score": 1}\n{"src": "a", "mt": \n', "{path}:2: not JSON"),
    ("noscore.jsonl", '{"src": "a", "mt": "b", "score": 1}\n{"src": "a", "mt": "b"}\n', "{path}:2: no 'score' field"),
    ("one.tsv", "src\tmt\tscore\na\tb\t0.5\n", "{path}: needs at least 2 judged rows"),
])
def test_bad_judged_files_are_one_line_errors_naming_file_and_line(tmp_path, name, text, where):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(QeebmError) as err:
        read_judged(path)
    assert where.format(path=path) in str(err.value)
    assert "\n" not in str(err.value)


def test_heldout_correlation_equals_scipy_on_direct_scores(tmp_path):
    qe = fresh("kiwi")
    rows = toy_quality_triples(60, seed=3)
    probe = HeldoutProbe(write_judged(tmp_path / "h.tsv", rows), max_rows=50)
    assert len(probe) == 50
    # comet's own forward, one padded batch: what the fast path must agree with.
    (inputs,) = qe.prepare_sample([{"src": s, "mt": m} for s, m, _, _ in rows[:50]], stage="predict")
    with torch.no_grad():
        direct = qe.forward(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).score.view(-1)
    true = [q for *_, q in rows[:50]]
    got = probe.measure(qe)
    assert got["pearson"] == pytest.approx(stats.pearsonr(direct.numpy(), true)[0], abs=1e-5)
    assert got["spearman"] == pytest.approx(stats.spearmanr(direct.numpy(), true)[0], abs=1e-5)
    # The measurement leaves the QE's training mode and the global RNG as they were.
    qe.train()
    state = torch.random.get_rng_state()
    probe.measure(qe)
    assert qe.training and torch.equal(state, torch.random.get_rng_state())
