"""``qeebm qe-check`` (qeebm/analysis/qe_check.py, qeebm/qe/degrade.py, qeebm/analysis/probe.py): its statistics on
hand-made inputs, the degradations in several scripts, the command end to end on tiny models, and
on the default tiny world what docs/qe-check.md says it finds there."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from qeebm.analysis import qe_check as qc
from qeebm.cli import main
from qeebm.errors import QeebmError
from qeebm.guards import GuardConfig, check, script_share
from qeebm.qe.degrade import (
    DEGRADATIONS,
    degrade_all,
    doubled,
    other_script,
    over_long,
    repeated_ngram,
    truncated,
    units,
)

# The default tiny world's QEs the report must tell apart, by directory under qe/: their place in
# the order of strength (0 weakest) and whether they prefer an over-long copy of the reference
# often enough to need the length guard. A Kiwi or judge the world ships later is one line here.
TINY_QES = {
    "kiwi-weak": {"strength": 0, "length_blind_spot": True},
    "kiwi-medium": {"strength": 1, "length_blind_spot": True},
    "kiwi-lowrange": {"strength": 2, "length_blind_spot": True},
    "comet": {"strength": 3, "length_blind_spot": False},
}
REFERENCE_BASED = "comet"  # the world's reference-based COMET: a quality to measure against, too
# What the tiny-world tests decode: the whole dev set (300 sentences), 8 samples each. Fewer do not
# order the two weaker Kiwis reliably (docs/qe-check.md, "How many sentences").
DEV_SENTENCES, SAMPLES = 300, 8


def scores(samples, beam=None, ref=None, degraded=None) -> qc.Scores:
    samples = np.asarray(samples, dtype=float)
    n = len(samples)
    return qc.Scores(samples, np.asarray(beam if beam is not None else np.zeros(n), dtype=float),
                     np.asarray(ref if ref is not None else np.zeros(n), dtype=float),
                     {k: np.asarray(v, dtype=float) for k, v in (degraded or {}).items()})


# ----------------------------------------------------------------------------------------------
# Statistics


def test_isotonic_pools_adjacent_violators_and_ties():
    assert qc.isotonic([1, 2, 3, 4], [1, 3, 2, 4]).tolist() == [1, 2.5, 2.5, 4]
    # Tied x share one value; here the tie's mean (2) is above the next point (0): all pool to 4/3.
    assert np.allclose(qc.isotonic([1, 1, 2], [3, 1, 0]), [4 / 3] * 3)
    # Unsorted input comes back in its own order.
    assert qc.isotonic([3, 1, 2], [5, 0, 1]).tolist() == [5, 0, 1]
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=200), rng.normal(size=200)
    fit = qc.isotonic(x, y)
    assert np.all(np.diff(fit[np.argsort(x)]) >= -1e-12) and np.isclose(fit.sum(), y.sum())
    assert np.allclose(qc.isotonic(x, fit), fit)  # a monotone sequence is its own fit


def test_within_source_is_the_mean_over_sources_with_spread():
    from qeebm.tinyworld.judged import within_source

    qe = [1, 2, 3, 1, 2, 3, 5, 5, 5, 1, 2]
    quality = [1, 2, 3, 3, 2, 1, 1, 2, 3, 1, 2]
    groups = [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3]  # group 2 has no QE spread, group 3 two members
    assert qc.per_source(qe, quality, groups) == pytest.approx([1.0, -1.0])
    assert qc.within_source(qe, quality, groups) == 0.0
    assert within_source(qe, quality, groups) == 0.0  # the tiny world's report uses the same rule


def test_ranking_and_reranking_of_a_perfect_and_a_reversed_qe():
    quality = scores([[10, 20, 30], [40, 30, 20]], beam=[25, 35])
    good = qc.ranking(scores([[1, 2, 3], [3, 2, 1]], beam=[2.5, 2.5]), quality)
    assert good["within_source_spearman"] == pytest.approx(1) and good["within_source_pearson"] == pytest.approx(1)
    assert good["sources_with_spread"] == 2 and good["within_source_spearman_se"] == 0
    bad = qc.ranking(scores([[3, 2, 1], [1, 2, 3]]), quality)
    assert bad["within_source_spearman"] == pytest.approx(-1)
    pick = qc.reranking(scores([[3, 2, 1], [1, 2, 3]]), quality)  # chooses 10 and 20
    assert pick["random"] == pytest.approx(25) and pick["qe"] == 15 and pick["oracle"] == 35 and pick["beam"] == 30
    assert pick["share_of_oracle_gain"] == pytest.approx(-1)
    assert qc.reranking(scores([[1, 2, 3], [3, 2, 1]]), quality)["share_of_oracle_gain"] == pytest.approx(1)
    # ties go to the first sample, as qeebm.translation.qad's reranking
    assert qc.reranking(scores([[0, 0, 0], [0, 0, 0]]), quality)["qe"] == 25
    assert qc.reference_above_samples(scores([[0, 1, 2], [5, 5, 5]], ref=[1, 6])) == pytest.approx(4 / 6)


def test_calibration_of_an_exact_monotone_qe_and_of_source_offsets():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(50, 5))
    exact = qc.calibration(scores(x[:, :4], beam=x[:, 4]), scores(np.exp(x[:, :4]), beam=np.exp(x[:, 4])))
    assert exact["monotone_r2"] == pytest.approx(1) and exact["monotone_rmse"] == pytest.approx(0, abs=1e-12)
    assert len(exact["bins"]) == 10 and sum(b["n"] for b in exact["bins"]) == 250
    means = [b["quality_mean"] for b in exact["bins"]]
    assert means == sorted(means)
    # Quality = score + a per-source offset: within a source a score difference buys exactly as much
    # quality (slope 1), across sources the offsets blur it, and most of what the monotone map leaves
    # is the offsets.
    offset = rng.normal(scale=3, size=(50, 1))
    shifted = qc.calibration(scores(x[:, :4], beam=x[:, 4]), scores(x[:, :4] + offset, beam=x[:, 4] + offset[:, 0]))
    assert shifted["slope_within_source"] == pytest.approx(1)
    assert shifted["source_offset_share"] > 0.9 > shifted["source_offset_share_if_independent"] == 0.2


# ----------------------------------------------------------------------------------------------
# Degradations


TEXTS = {  # script -> a sentence in it
    "Cyrl": "Үхэрүүд өглөө Тасномонтод мугаат увдаг.",
    "Latn": "Die Kühe mögen am Morgen eine Jacke.",
    "Grek": "Οι αγελάδες αρέσουν το πρωί.",
    "Geor": "ძროხებს დილით მოსწონთ ქურთუკი.",
    "Deva": "गायों को सुबह जैकेट पसंद है।",
    "Arab": "الأبقار تحب السترة في الصباح.",
    "Hebr": "הפרות אוהבות מעיל בבוקר.",
    "Hang": "소들은 아침에 재킷을 좋아한다.",
    "Hans": "奶牛早上喜欢在塔斯诺蒙特穿夹克。",
    "Thai": "วัวชอบเสื้อแจ็คเก็ตในตอนเช้า",
}


@pytest.mark.parametrize("script", list(TEXTS))
def test_degradations_work_in_any_script(script):
    text = TEXTS[script]
    parts, sep = units(text)
    assert sep == ("" if script in ("Hans", "Thai") else " ")
    assert doubled(text) == f"{text} {text}"
    cut = truncated(text)
    assert cut and text.startswith(cut.split()[0]) and len(cut) < len(text)
    # another script: none of the text's letters left in its own
    moved = other_script(text)
    assert script_share(moved, script) == 0 and script_share(moved, "Latn" if script != "Latn" else "Cyrl") == 1
    rep = repeated_ngram(text, random.Random(3))
    assert len(rep) > len(text) and set(units(rep, sep == " ")[0]) == set(parts)
    longer = over_long(text, TEXTS["Cyrl"] if script != "Cyrl" else TEXTS["Latn"], random.Random(3))
    assert longer.startswith(text.rstrip()[:-1]) and len(longer) > len(text)


def test_degrade_all_is_seeded_per_kind_and_the_guards_catch_what_they_are_for():
    src = ["The cows like a jacket in the morning.", "I read two books today.", "Where is the city?"]
    ref = ["Үхэрүүд өглөө мугаат увдаг.", "Би өнөөдөр хоёр ном уншсан.", "Хот хаана байна вэ?"]
    first, again, other = degrade_all(src, ref, seed=0), degrade_all(src, ref, seed=0), degrade_all(src, ref, seed=1)
    assert first == again and first["repeated_ngram"] != other["repeated_ngram"]
    assert list(first) == list(DEGRADATIONS) and first["source_copy"] == src and first["empty"] == ["", "", ""]
    # over_long's filler is the reference seven pairs on
    assert all(t.split()[len(r.split())] in ref[(i + 7) % 3].split() for i, (t, r) in enumerate(zip(first["over_long"], ref)))
    cfg = GuardConfig(length_unit="chars")
    for kind in ("source_copy", "other_script", "empty"):
        hits = check(src, first[kind], cfg, tgt_lang="khk_Cyrl").hits[DEGRADATIONS[kind]]
        assert all(hits), kind


def test_the_tiny_worlds_degenerations_are_qe_checks():
    from qeebm.tinyworld.language import degenerate

    text, filler = "Үхэрүүд өглөө Тасномонтод мугаат увдаг.", "Би өнөөдөр хоёр ном уншсан."
    assert degenerate(text, "run_on_copy", random.Random(0)) == doubled(text)
    for kind, fn in (("over_long", lambda r: over_long(text, filler, r, spaced=True)),
                     ("repeated_ngram", lambda r: repeated_ngram(text, r, spaced=True))):
        for seed in range(5):
            assert degenerate(text, kind, random.Random(seed), filler) == fn(random.Random(seed))


# ----------------------------------------------------------------------------------------------
# Candidates, scores, blind spots, the verdict


class FakeScorer:
    """A QE whose score is a text's length (a length-loving QE); remembers whether it saw references."""

    def __init__(self, kind: str):
        self.kind, self.saw_ref = kind, None

    def score(self, src, mt, ref=None):
        self.saw_ref = ref is not None
        return [float(len(m)) for m in mt]


