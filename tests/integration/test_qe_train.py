import copy
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from qeebm.errors import QeebmError
from qeebm.qe.models import load_qe, qe_kind
from qeebm.qe.scoring import QEScorer
from qeebm.qe.tiny import fit_tiny_quality_estimators, pearson, rankdata, spearman
from qeebm.qe.train import save_qe, torch_threads, train_qe

from support.qe import (
    fresh,
    load_tiny,
    predict,
    toy_quality_triples,
    world_pairs,
    world_quality_triples,
    world_tokenizer_dir,
)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # Tiny models: one thread is as fast, and two collapse when other jobs share the cores.
    with torch_threads(1):
        yield


def _toy(n=96):
    src, mt, ref, q = zip(*toy_quality_triples(n, seed=3))
    return list(src), list(mt), list(ref), list(q)


def _mse(model, src, mt, ref, q):
    s = QEScorer(model, cache=False).score(src, mt, ref)
    return float(np.mean((np.array(s) - np.array(q)) ** 2))


def _group(name: str) -> str:
    if name.startswith("encoder.model.embeddings."):
        return "embeddings"
    if name.startswith("encoder.model.encoder.layer."):
        rest = name.split(".", 5)[5]  # e.g. attention.self.query.weight
        return "encoder:" + rest
    return name.split(".")[0]


EXPECTED = {
    "head": {"estimator", "layerwise_attention"},
    "full": {"estimator", "layerwise_attention", "encoder:*"},
    "lora": {"estimator", "layerwise_attention", "encoder:attention.self.query.weight",
             "encoder:attention.self.value.weight"},
}


@pytest.mark.parametrize("mode", ["head", "full", "lora"])
@pytest.mark.parametrize("kind", ["kiwi", "comet"])
def test_train_modes_touch_exactly_their_parameters_and_fit(kind, mode):
    model = fresh(kind)
    src, mt, ref, q = _toy()
    ref = ref if kind == "comet" else None
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    mse0 = _mse(model, src, mt, ref, q)
    train_qe(model, src, mt, q, ref=ref, mode=mode, epochs=3, lr=3e-3, batch_size=16, seed=0)
    after = dict(model.named_parameters())
    assert set(after) == set(before)  # LoRA merged back: a plain comet model again
    assert {n: p.requires_grad for n, p in after.items()} == flags
    assert not model.training
    changed = {_group(n) for n, p in after.items() if not torch.equal(p, before[n])}
    want = EXPECTED[mode]
    if "encoder:*" in want:
        assert "embeddings" not in changed  # keep_embeddings_frozen, as comet's own training
        assert {g for g in changed if g.startswith("encoder:")} == \
            {g for g in map(_group, before) if g.startswith("encoder:")}
        assert changed - {"embeddings"} - {g for g in changed if g.startswith("encoder:")} == \
            want - {"encoder:*"}
    else:
        assert changed == want
    assert _mse(model, src, mt, ref, q) < 0.7 * mse0


def test_full_mode_can_train_embeddings():
    model = fresh("kiwi")
    emb = model.encoder.model.embeddings.word_embeddings.weight.detach().clone()
    src, mt, _, q = _toy(32)
    train_qe(model, src, mt, q, mode="full", epochs=1, lr=1e-3, batch_size=16, train_embeddings=True)
    assert not torch.equal(model.encoder.model.embeddings.word_embeddings.weight, emb)


def test_training_is_reproducible_and_leaves_the_global_rng_alone():
    src, mt, _, q = _toy(32)
    torch.manual_seed(123)
    a = train_qe(fresh("kiwi"), src, mt, q, mode="full", epochs=1, lr=1e-3, seed=5)
    draw = torch.rand(1)
    torch.manual_seed(123)
    b = train_qe(fresh("kiwi"), src, mt, q, mode="full", epochs=1, lr=1e-3, seed=5)
    assert torch.equal(draw, torch.rand(1))
    for (n, p), r in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(p, r), n


def test_train_qe_input_errors():
    with pytest.raises(QeebmError, match="mode"):
        train_qe(load_tiny("kiwi"), ["a"], ["b"], [0.5], mode="adapters")
    with pytest.raises(QeebmError, match="ref"):
        train_qe(load_tiny("comet"), ["a"], ["b"], [0.5])
    with pytest.raises(QeebmError, match="length"):
        train_qe(load_tiny("kiwi"), ["a", "b"], ["b"], [0.5])


