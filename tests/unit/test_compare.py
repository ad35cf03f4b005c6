"""scripts/compare.py and the evaluation report: bootstrap intervals, paired tests, sacrebleu parity,
seed aggregation, formatting and the input checks. Small corpora only: the whole file runs in seconds."""

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sacrebleu
from sacrebleu.metrics import BLEU, CHRF, TER

from qeebm import __version__ as QEEBM_VERSION
from qeebm.errors import QeebmError
from qeebm.evaluation.compare import Cell, Comparison, Entry, System, compare, format_csv, format_markdown, run
from qeebm.evaluation.report import FORMAT, build_report, read_report, write_report
from qeebm.metrics.bootstrap import (
    paired_bootstrap_p,
    percentile_ci,
    resample_counts,
    resampled_scores,
    sacrebleu_paired_p,
    seed_pairs,
)
from qeebm.metrics.sacrebleu import corpus_from_stats, make_metric, mean_stats, segment_stats

ROOT = Path(__file__).resolve().parents[2]
VOCAB = [f"w{i}" for i in range(60)]


def corpus(n, seed=0):
    rnd = random.Random(seed)
    return [" ".join(rnd.choices(VOCAB, k=rnd.randint(4, 12))) + "." for _ in range(n)]


def noisy(refs, rate, seed):
    """Each reference word replaced by a random one with probability ``rate``."""
    rnd = random.Random(seed)
    return [" ".join(w if rnd.random() > rate else rnd.choice(VOCAB) for w in r.split()) for r in refs]


def report(system, seed, hyp, ref, sha="sha-test", trained_on=None, heldout=(), config_id=None, **scores):
    return {"format": FORMAT, "system": system, "seed": seed, "config_id": config_id or system,
            "data": {"path": "test.tsv", "sha256": sha},
            "segments": {"ref": list(ref), "hyp": list(hyp), **{k: list(v) for k, v in scores.items()}},
            "trained_on": trained_on, "heldout": list(heldout)}


def entries(*reports):
    return [Entry(Path(f"runs/{r['system']}-{r['seed']}/eval/test.json"), r) for r in reports]


# ---------------------------------------------------------------------------------------------
# Bootstrap confidence intervals


def test_constant_segment_scores_give_a_zero_width_interval():
    counts = resample_counts(50, 200, seed=1)
    scores = resampled_scores("comet", mean_stats([0.8] * 50), counts)
    assert percentile_ci(scores) == pytest.approx((0.8, 0.8), abs=1e-12)


def test_two_valued_interval_has_the_reasoned_bounds():
    # Two segments scoring 0 and 1: a resample holds each with prob 1/2, so its mean is 0, 0.5 or 1
    # with probabilities 1/4, 1/2, 1/4. Of 1000 resamples ~250 are 0 and ~250 are 1, so the order
    # statistics sacrebleu uses (the 26th and 975th of the sorted scores) are 0 and 1; being wrong
    # would need <= 25 zeros out of 1000 draws of p = 1/4, which is impossible in practice.
    scores = resampled_scores("kiwi", mean_stats([0.0, 1.0]), resample_counts(2, 1000, seed=7))
    assert set(np.unique(scores)) <= {0.0, 0.5, 1.0}
    assert abs(np.mean(scores == 0.5) - 0.5) < 0.05
    assert percentile_ci(scores) == (0.0, 1.0)
    # With 40 resamples the interval is the min and max (k = 40 // 40 = 1 -> 2nd and 39th).
    assert percentile_ci(np.arange(40.0)) == (1.0, 38.0)


def test_resampling_is_determined_by_the_seed():
    a, b, c = resample_counts(30, 100, 5), resample_counts(30, 100, 5), resample_counts(30, 100, 6)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert (a.sum(axis=1) == 30).all()
    # the draws are sacrebleu.significance's draws for the same seed
    idx = np.random.default_rng(5).choice(30, size=(100, 30), replace=True)
    assert np.array_equal(a[17], np.bincount(idx[17], minlength=30))


# ---------------------------------------------------------------------------------------------
# Paired test