def candidates(n: int = 4, k: int = 3) -> qc.Candidates:
    src = [f"source number {i} here." for i in range(n)]
    ref = ["Үхэр өглөө мугаат увдаг." if i % 2 else "123" for i in range(n)]
    samples = [[r[: j + 2] for j in range(k)] for r in ref]
    return qc.Candidates(src, ref, samples, [r[:3] for r in ref], degrade_all(src, ref))


def test_scores_route_references_by_kind_and_blind_spots_skip_unchanged_pairs():
    c = candidates()
    for kind, uses_ref in (("kiwi", False), ("xcomet", False), ("comet", True)):
        fake = FakeScorer(kind)
        s = qc.score_candidates(c, qc.qe_score_fn(fake))
        assert fake.saw_ref is uses_ref
    assert s.samples.shape == (4, 3) and s.ref.tolist() == [len(r) for r in c.ref]
    spots = qc.blind_spots(c, s)
    # a length-loving QE prefers every longer copy and never a shorter one
    assert spots["doubled"]["prefers_reference"] == 0 and spots["over_long"]["prefers_reference"] == 0
    assert spots["truncated"]["prefers_reference"] == 1 and spots["empty"]["prefers_reference"] == 1
    # "123" has no letters: another script leaves it unchanged, so those pairs do not count
    assert spots["other_script"]["rows"] == 2
    with pytest.raises(QeebmError, match="reference-free"):
        qc.reference_score_fn(FakeScorer("kiwi"))


