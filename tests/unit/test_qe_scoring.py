import json
import logging
import random

import pytest
import torch

from qeebm.errors import QeebmError
from qeebm.qe.packed import packable, packed_scores
from qeebm.qe.scoring import QEScorer, read_segments, score_file
from qeebm.qe.train import torch_threads

from support.qe import fresh, load_tiny, model_dir, predict, sentence, toy_triples


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # Tiny models: one thread is as fast, and two collapse when other jobs share the cores.
    with torch_threads(1):
        yield


def _inputs(n=40, seed=0):
    """Unsorted lengths, repeated pairs (as K samples of one source give), an empty mt and one
    source far beyond the encoder's 256 positions (truncated by comet's own prepare_sample)."""
    src, mt, ref = toy_triples(n, seed)
    rng = random.Random(seed)
    src[1] = " ".join(sentence(rng, 12, 12) for _ in range(40))
    mt[2] = ""
    mt[3] = " ".join(sentence(rng, 12, 12) for _ in range(40))
    mt[4] = mt[4] + " <pad> ka"  # comet drops a literal <pad> token when it concatenates segments
    dup = [0, 5, 5, 7, 0]
    return src + [src[i] for i in dup], mt + [mt[i] for i in dup], ref + [ref[i] for i in dup], len(dup)


@pytest.mark.parametrize("kind", ["kiwi", "comet", "xcomet"])
def test_scorer_equals_comet_predict(kind):
    model = load_tiny(kind)
    src, mt, ref, n_dup = _inputs()
    use_ref = None if kind == "kiwi" else ref
    expected = predict(model, src, mt, use_ref)
    scorer = QEScorer(model, batch_size=8)
    got = scorer.score(src, mt, use_ref)
    assert len(got) == len(expected)
    assert max(abs(a - b) for a, b in zip(got, expected)) < 1e-5
    assert (scorer.hits, scorer.misses) == (n_dup, len(src) - n_dup)
    # second call: everything from the cache, same numbers
    assert scorer.score(src, mt, use_ref) == got
    assert scorer.hits == n_dup + len(src)
    assert len(set(got)) > len(got) // 2  # the tiny QE does tell inputs apart


def test_truncation_matches_comet():
    model = load_tiny("kiwi")
    src, mt, _, _ = _inputs()
    enc = model.encoder
    assert len(enc.tokenizer(src[1])["input_ids"]) > enc.max_positions
    # the over-long pair scores like its truncation: same score whatever follows position 256
    longer = QEScorer(model).score([src[1] + " ka to mi"], [mt[1]])
    assert abs(longer[0] - QEScorer(model).score([src[1]], [mt[1]])[0]) < 1e-6


def test_fast_kiwi_path_equals_comets_own_batching():
    scorer = QEScorer(load_tiny("kiwi"), cache=False)
    src, mt, _, _ = _inputs()
    items = [(s, m, None) for s, m in zip(src, mt)]
    with torch.inference_mode():
        fast, generic = scorer._score_kiwi(items), scorer._score_unified(items)
    assert max(abs(a - b) for a, b in zip(fast, generic)) < 1e-6


def _kiwi_batch(model):
    """One padded batch of very different lengths (the truncated 256-token row included)."""
    scorer = QEScorer(model, cache=False)
    src, mt, _, _ = _inputs()
    rows = []
    scorer._padded = lambda r: rows.extend(r) or QEScorer._padded(scorer, r)
    with torch.inference_mode():
        scorer._score_kiwi([(s, m, None) for s, m in zip(src, mt)])
    return QEScorer._padded(scorer, rows)


@pytest.mark.parametrize("sentence_layer", ["mix", 1])
def test_packed_forward_equals_comets_forward(sentence_layer):
    model = fresh("kiwi")
    if sentence_layer != "mix":  # a CometKiwi that reads one layer instead of mixing them
        model.layerwise_attention, model.hparams.sent_layer = None, sentence_layer
    assert packable(model)
    ids, mask = _kiwi_batch(model)
    assert mask.sum() < 0.5 * mask.numel()  # most of the padded batch is padding
    with torch.inference_mode():
        expected = model.forward(input_ids=ids, attention_mask=mask).score
        got = packed_scores(model, ids, mask)
    assert got.shape == expected.shape
    assert (got - expected).abs().max() < 1e-6