def test_identical_systems_are_not_significant():
    counts = resample_counts(40, 1000, 12345)
    s = mean_stats(np.linspace(0.2, 0.9, 40))
    d_star = resampled_scores("comet", s, counts) - resampled_scores("comet", s, counts)
    assert paired_bootstrap_p(0.0, d_star) == 1.0

    refs = corpus(20)
    hyp = noisy(refs, 0.3, 1)
    result = compare(entries(report("a", 1, hyp, refs, comet=[0.5] * 20), report("b", 1, hyp, refs, comet=[0.5] * 20)),
                     sacrebleu_test=False)
    for metric in ("bleu", "chrf", "ter", "comet"):
        cell = result.cells["b"][metric]
        assert cell.delta == 0 and cell.p == 1.0 and cell.mark == ""


def test_a_system_better_on_every_segment_is_significant():
    rnd = np.random.default_rng(0)
    base = rnd.uniform(0.3, 0.8, 60)
    better = base + rnd.uniform(0.001, 0.02, 60)
    counts = resample_counts(60, 1000, 12345)
    d_star = resampled_scores("comet", mean_stats(better), counts) - resampled_scores("comet", mean_stats(base), counts)
    p = paired_bootstrap_p(float(better.mean() - base.mean()), d_star)
    assert p == 1 / 1001 and p < 0.01  # no resample can flip the sign: only the +1 remains
    # and the same holds seen from the worse system: the test follows the observed sign
    assert paired_bootstrap_p(float(base.mean() - better.mean()), -d_star) == 1 / 1001
    # tested in the other direction (a seed pair against the mean over seeds) nothing supports it
    assert paired_bootstrap_p(-1.0, d_star) == 1.0



def test_the_difference_gets_the_paired_interval_of_the_resampled_differences():
    refs = corpus(40)
    hyp = noisy(refs, 0.3, 1)
    base = np.linspace(0.2, 0.9, 40)
    shift = np.random.default_rng(1).uniform(0.0, 0.02, 40)
    result = compare(entries(report("a", 1, hyp, refs, comet=base), report("b", 1, hyp, refs, comet=base + shift)),
                     metrics=["comet"], resamples=500, seed=3, sacrebleu_test=False)
    cell = result.cells["b"]["comet"]
    counts = resample_counts(40, 500, 3)
    d_star = 100 * (resampled_scores("comet", mean_stats(base + shift), counts)
                    - resampled_scores("comet", mean_stats(base), counts))
    assert cell.delta_ci == pytest.approx(percentile_ci(d_star), abs=1e-9)
    # Paired: the segments' shared difficulty cancels, so the difference is known to within the
    # spread of the shifts (0..2 points), while each score's own interval spans ~12 points.
    lo, hi = cell.delta_ci
    assert 0 < lo < 100 * shift.mean() < hi < 2 and cell.ci[1] - cell.ci[0] > 10
    assert result.cells["a"]["comet"].delta_ci is None
    # A constant shift on every segment: the interval is that shift exactly.
    same = compare(entries(report("a", 1, hyp, refs, comet=base), report("b", 1, hyp, refs, comet=base + 0.01)),
                   metrics=["comet"], sacrebleu_test=False)
    assert same.cells["b"]["comet"].delta_ci == pytest.approx((1.0, 1.0), abs=1e-9)


# ---------------------------------------------------------------------------------------------
# sacrebleu parity


@pytest.mark.parametrize("name, metric", [("bleu", BLEU()), ("chrf", CHRF(word_order=2)), ("ter", TER())])
def test_summed_segment_statistics_reproduce_sacrebleu_exactly(name, metric):
    refs = corpus(40, seed=3)
    hyps = noisy(refs, 0.35, seed=4)
    hyps[5] = ""  # an empty hypothesis is a legal segment
    stats = segment_stats(name, hyps, refs)
    assert corpus_from_stats(name, stats) == metric.corpus_score(hyps, [refs]).score
    # a resampled corpus (rows repeated) scores exactly as sacrebleu scores that corpus
    counts = resample_counts(len(refs), 3, seed=9)
    rows = np.repeat(np.arange(len(refs)), counts[1].astype(int))
    resampled = [hyps[i] for i in rows], [refs[i] for i in rows]
    assert resampled_scores(name, stats, counts)[1] == metric.corpus_score(resampled[0], [resampled[1]]).score