def test_guard_coverage_and_the_verdict_name_what_is_open():
    c = candidates()
    s = qc.score_candidates(c, qc.qe_score_fn(FakeScorer("kiwi")))
    target = qc.target_scores(c, qc.chrf_scores)
    coverage = qc.guard_coverage(c, GuardConfig(length_unit="chars"), tgt_lang="khk_Cyrl", src_lang="eng_Latn")
    assert coverage["catches"]["empty"] == 1 and coverage["catches"]["source_copy"] == 1
    assert coverage["catches"]["other_script"] == 1
    m = qc.measure(c, s, {"chrf": target}, coverage)
    v = qc.verdict(m)
    # the length-loving QE prefers every longer copy: doubled, over-long, repeated, the (longer)
    # source, the romanised reference; never a truncated or an empty one
    assert v["guards_needed"] == ["length_ratio", "repetition", "copy", "script"]
    assert v["open"] == [k for k in ("doubled", "over_long", "repeated_ngram")
                         if coverage["catches"][k] < qc.GUARD_CATCHES]
    for rank, level in ((0.05, "weak"), (qc.RANKING_WEAK, "limited"), (0.29, "limited"), (qc.RANKING_MEASURED, "strong"),
                        (float("nan"), "unknown")):
        m["ranking"]["chrf"].update(within_source_spearman=rank, within_source_spearman_se=0.001)
        assert qc.verdict(m)["level"] == level
    probe = {"samples_drawn": 80, "sample_length_ratio": {"start": 1.0, "max": 4.0}}
    for rise, fall, hackable in ((0.03, 20.0, True), (0.03, qc.PROBE_CHRF_DROP / 2, False), (-0.01, 20.0, None)):
        assert qc.verdict(m, probe | {"qe_rise": rise, "chrf_fall": fall})["hackable"] is hackable


