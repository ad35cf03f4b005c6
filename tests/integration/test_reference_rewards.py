"""What a reference-based energy or reward reads: a source-only pool with a reference column
(``data.mono`` as a two-column file), the sentence chrF++ reward (``qe.path: chrf``), and REINFORCE,
PPO and QE-EBM trained against a reference-based COMET on it."""

from __future__ import annotations

import random

import pytest
import torch
from accelerate.utils import set_seed
from sacrebleu.metrics import CHRF

from qeebm.data.corpus import write_lines, write_tsv
from qeebm.errors import QeebmError
from qeebm.methods import METHODS, common
from qeebm.training.loop import count_label_tokens, load_data, load_mono, make_batch, train
from qeebm.translation.qad import ChrfScorer
from qeebm.translation.translator import Translator

from support.runs import make_config, read_metrics, write_tiny_world
from support.tiny import tiny_texts, tokenizer_dir

SMALL = {"reinforce": ["reinforce.sampling.num_samples=2", "reinforce.sampling.max_new_tokens=8"],
         "ppo": ["ppo.sampling.max_new_tokens=8", "ppo.minibatches=2"],
         "qe-ebm": ["qe_ebm.sampling.num_samples=2", "qe_ebm.sampling.max_new_tokens=8", "qe_ebm.energy_weight=1.0",
                    "qe_ebm.energy_ramp_steps=0"]}


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    from qeebm.qe.tiny import build_tiny_comet, build_tiny_kiwi

    root = tmp_path_factory.mktemp("refworld")
    base = write_tiny_world(root)
    texts = tiny_texts(64, seed=5)
    write_tsv(root / "mono_ref.tsv", texts[0::2], texts[1::2])
    write_lines(root / "mono.txt", texts[0::2])
    return {"base": base, "pool": root / "mono_ref.tsv", "plain": root / "mono.txt", "src": texts[0::2],
            "ref": texts[1::2], "comet": build_tiny_comet(root / "comet", tokenizer_dir("xlmr")),
            "kiwi": build_tiny_kiwi(root / "kiwi", tokenizer_dir("xlmr"))}


def test_chrf_scorer_is_sacrebleu_sentence_chrf():
    rng = random.Random(0)
    words = "муур нохой the cat 12 харж , . том жижиг".split()
    hyps = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 8))) for _ in range(60)]
    refs = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 8))) for _ in range(60)]
    hyps[0], refs[0] = refs[0], refs[0]  # identical
    hyps[1] = ""  # empty hypothesis
    refs[2] = "."  # a reference without word n-grams of order 2
    chrf = CHRF(word_order=2)
    want = [chrf.sentence_score(h, [r]).score / 100 for h, r in zip(hyps, refs)]
    scorer = ChrfScorer()
    got = scorer.score(["src"] * 60, hyps, refs)
    assert got == pytest.approx(want, abs=1e-12)
    assert got[0] == 1.0 and got[1] == 0.0
    assert scorer.score(["s"], [hyps[3]], [refs[3]]) == got[3:4]  # from the n-gram cache, the same
    with pytest.raises(QeebmError, match="reads a reference"):
        scorer.score(["s"], ["h"])


def test_pool_with_references_is_read_and_filtered_alike(world, tmp_path):
    cfg = make_config(world["base"], tmp_path, "method=reinforce", f"data.mono.path={world['pool']}", "qe.path=chrf")
    tr = Translator.load(cfg.model)
    pool = load_mono(cfg, tr, need_reference=True)
    # Every kept sentence keeps its own reference; a pair is dropped when either side is too long.
    too_long = [tr.num_tokens([s], "src")[0] > 50 or tr.num_tokens([t], "tgt")[0] > 50
                for s, t in zip(world["src"], world["ref"])]
    kept = [(s, t) for (s, t), bad in zip(zip(world["src"], world["ref"]), too_long) if not bad]
    assert list(zip(pool.src, pool.tgt)) == kept and 0 < len(kept) < len(world["src"])
    # Without a reference-based reader the same file is a plain pool.
    assert load_mono(cfg, tr).tgt is None