def test_metric_options_are_rebuilt_from_signatures():
    for name, metric in [("bleu", BLEU(tokenize="intl", lowercase=True, smooth_method="floor")),
                         ("chrf", CHRF(word_order=2, eps_smoothing=True)), ("chrf", CHRF()),
                         ("ter", TER(normalized=True, case_sensitive=True))]:
        metric.corpus_score(["a b c"], [["a b d"]])
        sig = metric.get_signature().format()
        rebuilt = make_metric.__wrapped__(name, sig)
        rebuilt.corpus_score(["a b c"], [["a b d"]])
        assert rebuilt.get_signature().format() == sig
    with pytest.raises(QeebmError, match="nrefs:2"):
        make_metric("bleu", "nrefs:2|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0")


def test_bleu_p_value_agrees_with_sacrebleu_paired_bs():
    # Both draw the same resamples (same seed, same rng.choice call), so they differ only in the
    # statistic: ours counts resamples whose difference changes sign (Koehn 2004); sacrebleu counts
    # centred |differences| above the observed one. For a bootstrap distribution of the difference
    # that is roughly normal N(d, s^2) both are ~ 1 - Phi(d / s); with d / s near 2 (this pair) the
    # normal-theory gap is below 0.001, and counting different tail events on the same 1000
    # resamples adds ~ sqrt(p / R) ~ 0.005. 0.015 is three times that. (Far from significance the
    # two diverge by design: at d / s = 1 sacrebleu gives ~0.12 where the sign count gives ~0.16.)
    refs = corpus(150, seed=3)
    base, system = noisy(refs, 0.30, 21), noisy(refs, 0.27, 61)
    result = compare(entries(report("base", 1, base, refs), report("sys", 1, system, refs)),
                     metrics=["bleu"], resamples=1000, seed=12345)
    cell = result.cells["sys"]["bleu"]
    ours, theirs = cell.p, cell.p_sacrebleu
    assert 0.005 < ours < 0.06, ours  # the regime the tolerance above is argued for
    assert abs(ours - theirs) < 0.015, (ours, theirs)
    assert (ours < 0.05) == (theirs < 0.05)
    assert theirs == sacrebleu_paired_p(["bleu"], base, system, refs, 1000, 12345)["bleu"]

    # Same resamples, same percentile rule: the CI half-width is sacrebleu's (up to its float32 stats).
    from sacrebleu.significance import PairedTest

    from qeebm.metrics.bootstrap import _environ

    with _environ("SACREBLEU_SEED", "12345"):
        _, scores = PairedTest([("base", base), ("sys", system)], {"BLEU": BLEU()}, [refs], test_type="bs",
                               n_samples=1000)()
    lo, hi = cell.ci
    assert (hi - lo) / 2 == pytest.approx(scores["BLEU"][1].ci, abs=1e-4)


def test_sacrebleu_paired_bs_calls_identical_systems_different():
    # The quirk the docstring warns about, kept as a test so a sacrebleu change is noticed.
    refs = corpus(30)
    hyp = noisy(refs, 0.3, 1)
    assert sacrebleu_paired_p(["bleu"], hyp, hyp, refs, 200, 12345)["bleu"] == pytest.approx(1 / 201)


# ---------------------------------------------------------------------------------------------
# Seeds


def test_seed_aggregation_mean_sd_and_pairing():
    refs = corpus(10)
    hyp = noisy(refs, 0.2, 1)
    reps = [report("base", s, hyp, refs, comet=[0.70] * 10) for s in (1, 2, 3)]
    reps += [report("sys", s, hyp, refs, comet=[v] * 10) for s, v in ((3, 0.78), (1, 0.70), (2, 0.74))]
    result = compare(entries(*reps), metrics=["comet"], sacrebleu_test=False)
    cell = result.cells["sys"]["comet"]
    # seeds 70, 74, 78 (x100): mean 74, sd sqrt(((-4)^2 + 0 + 4^2) / 2) = 4
    assert cell.seed_scores == pytest.approx([70, 74, 78])  # sorted by seed
    assert cell.score == pytest.approx(74) and cell.sd == pytest.approx(4)
    assert cell.delta == pytest.approx(4)
    assert cell.ci == pytest.approx((74, 74))  # constant segments: no test-set uncertainty
    # same seeds on both sides -> seed k against seed k; seed 1 ties (p = 1), seeds 2 and 3 are
    # better on every segment (p = 1/1001): 2 of 3 pairs significant -> majority mark
    assert cell.pair_p == pytest.approx([1.0, 1 / 1001, 1 / 1001])
    assert (cell.sig_pairs, cell.n_pairs, cell.mark) == (2, 3, "†")
    assert result.cells["base"]["comet"].sd == 0

    assert seed_pairs([1, 2, 3], [3, 1, 2]) == [(0, 1), (1, 2), (2, 0)]
    assert seed_pairs([1, 2], [7]) == [(0, 0), (1, 0)]
    assert seed_pairs([1], [2, 3]) == [(0, 0), (0, 1)]