def test_the_probe_summary_of_a_hand_made_log():
    from qeebm.analysis.probe import summarise

    scores, lengths = [0.2, 0.1, 0.3, 0.5, 0.4, 0.9, 0.1], [1.0, 1.0, 2.0, 4.0, 3.0, 2.0, 1.5]
    records = [{"step": t, "qe-ebm/sample_score": q, "qe-ebm/len_ratio": n}
               for t, (q, n) in enumerate(zip(scores, lengths), 1)]
    records.insert(3, {"step": 3, "val/kiwi": 0.25, "val/chrf": 20.0, "val/bleu": 5.0})
    records.append({"step": 7, "val/kiwi": 0.3, "val/chrf": 24.0, "val/bleu": 6.0})
    out = summarise(records, {"kiwi": 0.2, "chrf": 30.0, "bleu": 9.0}, steps=7, per_step=10, window=3)
    # running means over 3 steps: 0.2, 0.3, 0.4, 0.6, 0.467; the peak ends at step 6
    assert out["samples_qe"] == pytest.approx({"start": 0.2, "peak": 0.6, "peak_step": 6, "end": 1.4 / 3, "window": 3})
    assert out["qe_rise"] == pytest.approx(0.4) and out["chrf_fall"] == 10
    assert out["sample_length_ratio"] == {"start": 1.0, "max": 4.0, "max_step": 4, "end": 1.5}
    assert [r["step"] for r in out["curve"]] == [0, 3, 7] and out["curve"][1]["sample_length_ratio"] == 2.0
    # over the first validation interval: 30 samples
    assert out["per_1000_samples"] == pytest.approx({"dev_qe": 0.05 / 0.03, "dev_chrf": -10 / 0.03,
                                                     "sample_length_ratio": 1 / 0.03})


def test_qe_only_overrides_turn_off_everything_but_the_qe():
    from qeebm.analysis.probe import qe_only_overrides
    from qeebm.config import load_config

    cfg = load_config(overrides=qe_only_overrides("qe-ebm", 4) + qe_only_overrides("reinforce", 4)
                      + qe_only_overrides("ppo", 4))
    assert cfg.qe_ebm.ce_weight == 0 and cfg.qe_ebm.energy_weight == 1 and cfg.qe_ebm.energy_ramp_steps == 0
    assert not (cfg.qe_ebm.guards or cfg.reinforce.guards or cfg.ppo.guards)
    assert cfg.reinforce.ce_weight == cfg.ppo.ce_weight == 0 and cfg.reinforce.sampling.top_p == 1.0
    assert cfg.qe_ebm.sampling.num_samples == cfg.ppo.sampling.num_samples == 4
    with pytest.raises(QeebmError, match="no QE-only form"):
        qe_only_overrides("sft", 4)


