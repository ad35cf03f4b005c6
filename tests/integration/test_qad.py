"""Quality-aware decoding (qeebm/translation/qad.py, ``--rerank`` / ``--mbr``): chrF++ utilities equal to
sacrebleu's, MBR and reranking pick what a hand computation picks, one candidate is plain decoding,
the QE scores are ``qeebm score``'s, and the report names the selection and keeps it out of the
held-out judges."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from sacrebleu.metrics import CHRF

from qeebm.cli import main
from qeebm.config import GenerationConfig, ModelConfig, dump_config, load_config
from qeebm.errors import QeebmError
from qeebm.evaluation.report import read_report
from qeebm.translation.decoding import decode_test
from qeebm.translation.qad import (
    ChrfUtility,
    Selection,
    chrf_matrix,
    decode_and_select,
    generate_candidates,
    mbr,
    rerank,
)
from qeebm.translation.translator import Translator

SMALL = GenerationConfig(num_beams=2, max_new_tokens=16, batch_size=8)


def test_chrf_matrix_equals_sacrebleu_sentence_chrf():
    chrf = CHRF(word_order=2)
    rnd = random.Random(0)
    words = ["муур", "нохой", "гол", "хот.", "(ном)", "a", "b,", "ab", "!", "x-y"]
    texts = [" ".join(rnd.choices(words, k=rnd.randint(1, 6))) for _ in range(9)]
    texts += ["", ".", "a", texts[2]]  # empty, punctuation only, one character, a repeat
    got = chrf_matrix(chrf, texts)
    want = np.array([[chrf.sentence_score(h, [r]).score for r in texts] for h in texts])
    assert np.array_equal(got, want)


def test_mbr_with_chrf_picks_the_hand_computed_consensus():
    # chrF++ (beta 2; character n-grams without spaces, orders 1-6; word orders 1-2), averaged over the
    # orders where hypothesis and reference both have n-grams. With A=abd, B=abc, C=abce (X shares nothing):
    #   U(A,B) = U(B,A): chars 1: P=R=2/3; 2: 1/2; 3: 0; words 1: 0 -> P=R=7/24 -> F = 7/24 = 29.17
    #   U(A,C): P=(2/3+1/2)/4=7/24, R=(1/2+1/3)/4=5/24 -> F=5PR/(4P+R) = 22.10;  U(C,A) (P, R swapped) = 27.01
    #   U(B,C): P=(1+1+1)/4=3/4, R=(3/4+2/3+1/2)/4=23/48 -> 51.65;  U(C,B) = 67.38
    # Expected utilities (itself 100, X 0): X 25, A 37.82, B 45.20, C 48.60 -> C, the last candidate.
    cands = ["xyz", "abd", "abc", "abce"]
    choice = mbr(ChrfUtility(), ["src"], [cands])
    assert choice.index == [3] and choice.hyps == ["abce"]
    f = lambda p, r: 100 * 5 * p * r / (4 * p + r)  # noqa: E731
    want = [25.0, (100 + 100 * 7 / 24 + f(7 / 24, 5 / 24)) / 4, (100 + 100 * 7 / 24 + f(3 / 4, 23 / 48)) / 4,
            (100 + f(5 / 24, 7 / 24) + f(23 / 48, 3 / 4)) / 4]
    assert choice.scores[0] == pytest.approx(want, abs=1e-9)
    assert [round(x, 2) for x in want] == [25.0, 37.82, 45.2, 48.6]


def test_mbr_over_identical_candidates_returns_that_candidate():
    choice = mbr(ChrfUtility(), ["s", "t"], [["same text"] * 4, ["другой"] * 3])
    assert choice.hyps == ["same text", "другой"] and choice.index == [0, 0] and choice.changed == 0.0


class StubScorer:
    kind = "kiwi"

    def __init__(self, table):
        self.table, self.calls = table, []

    def score(self, src, mt):
        self.calls.append(len(mt))
        return [self.table[m] for m in mt]


def test_rerank_returns_the_highest_qe_score_ties_to_the_earlier():
    scorer = StubScorer({"a": 0.1, "b": 0.7, "c": 0.3, "d": 0.5, "e": 0.5})
    choice = rerank(scorer, ["s1", "s2"], [["a", "b", "c"], ["d", "e"]])
    assert choice.hyps == ["b", "d"] and choice.index == [1, 0]
    assert choice.scores == [[0.1, 0.7, 0.3], [0.5, 0.5]]
    assert scorer.calls == [5]  # every candidate of every source in one call
    # the same through Selection.selector with the scorer handed in
    select = Selection("rerank", model="stub", candidates=3).selector(scorer=scorer)
    assert select(["s1"], [["c", "a", "b"]]).hyps == ["b"]


@pytest.fixture(scope="module")
def base(micro_world):
    return Translator.load(ModelConfig(name_or_path=str(micro_world / "nllb-base")))


@pytest.fixture(scope="module")
def sources(micro_world) -> list[str]:
    lines = (micro_world / "data" / "test.tsv").read_text(encoding="utf-8").splitlines()[1:]
    return [line.split("\t")[0] for line in lines[:6]]


@pytest.mark.parametrize("selection", [Selection("rerank", "KIWI", candidates=1),
                                       Selection("mbr", None, candidates=1),
                                       Selection("mbr", None, candidates=1, mode="sample")])
def test_one_candidate_is_plain_decoding(base, sources, micro_world, selection):
    if selection.model == "KIWI":
        selection.model = str(micro_world / "qe" / "kiwi")
    gen = SMALL if selection.mode == "beam" else GenerationConfig(do_sample=True, num_beams=1, max_new_tokens=16)
    torch.manual_seed(3)
    plain = decode_test(base, sources, gen)
    torch.manual_seed(3)
    hyps, record = decode_and_select(lambda: base, sources, gen, selection)
    assert hyps == plain
    assert record["changed"] == 0.0 and record["candidates"] == 1


def test_rerank_on_the_tiny_world_keeps_qeebm_scores_argmax(micro_world, sources, base, tmp_path, capsys):
    kiwi = micro_world / "qe" / "kiwi"
    src_file = tmp_path / "src.txt"
    src_file.write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    out = tmp_path / "hyp.txt"
    assert main(["translate", "--model", str(micro_world / "nllb-base"), "-i", str(src_file), "-o", str(out),
                 "--beams", "2", "--max-new-tokens", "16", "--rerank", str(kiwi), "--candidates", "4"]) == 0
    chosen = out.read_text(encoding="utf-8").splitlines()
    # The same candidates, scored by `qeebm score`
    cands = generate_candidates(base, sources, Selection("rerank", str(kiwi), 4).generation(SMALL), 4)
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"{s}\t{h}\n" for s, c in zip(sources, cands) for h in c), encoding="utf-8")
    assert main(["score", "--model", str(kiwi), "-i", str(pairs), "-o", str(tmp_path / "scores.txt")]) == 0
    scores = np.array([float(x) for x in (tmp_path / "scores.txt").read_text().split()]).reshape(len(sources), 4)
    assert chosen == [c[int(np.argmax(row))] for c, row in zip(cands, scores)]
    assert any(int(np.argmax(row)) != 0 for row in scores)  # reranking changed something
    # the selection's own scores are those numbers (`qeebm score` writes 6 decimals)
    choice = Selection("rerank", str(kiwi), 4).selector()(sources, cands)
    assert np.abs(np.array(choice.scores) - scores).max() < 1e-6


@pytest.fixture(scope="module")
def sft_run(micro_world, tmp_path_factory) -> Path:
    """A run directory faking an SFT run (config.yaml + best/ = the micro world's base)."""
    run = tmp_path_factory.mktemp("qad-run") / "sft"
    cfg = load_config(None, ["method=sft", "seed=5", f"data.test.path={micro_world / 'data' / 'test.tsv'}"])
    run.mkdir()
    (run / "config.yaml").write_text(dump_config(cfg), encoding="utf-8")
    shutil.copytree(micro_world / "nllb-base", run / "best")
    return run


def evaluate(world, run, *options) -> dict:
    assert main(["evaluate", "--tinyworld", str(world), "--run", str(run), "--beams", "2", "--max-new-tokens", "16",
                 "--metrics", "bleu,chrf,comet,kiwi,judges", *options]) == 0
    return read_report(run / "eval" / f"test-{'rerank' if '--rerank' in options else 'mbr'}.json")


def test_reports_name_the_selection_and_keep_its_qe_out_of_the_judges(micro_world, sft_run, capsys):
    rer = evaluate(micro_world, sft_run, "--rerank", "--candidates", "3")
    assert rer["system"] == "sft+rerank" and rer["trained_on"] is None
    assert rer["selected_on"] == "kiwi" and rer["heldout"] == ["comet", "judge"]
    assert rer["signatures"]["selection"] == (f"rule:rerank|qe:{micro_world / 'qe' / 'kiwi'}|candidates:3|gen:beam3"
                                              "|max_new:16")
    assert rer["selection"]["signature"] == rer["signatures"]["selection"] and rer["decoding"]["num_beams"] == 3
    assert rer["selection"]["ms_per_segment"] > 0 and set(rer["selection"]["seconds"]) == {"generate", "select"}
    assert (sft_run / "eval" / "test-rerank.hyp.txt").read_text(encoding="utf-8").splitlines() == rer["segments"]["hyp"]
    assert '"cost"' in capsys.readouterr().out

    chrf = evaluate(micro_world, sft_run, "--mbr", "--candidates", "3", "--sample", "--epsilon", "0.02")
    assert chrf["system"] == "sft+mbr" and chrf["selected_on"] is None and chrf["heldout"] == ["comet", "kiwi", "judge"]
    sig = chrf["signatures"]["selection"]
    assert sig.startswith("rule:mbr|utility:chrf[nrefs:1|case:mixed|eff:yes|nc:6|nw:2|space:no|version:")
    assert sig.endswith("|candidates:3|gen:sample|t:1.0|top_k:0|top_p:1.0|eps:0.02|max_new:16")
    assert chrf["decoding"]["do_sample"] and chrf["decoding"]["epsilon"] == 0.02

    comet = evaluate(micro_world, sft_run, "--mbr", "comet", "--candidates", "2")
    assert comet["selected_on"] == "comet" and comet["heldout"] == ["kiwi", "judge"]
    assert f"utility:comet[{micro_world / 'qe' / 'comet'}]" in comet["signatures"]["selection"]


@pytest.mark.parametrize("options, message", [
    (["--rerank", "--mbr"], "give --rerank or --mbr, not both"),
    (["--candidates", "4"], "--candidates needs a selection rule"),
    (["--rerank", "--candidates", "0"], "--candidates must be at least 1"),
    (["--rerank", "comet"], "--rerank needs a reference-free QE"),
    (["--mbr", "kiwi"], "--mbr needs a utility that reads a reference"),
])
def test_selection_mistakes_are_one_line_errors(micro_world, sft_run, options, message, capsys):
    code = main(["evaluate", "--tinyworld", str(micro_world), "--run", str(sft_run), "--beams", "1",
                 "--max-new-tokens", "4", "--metrics", "bleu", *options])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_hypotheses_cannot_be_reranked(micro_world, tmp_path, capsys):
    hyps = tmp_path / "h.txt"
    hyps.write_text("x\n")
    code = main(["evaluate", "--tinyworld", str(micro_world), "--hyps", str(hyps), "--rerank"])
    assert code == 2 and "give --model or --run, not --hyps" in capsys.readouterr().err
    with pytest.raises(QeebmError, match="reranking needs a QE model"):
        Selection("rerank").check()