def test_seeds_of_one_system_must_share_config_and_be_distinct():
    refs = corpus(5)
    a = report("sys", 1, refs, refs, config_id="c1")
    with pytest.raises(QeebmError, match="differ in config_id"):
        compare(entries(a, report("sys", 2, refs, refs, config_id="c2")), sacrebleu_test=False)
    with pytest.raises(QeebmError, match="seed 1 twice"):
        compare([Entry(Path("x.json"), a), Entry(Path("y.json"), dict(a))], sacrebleu_test=False)


# ---------------------------------------------------------------------------------------------
# Output


def _hand_made_comparison():
    refs = ["a"]
    base, qe = System("sft", entries(report("sft", 1, refs, refs))), System("qe-ebm", entries(report("qe-ebm", 1, refs, refs)))
    cells = {
        "sft": {"bleu": Cell(23.4, (22.2, 24.6), [23.4]), "comet": Cell(81.25, (80.75, 81.75), [81.25])},
        "qe-ebm": {"bleu": Cell(25.9, (24.7, 27.1), [25.5, 26.3], sd=0.5657, delta=2.5, delta_ci=(1.1, 3.9),
                                pair_p=[0.001], sig_pairs=1),
                   "comet": Cell(81.0, (80.4, 81.6), [81.0], delta=-0.25, delta_ci=(-0.9, 0.4), pair_p=[0.3])},
    }
    return Comparison(split="test", n_segments=1012, baseline="sft", systems=[base, qe], metrics=["bleu", "comet"],
                      cells=cells, resamples=1000, seed=12345,
                      sacrebleu_signatures={"bleu": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"})


def test_markdown_table_of_a_hand_made_comparison():
    expected = f"""## test set, 1012 segments, baseline sft

| system | seeds | BLEU | COMET ×100 |
|:--|--:|--:|--:|
| sft (baseline) | 1 | 23.40 ± 1.20 | 81.25 ± 0.50 |
| qe-ebm | 1 | 25.90 ± 1.20 sd 0.57 (+2.50*) | 81.00 ± 0.60 (-0.25) |

Cells: score ± half-width of its 95% bootstrap CI (percentile, segments resampled); several seeds: mean over seeds and sd over seeds (n-1). In parentheses: difference to the baseline; * p < 0.05 in every seed pair, † in most (paired bootstrap resampling, Koehn 2004). Shown ×100: COMET.

- qe-ebm vs sft: +2.5 BLEU*, -0.2 COMET

signature: test:paired-bs|ci:95%-percentile|resamples:1000|seed:12345|significance:0.05|seeds:same-seed-else-all-pairs|sacrebleu:{sacrebleu.__version__}|qeebm:{QEEBM_VERSION}
BLEU: nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0
"""
    assert format_markdown(_hand_made_comparison()) == expected


def test_csv_carries_the_same_numbers():
    rows = format_csv(_hand_made_comparison()).splitlines()
    assert rows[0].startswith("system,seeds,metric,scale,score,ci_low,ci_high,sd,delta,delta_ci_low,delta_ci_high,p,"
                              "sig_pairs,n_pairs,mark,")
    assert rows[1].startswith("sft,1,bleu,1.0,23.4,22.2,24.6,,,,,,,,,,23.4000,test:paired-bs|")
    assert rows[3].startswith("qe-ebm,1,bleu,1.0,25.9,24.7,27.1,0.5657,2.5,1.1,3.9,0.001,1,1,*,,25.5000 26.3000,"
                              "test:paired-bs|")
    assert rows[4].startswith("qe-ebm,1,comet,100.0,81.0,80.4,81.6,,-0.25,-0.9,0.4,0.3,0,1,,,")


def _hacking_reports(judge_gain):
    rnd = np.random.default_rng(3)
    refs = corpus(30)
    hyp = noisy(refs, 0.3, 2)
    kiwi, judge = rnd.uniform(0.4, 0.6, 30), rnd.uniform(0.4, 0.6, 30)
    return entries(
        report("sft", 1, hyp, refs, kiwi=kiwi, judge=judge, comet=judge),
        report("qe-ebm", 1, hyp, refs, kiwi=kiwi + 0.05, judge=judge + judge_gain, comet=judge,
               trained_on="kiwi", heldout=["judge", "comet"]))


def test_reward_hacking_warning_fires_only_without_heldout_gains():
    hacked = compare(_hacking_reports(0.0), metrics=["kiwi", "judge", "comet"], sacrebleu_test=False)
    assert hacked.cells["qe-ebm"]["kiwi"].mark == "*"
    assert len(hacked.warnings) == 1
    assert hacked.warnings[0].startswith("WARNING: possible reward hacking: qe-ebm improves its training QE Kiwi")
    assert hacked.warnings[0] in format_markdown(hacked)

    honest = compare(_hacking_reports(0.02), metrics=["kiwi", "judge", "comet"], sacrebleu_test=False)
    assert honest.cells["qe-ebm"]["judge"].mark == "*" and honest.warnings == []
    # a held-out judge that gets significantly *worse* does not excuse the training QE's gain
    worse = compare(_hacking_reports(-0.02), metrics=["kiwi", "judge"], sacrebleu_test=False)
    assert len(worse.warnings) == 1
    # with no held-out judge among the compared metrics the check cannot run: a note, no warning
    unchecked = compare(_hacking_reports(0.0), metrics=["kiwi"], sacrebleu_test=False)
    assert unchecked.warnings == [] and unchecked.notes[0].startswith("note: cannot check qe-ebm for reward hacking")


def test_reward_hacking_warning_covers_reranked_rows():
    # base+rerank was not trained on anything: its Kiwi gain comes from selecting by Kiwi.
    rnd = np.random.default_rng(3)
    refs = corpus(30)
    hyp = noisy(refs, 0.3, 2)
    kiwi, judge = rnd.uniform(0.4, 0.6, 30), rnd.uniform(0.4, 0.6, 30)
    reranked = report("base+rerank", None, hyp, refs, kiwi=kiwi + 0.05, judge=judge, heldout=["judge"])
    reranked["selected_on"] = "kiwi"
    reranked["selection"] = {"rule": "rerank", "model": "qe/kiwi", "utility": None, "candidates": 8, "mode": "beam",
                             "signature": "rule:rerank|qe:qe/kiwi|candidates:8|gen:beam8|max_new:50",
                             "ms_per_segment": 12.5}
    result = compare(entries(report("base", None, hyp, refs, kiwi=kiwi, judge=judge), reranked),
                     metrics=["kiwi", "judge"], sacrebleu_test=False)
    assert result.warnings == ["WARNING: possible reward hacking: base+rerank improves its selection QE Kiwi "
                               "significantly (+5.00) but none of the held-out judges (Judge) improves "
                               "significantly over base"]
    text = format_markdown(result)
    assert "- base+rerank: chosen by QE qe/kiwi among 8 beam candidates; 12.5 ms per segment" in text
    # A system trained on Kiwi and reranked by it: one warning naming both roles.
    both = dict(reranked, system="qe-ebm+rerank", trained_on="kiwi")
    result = compare(entries(report("base", None, hyp, refs, kiwi=kiwi, judge=judge), both),
                     metrics=["kiwi", "judge"], sacrebleu_test=False)
    assert len(result.warnings) == 1 and "improves its training and selection QE Kiwi" in result.warnings[0]
    # The same gain with a held-out judge that improves too: no warning.
    honest = dict(reranked, segments=dict(reranked["segments"], judge=list(judge + 0.03)))
    assert compare(entries(report("base", None, hyp, refs, kiwi=kiwi, judge=judge), honest),
                   metrics=["kiwi", "judge"], sacrebleu_test=False).warnings == []


# ---------------------------------------------------------------------------------------------
# Reports and inputs


def test_report_round_trip_and_validation(tmp_path):
    refs = corpus(6)
    rep = build_report(system="sft", seed=1, config_id="abc", hyp=noisy(refs, 0.2, 1), ref=refs, src=refs,
                       data_sha256="s", scores={"comet": [0.5] * 6}, trained_on=None, heldout=["comet"])
    assert rep["corpus"]["bleu"] == BLEU().corpus_score(rep["segments"]["hyp"], [refs]).score
    assert rep["signatures"]["chrf"] == "nrefs:1|case:mixed|eff:yes|nc:6|nw:2|space:no|version:" + sacrebleu.__version__
    path = write_report(tmp_path / "run" / "eval" / "test.json", rep)
    assert read_report(path) == rep
    assert [p.name for p in path.parent.iterdir()] == ["test.json"]  # no temporary file left behind

    def fails(mutate, pattern):
        bad = json.loads(json.dumps(rep))
        mutate(bad)
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        with pytest.raises(QeebmError, match=pattern) as err:
            read_report(tmp_path / "bad.json")
        assert "\n" not in str(err.value) and "bad.json" in str(err.value)

    fails(lambda r: r["segments"].pop("hyp"), "missing key 'segments.hyp'")
    fails(lambda r: r["data"].pop("sha256"), "missing key 'data.sha256'")
    fails(lambda r: r.pop("system"), "missing key 'system'")
    fails(lambda r: r["segments"]["comet"].pop(), "'segments.comet' has 5 values for 6")
    fails(lambda r: r["segments"]["comet"].__setitem__(2, "x"), "'segments.comet' item 2")
    fails(lambda r: r.__setitem__("format", "qeebm-eval/0"), "key 'format'")
    fails(lambda r: r.__setitem__("selected_on", 3), "key 'selected_on' must be a metric name or null")
    fails(lambda r: r.__setitem__("selection", {"rule": "best", "candidates": 8, "signature": ""}),
          "key 'selection.rule' is 'best', expected one of rerank, mbr")
    fails(lambda r: r.__setitem__("selection", {"rule": "mbr", "candidates": 0, "signature": ""}),
          "key 'selection.candidates' is 0, not a positive integer")
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(QeebmError, match="broken.json: not valid JSON"):
        read_report(tmp_path / "broken.json")
    rep["segments"]["comet"][0] = math.nan
    with pytest.raises(QeebmError, match="not a finite number"):
        write_report(path, rep)


def test_mismatched_test_sets_are_refused():
    refs = corpus(8)
    hyp = noisy(refs, 0.2, 1)
    with pytest.raises(QeebmError, match="different test sets"):
        compare(entries(report("a", 1, hyp, refs), report("b", 1, hyp, refs, sha="other")), sacrebleu_test=False)
    with pytest.raises(QeebmError, match="has 7 segments"):
        compare(entries(report("a", 1, hyp, refs), report("b", 1, hyp[:7], refs[:7])), sacrebleu_test=False)
    changed = list(refs)
    changed[4] = "x"
    with pytest.raises(QeebmError, match="different references at segment 4"):
        compare(entries(report("a", 1, hyp, refs), report("b", 1, hyp, changed)), sacrebleu_test=False)
    with pytest.raises(QeebmError, match="no per-segment 'comet'"):
        compare(entries(report("a", 1, hyp, refs, comet=[0.1] * 8), report("b", 1, hyp, refs)), metrics=["comet"])
    bad_corpus = report("a", 1, hyp, refs)
    bad_corpus["corpus"] = {"bleu": 99.0}
    with pytest.raises(QeebmError, match="corpus.bleu is 99.0"):
        compare(entries(bad_corpus, report("b", 1, hyp, refs)), sacrebleu_test=False)


def test_cli_writes_all_formats_and_plots(tmp_path):
    refs = corpus(12)
    for system, seed, rate in (("sft", 1, 0.4), ("qe-ebm", 1, 0.2), ("qe-ebm", 2, 0.25)):
        run_dir = tmp_path / f"{system}-{seed}"
        write_report(run_dir / "eval" / "test.json",
                     report(system, seed, noisy(refs, rate, seed), refs, comet=[0.5 + rate] * 12))
        (run_dir / "metrics.jsonl").write_text("".join(
            json.dumps({"step": s, "loss": 3 - rate * s, "val/bleu": 10 + s, "energy/mean": -s}) + "\n" for s in (1, 2, 3)))
    out = tmp_path / "out"
    text = run([str(tmp_path / "sft-1"), str(tmp_path / "qe-ebm-1"), str(tmp_path / "qe-ebm-2")], out=out,
               plots=True, resamples=100, curve_keys=["loss", "val/*", "missing/key"], fmt="json")
    data = json.loads(text)
    assert data["baseline"] == "sft" and data["systems"][1]["seeds"] == [1, 2]
    assert json.loads((out / "comparison.json").read_text()) == data
    md = (out / "comparison.md").read_text()
    assert "| qe-ebm | 2 |" in md and "signature: test:paired-bs|ci:95%-percentile|resamples:100|seed:12345" in md
    pngs = sorted(p.name for p in (out / "plots").iterdir())
    assert pngs == ["curve-loss.png", "curve-val_bleu.png", "forest.png"]
    assert all((out / "plots" / p).read_bytes()[:4] == b"\x89PNG" for p in pngs)


def _forest_reports():
    rnd = np.random.default_rng(5)
    refs = corpus(30)
    hyp = noisy(refs, 0.3, 2)
    kiwi = rnd.uniform(0.4, 0.6, 30)
    return entries(report("base", 1, hyp, refs, kiwi=kiwi),
                   report("better", 1, noisy(refs, 0.1, 3), refs, kiwi=kiwi + 0.005),  # half a point x100
                   report("worse", 1, noisy(refs, 0.6, 4), refs, kiwi=kiwi - 0.02),
                   report("same", 1, hyp, refs, kiwi=kiwi))


def test_forest_plot_draws_each_difference_with_its_interval_around_a_marked_zero():
    from qeebm.evaluation.plots import forest_figure

    result = compare(_forest_reports(), metrics=["bleu", "ter", "kiwi"], resamples=200, sacrebleu_test=False)
    fig = forest_figure(result)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == ["BLEU", "TER ↓", "Kiwi ×100"]
    assert [t.get_text() for t in panels[0].get_yticklabels()] == ["better", "worse", "same"]
    for ax, metric in zip(panels, result.metrics):
        lines = ax.get_lines()
        assert [tuple(lines[0].get_xdata())] == [(0.0, 0.0)]  # the zero line
        drawn = {}
        for line in lines[1:]:
            drawn.setdefault(int(line.get_ydata()[0]), []).append((tuple(line.get_xdata()), line.get_color()))
        for row, name in zip((2, 1, 0), ("better", "worse", "same")):
            cell = result.cells[name][metric]
            (interval, color), (dot, _) = drawn[row]
            assert interval == pytest.approx(cell.delta_ci) and dot == pytest.approx((cell.delta,))
            assert color == ("C2" if result.improved(name, metric) else "C3" if cell.significant else "0.45")
        lo, hi = ax.get_xlim()
        assert lo < min(0, *(result.cells[n][metric].delta_ci[0] for n in ("better", "worse", "same")))
        assert hi > max(0, *(result.cells[n][metric].delta_ci[1] for n in ("better", "worse", "same")))
    # Half a point of Kiwi is drawn apart from zero: the axis spans a few points, not 0..60.
    kiwi = panels[2]
    assert result.cells["better"]["kiwi"].delta == pytest.approx(0.5) and kiwi.get_xlim()[1] - kiwi.get_xlim()[0] < 5
    assert result.improved("better", "kiwi") and result.cells["worse"]["kiwi"].significant


def test_decoding_time_rows_get_no_training_curves(tmp_path, monkeypatch):
    import qeebm.evaluation.compare
    from qeebm.evaluation.compare import curve_runs

    refs = corpus(12)
    hyp = noisy(refs, 0.3, 1)
    reranked = report("sft+rerank", 1, hyp, refs, kiwi=[0.5] * 12, heldout=[])
    reranked["selected_on"] = "kiwi"
    reranked["selection"] = {"rule": "rerank", "model": "qe/kiwi", "utility": None, "candidates": 8, "mode": "beam",
                             "signature": "rule:rerank|qe:qe/kiwi|candidates:8|gen:beam8|max_new:50",
                             "ms_per_segment": 12.5}
    sft_dir = tmp_path / "sft"
    reports = [Entry(tmp_path / "base" / "eval" / "test.json", report("base", None, hyp, refs, kiwi=[0.5] * 12)),
               Entry(sft_dir / "eval" / "test.json", report("sft", 1, hyp, refs, kiwi=[0.6] * 12)),
               Entry(sft_dir / "eval" / "test-rerank.json", reranked)]
    result = compare(reports, metrics=["kiwi"], sacrebleu_test=False)
    assert curve_runs(result) == [("base", tmp_path / "base"), ("sft (seed 1)", sft_dir)]
    for entry in reports:
        write_report(entry.path, entry.report)
    (sft_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 3.0 - s}) + "\n" for s in (1, 2)))
    drawn, plot_curves = [], qeebm.evaluation.compare.plot_curves
    monkeypatch.setattr(qeebm.evaluation.compare, "plot_curves", lambda runs, *a: (drawn.append(list(runs)), plot_curves(runs, *a))[1])
    out = tmp_path / "out"
    run([str(tmp_path / "base"), str(sft_dir), str(sft_dir / "eval" / "test-rerank.json")], out=out, plots=True,
        resamples=50, curve_keys=["loss"], stderr=open(tmp_path / "stderr.txt", "w"))
    assert drawn == [curve_runs(result)]
    assert sorted(p.name for p in (out / "plots").iterdir()) == ["curve-loss.png", "forest.png"]