def test_pool_without_references_is_a_one_line_error(world, tmp_path):
    plain = make_config(world["base"], tmp_path, "method=reinforce", f"data.mono.path={world['plain']}", "qe.path=chrf")
    tr = Translator.load(plain.model)
    with pytest.raises(QeebmError, match=r"mono\.txt: qe\.path chrf reads the reference .* columns 'src' and 'tgt'"):
        load_mono(plain, tr, need_reference=True)
    one_column = tmp_path / "src_only.tsv"
    one_column.write_text("src\n" + "\n".join(world["src"]) + "\n", encoding="utf-8")
    cfg = make_config(world["base"], tmp_path, "method=reinforce", f"data.mono.path={one_column}", "qe.path=chrf")
    with pytest.raises(QeebmError, match=r"src_only\.tsv:1: no column 'tgt'"):
        load_mono(cfg, tr, need_reference=True)


def build(cfg):
    set_seed(cfg.seed)
    tr = Translator.load(cfg.model)
    method = METHODS[cfg.method](cfg, tr, tr.model)
    train_set, _ = load_data(cfg, tr)
    pool = load_mono(cfg, tr, method.needs_reference)
    idx = list(range(4))
    batch = make_batch(tr, train_set, idx, count_label_tokens(tr, train_set, idx), len(idx), tr.device, step=1)
    batch.mono, batch.global_mono = pool.src[:4], 4
    batch.mono_ref = pool.tgt[:4] if pool.tgt is not None else None
    return tr, method, batch


def test_reinforce_with_the_chrf_reward_scores_samples_against_their_references(world, tmp_path):
    cfg = make_config(world["base"], tmp_path, "method=reinforce", f"data.mono.path={world['pool']}",
                      "qe.path=chrf", *SMALL["reinforce"])
    tr, method, batch = build(cfg)
    assert method.needs_reference
    rollout = method.rollout(batch)
    chrf = CHRF(word_order=2)
    want = [chrf.sentence_score(h, [r]).score / 100 for h, r in
            zip(rollout.samples.hyps, [r for r in world["ref"][:4] for _ in range(2)])]
    assert rollout.scores.flatten().tolist() == pytest.approx(want, abs=1e-6)


@pytest.mark.parametrize("method", ["reinforce", "ppo", "qe-ebm"])
def test_trains_against_a_reference_based_comet(world, tmp_path, method):
    """Two steps against the tiny COMET reading the pool's references: the run goes through the
    loop, the reward (or energy) is the COMET score against the reference, and the weights move."""
    cfg = make_config(world["base"], tmp_path / method, f"method={method}", f"data.mono.path={world['pool']}",
                      f"qe.path={world['comet']}", "optim.max_steps=2", *SMALL[method])
    tr, m, batch = build(cfg)
    assert m.needs_reference
    from qeebm.qe.models import load_qe

    from support.qe import predict

    comet = load_qe(str(world["comet"]))
    if method == "qe-ebm":
        r = m.rollout(batch)
        assert r.ref == [x for x in world["ref"][:4] for _ in range(2)]
        scores = m.energy.score_ids(r.src, r.mt_ids, r.mt_mask, ref=r.ref)
        assert scores.tolist() == pytest.approx(predict(comet, r.src, r.alignment.texts, r.ref), abs=1e-5)
    else:
        r = m.rollout(batch)
        k = 2 if method == "reinforce" else 1
        hyps = r.samples.hyps
        refs = [x for x in world["ref"][:4] for _ in range(k)]
        scores = r.scores if method == "reinforce" else r.qe
        assert scores.flatten().tolist() == pytest.approx(predict(comet, r.samples.src, hyps, refs), abs=1e-5)
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    train(cfg)
    assert len(read_metrics(tmp_path / method)) == 2
    from support.runs import final_weights

    after = final_weights(tmp_path / method)
    assert any(not torch.equal(before[n], after[n]) for n in before if n in after)


def test_qe_ebm_refuses_the_chrf_reward(world, tmp_path):
    cfg = make_config(world["base"], tmp_path, "method=qe-ebm", f"data.mono.path={world['pool']}", "qe.path=chrf")
    with pytest.raises(QeebmError, match="without a gradient"):
        METHODS["qe-ebm"].check_config(cfg)


def test_a_reference_free_reward_never_reads_references(world, tmp_path, monkeypatch):
    seen = []

    class Toy:
        def score(self, src, mt, *rest):
            seen.append(rest)
            return [0.5] * len(mt)

    monkeypatch.setattr(common, "build_scorer", lambda cfg, device: Toy())
    cfg = make_config(world["base"], tmp_path, "method=reinforce", f"data.mono.path={world['pool']}",
                      f"qe.path={world['kiwi']}", *SMALL["reinforce"])
    tr, method, batch = build(cfg)
    assert not method.needs_reference and batch.mono_ref is None
    method.rollout(batch)
    assert seen == [()]