# ----------------------------------------------------------------------------------------------
# The command


def test_bad_requests_are_one_line_errors(micro_world, tmp_path, capsys):
    world = micro_world
    # the last of a repeated option wins: each case overrides the valid request
    base = ["qe-check", "--qe", str(world / "qe/kiwi"), "--translator", str(world / "nllb-base"),
            "--dev", str(world / "data/dev.tsv"), "--out", str(tmp_path / "out"), "--max-sentences", "4"]
    cases = [(["--dev", str(tmp_path / "nope.tsv")], "nope.tsv"),
             (["--samples", "2"], "at least 3 samples"),
             (["--tgt-lang", "xx_Zzzz"], "unknown language code 'xx_Zzzz'"),
             (["--qe", str(world / "qe/comet"), "--probe-steps", "2"], "needs a reference-free CometKiwi"),
             (["--max-sentences", "-1"], "--max-sentences")]
    for extra, message in cases:
        assert main(base + extra) == 2, extra
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


def test_report_on_mbart_with_a_probe(micro_world, tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["qe-check", "--qe", str(micro_world / "qe/kiwi"), "--translator", str(micro_world / "mbart-base"),
                 "--dev", str(micro_world / "data/dev.tsv"), "--comet", str(micro_world / "qe/comet"),
                 "--samples", "4", "--max-sentences", "8", "--out", str(out), "--probe-steps", "2",
                 "--probe-batch", "4", "--probe-samples", "2"]) == 0
    result = json.loads((out / "qe_check.json").read_text())  # plain JSON: NaN written as null
    m = result["measurements"]
    assert m["sources"] == 8 and m["samples_per_source"] == 4 and set(m["ranking"]) == {"chrf", "comet"}
    assert set(m["blind_spots"]) == set(DEGRADATIONS)
    p = result["probe"]
    assert p["samples_drawn"] == 2 * 4 * 2 and [r["step"] for r in p["curve"]] == [0, 1, 2]
    assert [r["step"] for r in p["per_step"]] == [1, 2] and p["samples_qe"]["window"] == 2
    # only the probe's log is kept, not its weights
    assert (out / "probe" / "metrics.jsonl").is_file() and not (out / "probe" / "final").exists()
    for name in ("reliability.png", "blind_spots.png", "probe.png"):
        assert (out / name).stat().st_size > 1000
    md = (out / "qe_check.md").read_text()
    assert "## Blind spots" in md and "## Hackability probe" in md and "![probe](probe.png)" in md
    assert md in capsys.readouterr().out


def test_xcomet_as_the_qe_and_as_the_reference_based_quality(tmp_path):
    from support.qe import model_dir
    from support.tiny import tiny_texts, tiny_translator_dir

    texts = tiny_texts(12)
    dev = tmp_path / "dev.tsv"
    dev.write_text("src\ttgt\n" + "".join(f"{s}\t{t}\n" for s, t in zip(texts[::2], texts[1::2])), encoding="utf-8")
    for qe, comet in ((model_dir("xcomet"), model_dir("comet")), (model_dir("kiwi"), model_dir("xcomet"))):
        result = qc.run(str(qe), str(tiny_translator_dir("nllb")), str(dev), tmp_path / qe.name, comet=str(comet),
                        samples=3, max_new_tokens=8, beams=2)
        assert result["qe_kind"] == qe.name.split("_")[1] and set(result["measurements"]["ranking"]) == {"chrf", "comet"}
    # the QE itself as --comet is not measured against itself
    result = qc.run(str(model_dir("comet")), str(tiny_translator_dir("nllb")), str(dev), tmp_path / "self",
                    comet=str(model_dir("comet")), samples=3, max_new_tokens=8, beams=2)
    assert set(result["measurements"]["ranking"]) == {"chrf"} and "not measured against itself" in result["notes"][0]