def test_unpackable_encoders_take_comets_forward():
    model = fresh("kiwi")
    model.layerwise_attention.layer_norm = True  # the mix then normalises over every position
    assert not packable(model)
    src, mt, _, _ = _inputs(12)
    got = QEScorer(model, batch_size=4).score(src, mt)
    assert max(abs(a - b) for a, b in zip(got, predict(model, src, mt))) < 1e-5


@pytest.mark.parametrize("seed", range(5))
def test_batches_respect_both_caps(seed):
    rng = random.Random(seed)
    lengths = [rng.choice([1, 3, 7, 30, 200]) + rng.randint(0, 5) for _ in range(rng.randint(1, 60))]
    scorer = QEScorer(load_tiny("kiwi"), batch_size=rng.randint(1, 9))
    max_tokens = rng.choice([16, 64, 256])
    batches = scorer._batches(lengths, lambda n: n, max_tokens)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(lengths)))  # every item exactly once
    assert [lengths[i] for i in flat] == sorted(lengths)
    for b in batches:
        assert len(b) <= scorer.batch_size
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= max_tokens
    # greedy: the next item would have broken a cap
    for b, nxt in zip(batches, batches[1:]):
        assert len(b) == scorer.batch_size or (len(b) + 1) * lengths[nxt[0]] > max_tokens


def test_xcomet_without_reference_matches_predict():
    model = load_tiny("xcomet")
    src, mt, _, _ = _inputs(12)
    got = QEScorer(model).score(src, mt)
    assert max(abs(a - b) for a, b in zip(got, predict(model, src, mt))) < 1e-5


def test_kiwi_ignores_references_in_the_cache_key():
    scorer = QEScorer(load_tiny("kiwi"))
    a = scorer.score(["ka to"], ["mi ra"], ["x"])
    b = scorer.score(["ka to"], ["mi ra"], ["y"])
    assert a == b and scorer.hits == 1


def test_cache_off_and_training_mode_restored():
    model = load_tiny("kiwi")
    model.estimator.train()
    try:
        scorer = QEScorer(model, cache=False)
        s1 = scorer.score(["ka to", "ka to"], ["mi", "mi"])
        assert s1[0] == s1[1] and scorer.hits == 1
        scorer.score(["ka to"], ["mi"])
        assert scorer.misses == 2  # nothing kept between calls
        assert model.estimator.training and not model.encoder.training
    finally:
        model.eval()


def test_errors_and_empty_input():
    with pytest.raises(QeebmError, match="max_tokens must be positive"):
        QEScorer(load_tiny("kiwi"), max_tokens=0)
    scorer = QEScorer(load_tiny("comet"))
    assert scorer.score([], [], []) == []
    with pytest.raises(QeebmError, match="references"):
        scorer.score(["a"], ["b"])
    with pytest.raises(QeebmError, match="length"):
        scorer.score(["a", "b"], ["b"], ["c"])


def test_score_file_tsv_and_jsonl(tmp_path, caplog):
    src, mt, ref = toy_triples(7)
    tsv = tmp_path / "in.tsv"
    tsv.write_text("src\tmt\tref\n" + "".join(f"{s}\t{m}\t{r}\n" for s, m, r in zip(src, mt, ref)))
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text("".join(json.dumps({"src": s, "mt": m}) + "\n" for s, m in zip(src, mt)))
    assert read_segments(tsv) == (src, mt, ref)
    assert read_segments(jsonl) == (src, mt, None)
    with caplog.at_level(logging.INFO, logger="qeebm.qe.scoring"):
        mean = score_file(str(model_dir("comet")), tsv, tmp_path / "out.txt", batch_size=4)
    lines = (tmp_path / "out.txt").read_text().splitlines()
    expected = predict(load_tiny("comet"), src, mt, ref)
    assert len(lines) == 7 and max(abs(float(a) - b) for a, b in zip(lines, expected)) < 1e-5
    assert abs(mean - sum(expected) / 7) < 1e-5
    assert "system score" in caplog.text
    score_file(str(model_dir("kiwi")), jsonl, tmp_path / "k.txt")
    assert len((tmp_path / "k.txt").read_text().splitlines()) == 7


def test_score_file_bad_input(tmp_path):
    bad = tmp_path / "bad.tsv"
    bad.write_text("a\tb\nonly-one-column\n")
    with pytest.raises(QeebmError, match="bad.tsv:2"):
        read_segments(bad)
    with pytest.raises(QeebmError, match="no such file"):
        read_segments(tmp_path / "missing.tsv")