def test_saved_lora_model_loads_in_comet_and_comet_score(tmp_path):
    import comet

    model = fresh("kiwi")
    src, mt, _, q = _toy(48)
    train_qe(model, src, mt, q, mode="lora", epochs=1, lr=3e-3, batch_size=16)
    ours = QEScorer(model).score(src, mt)
    out = save_qe(model, tmp_path / "trained")
    ckpt = out / "checkpoints" / "model.ckpt"
    theirs = comet.load_from_checkpoint(str(ckpt))
    assert max(abs(a - b) for a, b in zip(predict(theirs, src, mt), ours)) < 1e-5
    assert QEScorer(load_qe(str(out))).score(src, mt) == pytest.approx(ours, abs=1e-6)

    # comet's CLI, from another working directory. It casts the model to fp16 (model.half()), so
    # it must equal our scorer on a half-precision copy, and fp32 to fp16 precision.
    work = tmp_path / "cwd"
    work.mkdir()
    (work / "src.txt").write_text("\n".join(src[:8]) + "\n")
    (work / "mt.txt").write_text("\n".join(mt[:8]) + "\n")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    cli = os.path.join(os.path.dirname(sys.executable), "comet-score")
    run = subprocess.run([cli, "-s", "src.txt", "-t", "mt.txt", "--model", str(ckpt), "--gpus", "0",
                          "--quiet", "--to_json", "out.json"], cwd=work, env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    cli_scores = [row["COMET"] for row in json.loads((work / "out.json").read_text())["mt.txt"]]
    half = QEScorer(copy.deepcopy(model).half()).score(src[:8], mt[:8])
    assert cli_scores == pytest.approx(half, abs=1e-6)
    assert cli_scores == pytest.approx(ours[:8], abs=5e-3)


# ----------------------------------------------------------------------------------- correlations
def test_pearson_by_hand():
    # x = 1,2,3,4; y = 2,4,5,9: dx = -1.5,-.5,.5,1.5; dy = -3,-1,0,4
    # sum dx*dy = 4.5+.5+0+6 = 11; sum dx^2 = 5; sum dy^2 = 9+1+0+16 = 26; r = 11/sqrt(130)
    assert pearson([1, 2, 3, 4], [2, 4, 5, 9]) == pytest.approx(11 / math.sqrt(130))
    assert pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(pearson([1, 1, 1], [1, 2, 3]))


def test_spearman_by_hand_with_ties():
    assert list(rankdata([10, 20, 20, 5])) == [2.0, 3.5, 3.5, 1.0]
    # monotone but not linear: rho 1, r < 1
    assert spearman([1, 2, 3, 4], [1, 8, 27, 64]) == pytest.approx(1.0)
    # x ranks 1,2,3,4; y = 1,3,2,4 ranks 1,3,2,4: d^2 = 0,1,1,0; rho = 1 - 6*2/(4*15) = 0.8
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    # ties: y ranks 1.5,1.5,3,4 against 1,2,3,4 -> Pearson of the ranks
    expected = pearson([1, 2, 3, 4], [1.5, 1.5, 3, 4])
    assert spearman([1, 2, 3, 4], [7, 7, 8, 9]) == pytest.approx(expected)


# ------------------------------------------------------------------------------ tiny-world build
@pytest.mark.slow
def test_fit_tiny_quality_estimators_small(tmp_path):
    pairs = world_pairs()
    train = world_quality_triples(pairs[:200], seed=0)
    heldout = world_quality_triples(pairs[1000:1200], seed=1)
    report = fit_tiny_quality_estimators(tmp_path / "qe", world_tokenizer_dir(), train, heldout, seed=3,
                                         fit={"epochs": 3, "lr": 3e-3})
    assert set(report) == {"kiwi", "comet", "judge"}
    on_disk = json.loads((tmp_path / "qe" / "qe_report.json").read_text())
    assert set(on_disk) == set(report) and "seconds" not in on_disk["kiwi"]
    assert on_disk["kiwi"]["pearson"] == report["kiwi"]["pearson"]
    assert report["judge"]["shape"] != report["kiwi"]["shape"]
    assert report["judge"]["seed"] != report["kiwi"]["seed"]
    # ~700 rows, 3 epochs: far from the full build's numbers (kiwi ~0.9 / 0.7 on 15k rows), but
    # the reference-free QE already beats chance and the reference-based one is strong.
    assert report["kiwi"]["pearson"] > 0.2 and report["kiwi"]["spearman"] > 0.2
    assert report["comet"]["pearson"] > 0.6 and report["comet"]["spearman"] > 0.5
    assert all(math.isfinite(r["pearson"]) for r in report.values())
    kinds = {name: qe_kind(load_qe(r["path"])) for name, r in report.items()}
    assert kinds == {"kiwi": "kiwi", "comet": "comet", "judge": "kiwi"}