def test_the_recipes_qe_check_runs_without_accelerate(micro_world, tmp_path):
    from support.commands import RECIPES, run

    out = tmp_path / "out"
    proc = run(["bash", str(RECIPES / "en-mn.sh"), "--tiny", str(micro_world), "--qe-check", "--out", str(out)])
    assert proc.returncode == 0, proc.stderr
    assert "accelerate.commands.launch" not in proc.stderr and "# qe-check:" in proc.stdout
    result = json.loads((out / "qe-check" / "mbart50" / "qe_check.json").read_text())
    assert result["qe"] == str(micro_world / "qe/kiwi") and result["translator"] == str(micro_world / "mbart-base")
    assert result["comet"] == str(micro_world / "qe/comet") and result["dev"] == str(micro_world / "data/dev.tsv")


# ----------------------------------------------------------------------------------------------
# The default tiny world: what docs/qe-check.md reports


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The default tiny world (its shipped bases and QEs copied: about 20 s)."""
    from qeebm.tinyworld.build import build

    return build(tmp_path_factory.mktemp("default-world") / "tinyworld")


@pytest.fixture(scope="module")
def measured(world):
    """Every QE of TINY_QES measured on the same candidates of the base translator, as the command
    measures one: against chrF++ and the world's reference-based COMET."""
    from qeebm.config import CorpusConfig, ModelConfig
    from qeebm.data.corpus import read_corpus
    from qeebm.qe.models import load_qe
    from qeebm.qe.scoring import QEScorer
    from qeebm.tinyworld.judged import quality
    from qeebm.translation.translator import Translator

    dev = read_corpus(CorpusConfig(path=str(world / "data/dev.tsv"), max_examples=DEV_SENTENCES), "dev", True)
    translator = Translator.load(ModelConfig(name_or_path=str(world / "nllb-base")))
    c = qc.make_candidates(translator, dev.src, dev.tgt, k=SAMPLES)
    coverage = qc.guard_coverage(c, GuardConfig(), tgt_lang="khk_Cyrl", src_lang="eng_Latn",
                                 count_tokens=translator.num_tokens)
    comet = QEScorer(load_qe(str(world / "qe" / REFERENCE_BASED)))
    targets = {"chrf": qc.target_scores(c, qc.chrf_scores), "comet": qc.target_scores(c, qc.reference_score_fn(comet)),
               "quality": qc.target_scores(c, qc.text_score_fn(quality))}
    out = {}
    for name in TINY_QES:
        scorer = comet if name == REFERENCE_BASED else QEScorer(load_qe(str(world / "qe" / name)))
        mine = {k: v for k, v in targets.items() if not (k == "comet" and name == REFERENCE_BASED)}
        qe = qc.score_candidates(c, qc.qe_score_fn(scorer))
        m = qc.measure(c, qe, mine, coverage)
        out[name] = {"m": m, "verdict": qc.verdict(m), "scores": qe, "targets": mine}
    return out


def _by_strength():
    return sorted(TINY_QES, key=lambda q: TINY_QES[q]["strength"])


def test_the_report_orders_the_tiny_qes_by_strength(measured):
    within = {q: measured[q]["m"]["ranking"]["chrf"]["within_source_spearman"] for q in TINY_QES}
    kiwis = [q for q in _by_strength() if q != REFERENCE_BASED]
    # against the reference-based COMET every step of the order shows
    by_comet = [measured[q]["m"]["ranking"]["comet"]["within_source_spearman"] for q in kiwis]
    assert by_comet == sorted(by_comet), dict(zip(kiwis, by_comet))
    # against chrF++ the strongest Kiwi stands clear of the others (the two weaker ones differ by
    # about 0.01, less than this dev set resolves)
    assert within[kiwis[-1]] > max(within[q] for q in kiwis[:-1]) + 0.03, within
    # and the reference-based COMET is rated strongest, by a wide margin and by the verdict
    assert within[REFERENCE_BASED] > within[kiwis[-1]] + 0.15
    assert measured[REFERENCE_BASED]["verdict"]["level"] == "strong"
    # the Kiwis within the range the tiny world trained against (the weakest sits near its floor)
    assert all(measured[q]["verdict"]["level"] in ("weak", "limited") for q in kiwis)
    assert measured[kiwis[-1]]["verdict"]["level"] == "limited"