def test_cli_exits_2_with_one_line_on_mismatched_inputs(tmp_path):
    refs = corpus(5)
    write_report(tmp_path / "a.json", report("a", 1, refs, refs))
    write_report(tmp_path / "b.json", report("b", 1, refs, refs, sha="other"))
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "compare.py"), str(tmp_path / "a.json"),
                           str(tmp_path / "b.json")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: ") and "different test sets" in proc.stderr
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "compare.py"), str(tmp_path / "nowhere")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr == f"error: {tmp_path / 'nowhere'}: no such report file or run directory\n"


def test_a_table_never_mixes_bleu_tokenizations():
    # Chinese text: each report recomputes BLEU from its segments with the options in its signature;
    # reports tokenized differently are refused, and one tokenization applies to every row.
    refs = ["我们今天去公园跑步。", "猫坐在席子上。", "他昨天买了一本新书。"]
    hyps = ["我们今天去公园散步。", "猫坐在垫子上。", "他昨天买了一本书。"]
    zh = build_report(system="zh", seed=1, config_id="a", hyp=hyps, ref=refs, data_sha256="s",
                      signatures={"bleu": "tok:zh"}, sacrebleu=["bleu"])
    plain = build_report(system="13a", seed=1, config_id="b", hyp=refs, ref=refs, data_sha256="s", sacrebleu=["bleu"])
    with pytest.raises(QeebmError, match=r"computed BLEU with different options \(.*tok:13a.* vs .*tok:zh"):
        compare(entries(zh, plain), baseline="zh", metrics=["bleu"], sacrebleu_test=False)
    result = compare(entries(zh, build_report(system="ref", seed=1, config_id="c", hyp=refs, ref=refs, data_sha256="s",
                                              signatures={"bleu": "tok:zh"}, sacrebleu=["bleu"])),
                     baseline="zh", metrics=["bleu"], resamples=20, sacrebleu_test=False)
    assert "|tok:zh|" in result.sacrebleu_signatures["bleu"]
    assert result.cells["zh"]["bleu"].score == pytest.approx(zh["corpus"]["bleu"]) and zh["corpus"]["bleu"] > 0
    assert result.cells["ref"]["bleu"].score == pytest.approx(100.0)


def test_config_id_groups_seeds_that_each_continue_their_own_plateau():
    from qeebm.evaluation.report import config_id

    def cfg(seed, start):
        return {"seed": seed, "model": {"name_or_path": start}, "optim": {"lr": 1e-3}, "output": {"run_dir": f"r{seed}"}}

    # each seed continues its own SFT plateau, at a path that names the seed
    assert config_id(cfg(42, "runs/t/plateau-seed42/best")) == config_id(cfg(231, "runs/t/plateau-seed231/best"))
    # another number after "seed", another setting, or a path that merely contains the digits differ
    assert config_id(cfg(231, "runs/t/plateau-seed2310/best")) != config_id(cfg(231, "runs/t/plateau-seed231/best"))
    assert config_id(cfg(42, "runs/t/plateau-seed42/best")) != config_id(cfg(42, "runs/u/plateau-seed42/best"))
    assert config_id(cfg(6, "facebook/nllb-200-distilled-600M")) == config_id(cfg(42, "facebook/nllb-200-distilled-600M"))