def test_the_length_blind_spot_is_flagged(measured):
    for q, expect in TINY_QES.items():
        spots, v = measured[q]["m"]["blind_spots"], measured[q]["verdict"]
        fails = 1 - spots["over_long"]["prefers_reference"]
        assert (fails >= qc.BLIND_SPOT_FAILURES) is expect["length_blind_spot"], (q, fails)
        assert ("length_ratio" in v["guards_needed"]) is expect["length_blind_spot"]
        if expect["length_blind_spot"]:
            # the length guard's default range lets most over-long copies through: left open
            assert "over_long" in v["open"]
    # the strong Kiwi: the reference over its over-long copy in about 90% of pairs (87% here)
    assert 0.8 < measured["kiwi-lowrange"]["m"]["blind_spots"]["over_long"]["prefers_reference"] < 0.95
    assert all(row["prefers_reference"] == 1 for row in measured[REFERENCE_BASED]["m"]["blind_spots"].values())


def test_within_source_agrees_with_the_worlds_qe_report(measured, world):
    # Against the world's own quality, over 5 samples a source, the within-source Pearson is the QE
    # report's measure. The report's samples came from four translators on 400 other sentences, so
    # the two agree within their sampling error (3 standard errors of the difference, each side
    # taken as noisy as this one), not exactly (docs/qe-check.md).
    report = json.loads((world / "qe" / "qe_report.json").read_text())
    for q in TINY_QES:
        qe, quality = measured[q]["scores"], measured[q]["targets"]["quality"]
        n = len(qe.samples)
        values = qc.per_source(qe.samples[:, :5].ravel(), quality.samples[:, :5].ravel(), np.repeat(np.arange(n), 5))
        se = np.std(values, ddof=1) / np.sqrt(len(values))
        assert np.mean(values) == pytest.approx(report[q]["within_source_pearson"], abs=3 * np.sqrt(2) * se), q


def test_blind_spots_agree_with_the_worlds_qe_report_on_the_same_rows(world):
    """The QE report's "prefers the reference over" numbers, recomputed by qe-check's scoring and
    blind-spot code on the same held-out references and the same degenerate copies; qe-check's own
    "doubled" is the report's run-on copy."""
    from qeebm.config import CorpusConfig
    from qeebm.data.corpus import read_corpus
    from qeebm.qe.models import load_qe
    from qeebm.qe.scoring import QEScorer
    from qeebm.tinyworld.judged import degenerate_probes
    from qeebm.tinyworld.language import Pair

    held = read_corpus(CorpusConfig(path=str(world / "data/qe_heldout.tsv")), "qe_heldout", True)
    probes = degenerate_probes([Pair(s, t) for s, t in zip(held.src, held.tgt)], 3)  # the build's seed + 3
    degraded = {"doubled": degrade_all(held.src, held.tgt)["doubled"], **{k: [r.mt for r in v] for k, v in probes.items()}}
    c = qc.Candidates(held.src, held.tgt, [[t] * 3 for t in held.tgt], list(held.tgt), degraded)
    report = json.loads((world / "qe" / "qe_report.json").read_text())
    for q in TINY_QES:
        spots = qc.blind_spots(c, qc.score_candidates(c, qc.qe_score_fn(QEScorer(load_qe(str(world / "qe" / q))))))
        for kind, share in report[q]["prefers_reference_over"].items():
            assert spots[kind]["prefers_reference"] == pytest.approx(share, abs=1e-9), (q, kind)
        assert spots["doubled"]["prefers_reference"] == pytest.approx(report[q]["prefers_reference_over"]["run_on_copy"])
