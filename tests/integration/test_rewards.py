"""Composite rewards (``reward.terms``): the weighted sum of named QEs and metrics, each term logged as
``reward/<name>``, used alike by REINFORCE, PPO, GRPO, DPO/CPO's ranking and QE finetuning's
selection; recorded in the evaluation report, where compare's reward-hacking check counts every term
as a training QE; and the one-line config errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from accelerate.utils import set_seed

from qeebm.data.corpus import write_lines, write_tsv
from qeebm.errors import QeebmError
from qeebm.evaluation.report import FORMAT, validate_report
from qeebm.methods import METHODS, common
from qeebm.training.loop import count_label_tokens, load_data, load_mono, make_batch, train
from qeebm.translation.qad import ChrfScorer

from support.qe import comet_dir, kiwi_dir
from support.runs import make_config, read_metrics, write_tiny_world
from support.tiny import tiny_texts

SMALL = {"reinforce": ["reinforce.sampling.num_samples=2", "reinforce.sampling.max_new_tokens=8"],
         "grpo": ["grpo.sampling.num_samples=2", "grpo.sampling.max_new_tokens=8"],
         "ppo": ["ppo.sampling.max_new_tokens=8", "ppo.minibatches=2"],
         "dpo": ["preference.num_candidates=3", "preference.max_new_tokens=8", "preference.candidates=beam",
                 "preference.guards=false"],
         "qe-finetune": ["qe_finetune.num_candidates=3", "qe_finetune.max_new_tokens=8"]}


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("rewardworld")
    base = write_tiny_world(root)
    texts = tiny_texts(64, seed=5)
    write_tsv(root / "mono_ref.tsv", texts[0::2], texts[1::2])
    write_lines(root / "mono.txt", texts[0::2])
    return {"base": base, "pool": root / "mono_ref.tsv", "plain": root / "mono.txt", "src": texts[0::2],
            "ref": texts[1::2], "kiwi": kiwi_dir(), "comet": comet_dir()}


def terms(*items: tuple[str, object, float]) -> str:
    return "reward.terms=[" + ", ".join(f"{{name: {n}, path: '{p}', weight: {w}}}" for n, p, w in items) + "]"


def config(world, tmp_path, method: str, *overrides: str, pool: str = "pool"):
    return make_config(world["base"], tmp_path, f"method={method}", f"data.mono.path={world[pool]}",
                       f"qe.path={world['kiwi']}", "data.dev.path=", *SMALL.get(method, []), *overrides)


def build(cfg):
    """Translator, method and one micro-batch of 4 labelled + 4 pool sentences, as the loop builds them."""
    from qeebm.translation.translator import Translator

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


def by_hand(world, src, hyps, refs, weights) -> tuple[list[float], dict[str, list[float]]]:
    """Each term's scores from its own, separately loaded scorer, and their weighted sum."""
    from qeebm.qe.models import load_qe
    from qeebm.qe.scoring import QEScorer

    parts = {"kiwi": QEScorer(load_qe(str(world["kiwi"]))).score(src, hyps),
             "comet": QEScorer(load_qe(str(world["comet"]))).score(src, hyps, refs),
             "chrf": ChrfScorer().score(src, hyps, refs)}
    parts = {k: v for k, v in parts.items() if k in weights}
    return [sum(weights[k] * parts[k][i] for k in weights) for i in range(len(hyps))], parts


# ---------------------------------------------------------------------------------------------
# The scorer


def test_the_reward_is_the_weighted_sum_of_each_terms_scores(world, tmp_path):
    weights = {"kiwi": 0.5, "comet": 2.0, "chrf": -1.5}
    # The Kiwi twice, spelt two ways: loaded once, and both terms get its scores.
    cfg = config(world, tmp_path, "reinforce", terms(("kiwi", world["kiwi"], 0.5), ("comet", world["comet"], 2.0),
                                                      ("chrf", "chrf", -1.5), ("again", f"{world['kiwi']}/", 0.0)))
    scorer = common.CompositeScorer(cfg, torch.device("cpu"))
    assert len(scorer.scorers) == 3 and scorer.reference_terms == ["comet", "chrf"]
    src, refs = world["src"][:6], world["ref"][:6]
    hyps = [refs[0], "", *world["ref"][10:14]]
    want, parts = by_hand(world, src, hyps, refs, weights)
    got = scorer.score_terms(src, hyps, refs)
    for name in weights:
        assert got[name] == pytest.approx(parts[name], abs=1e-6), name
    assert got["again"] == got["kiwi"]
    assert scorer.combine(got) == pytest.approx(want, abs=1e-6)

    class Translator:  # what QEReward reads of one
        device = torch.device("cpu")

        @staticmethod
        def num_tokens(texts, side="tgt"):
            return [len(t.split()) for t in texts]

    reward = common.QEReward(cfg, Translator(), use_guards=False)
    qes = reward.frozen_qes()
    assert reward.needs_reference and set(qes) == {str(world["kiwi"]), f"{world['kiwi']}/", str(world["comet"])}
    assert qes[str(world["kiwi"])] is qes[f"{world['kiwi']}/"]
    score, penalty, guards, term_scores = reward(src, hyps, refs)
    assert score.tolist() == pytest.approx(want, abs=1e-5) and not penalty.any() and guards is None
    assert set(term_scores) == {"kiwi", "comet", "chrf", "again"}
    # The step's means over every row of every micro-batch (two here).
    halves = [{k: v[:2] for k, v in term_scores.items()}, {k: v[2:] for k, v in term_scores.items()}]
    means = reward.step_means(halves, gather=lambda t: t)
    assert means == {f"reward/{k}": pytest.approx(float(np.mean(v.double().numpy()))) for k, v in term_scores.items()}


def test_one_term_gives_exactly_the_single_qes_rewards(world, tmp_path):
    plain = config(world, tmp_path / "plain", "reinforce")
    one = config(world, tmp_path / "one", "reinforce", terms(("kiwi", world["kiwi"], 1.0)))
    rollouts = {}
    for name, cfg in (("plain", plain), ("one", one)):
        _, method, batch = build(cfg)
        (rollouts[name],) = method.finish_rollouts([method.rollout(batch)], gather=lambda t: t)
    a, b = rollouts["plain"], rollouts["one"]
    assert a.samples.hyps == b.samples.hyps
    assert torch.equal(a.scores, b.scores) and torch.equal(a.rewards, b.rewards)
    assert torch.equal(a.advantages, b.advantages)
    # Only the composite logs its terms.
    assert "reward/kiwi" not in a.step_stats and b.step_stats["reward/kiwi"] == pytest.approx(b.scores.mean().item())


# ---------------------------------------------------------------------------------------------
# Every reward-based method


@pytest.mark.parametrize("method, score", [("reinforce", "reinforce/score"), ("grpo", "grpo/score"),
                                           ("ppo", "ppo/qe")])
def test_two_steps_log_every_term(world, tmp_path, method, score):
    cfg = config(world, tmp_path, method, "optim.max_steps=2", "optim.batch_size=4",
                 terms(("kiwi", world["kiwi"], 0.5), ("chrf", "chrf", 2.0)))
    train(cfg)
    records = read_metrics(tmp_path)
    assert len(records) == 2
    for r in records:
        assert 0.0 <= r["reward/chrf"] <= 1.0 and "reward/kiwi" in r
        # The logged QE score is the composite: its mean is the weighted sum of the terms' means.
        assert r[score] == pytest.approx(0.5 * r["reward/kiwi"] + 2.0 * r["reward/chrf"], abs=1e-5)
    if method == "reinforce":
        # ... and the run's evaluation report records them.
        from qeebm.config import GenerationConfig
        from qeebm.evaluation.evaluate import MetricSpec, evaluate_run

        spec = MetricSpec(models={"comet": str(world["comet"]), "kiwi": str(world["kiwi"])}, judges={})
        report, _ = evaluate_run(tmp_path, test=_test_set(tmp_path, world), metrics=spec,
                                 generation=GenerationConfig(num_beams=1, max_new_tokens=8))
        assert [(t["name"], t["weight"], t["metric"]) for t in report["reward_terms"]] == [("kiwi", 0.5, "kiwi"),
                                                                                          ("chrf", 2.0, "chrf")]
        assert report["trained_on"] == "kiwi" and report["heldout"] == ["comet"]


def test_dpo_ranks_candidates_by_the_composite(world, tmp_path):
    weights = {"kiwi": 0.5, "chrf": 2.0}
    cfg = config(world, tmp_path, "dpo", terms(("kiwi", world["kiwi"], 0.5), ("chrf", "chrf", 2.0)))
    _, method, batch = build(cfg)
    assert method.needs_reference
    (r,) = method.finish_rollouts([method.rollout(batch)], gather=lambda t: t)
    cands = method.teacher.candidates(batch.mono, method.gen, 3)
    for i, (c, ref) in enumerate(zip(cands, batch.mono_ref)):
        want, _ = by_hand(world, [batch.mono[i]] * 3, c, [ref] * 3, weights)
        assert r.scores[i].tolist() == pytest.approx([max(want), min(want)], abs=1e-5)
        assert r.pairs.chosen[i] == c[int(np.argmax(want))]
    assert set(r.step_stats) >= {"reward/kiwi", "reward/chrf"}
    assert "reward/kiwi" in method.loss(r).values


def test_qe_finetune_selects_by_the_composite(world, tmp_path):
    weights = {"kiwi": 0.5, "chrf": 2.0}
    cfg = config(world, tmp_path, "qe-finetune", terms(("kiwi", world["kiwi"], 0.5), ("chrf", "chrf", 2.0)))
    _, method, batch = build(cfg)
    assert method.needs_reference
    (r,) = method.finish_rollouts([method.rollout(batch)], gather=lambda t: t)
    cands = method.teacher.candidates(batch.mono, method.gen, 3)
    for i, (c, ref) in enumerate(zip(cands, batch.mono_ref)):
        want, _ = by_hand(world, [batch.mono[i]] * 3, c, [ref] * 3, weights)
        assert r.choice.scores[i] == pytest.approx(want, abs=1e-5)
        assert r.choice.hyps[i] == c[int(np.argmax(want))]
    out = method.loss(r)
    assert out.values["reward/chrf"] == pytest.approx(r.step_stats["reward/chrf"])


def test_qe_finetune_reranks_by_a_reference_based_qe_path_against_the_pools_references(world, tmp_path):
    _, method, batch = build(config(world, tmp_path, "qe-finetune", "qe.path=chrf"))
    assert method.needs_reference
    (r,) = method.finish_rollouts([method.rollout(batch)], gather=lambda t: t)
    cands = method.teacher.candidates(batch.mono, method.gen, 3)
    for i, (c, ref) in enumerate(zip(cands, batch.mono_ref)):
        want = ChrfScorer().score([batch.mono[i]] * 3, c, [ref] * 3)
        assert r.choice.scores[i] == pytest.approx(want, abs=1e-6)
        assert r.choice.hyps[i] == c[int(np.argmax(want))]
    assert r.step_stats == {}  # a single QE: no terms to log


# ---------------------------------------------------------------------------------------------
# The report and compare


def test_the_report_records_every_term_and_leaves_them_out_of_the_heldout_judges(world, tmp_path):
    from qeebm.config import to_dict
    from qeebm.evaluation.evaluate import MetricSpec, evaluate_system, infer_reward_terms, infer_trained_on

    spec = MetricSpec(models={"comet": str(world["comet"]), "kiwi": str(world["kiwi"])}, judges={})
    cfg = to_dict(config(world, tmp_path, "reinforce", terms(("k", world["kiwi"], 0.5), ("c", "chrf", 2.0))))
    found = infer_reward_terms(cfg, spec)
    assert found == [{"name": "k", "path": str(world["kiwi"]), "weight": 0.5, "metric": "kiwi"},
                     {"name": "c", "path": "chrf", "weight": 2.0, "metric": "chrf"}]
    assert infer_trained_on(cfg, spec) == "kiwi"
    assert infer_reward_terms(to_dict(config(world, tmp_path, "reinforce")), spec) is None
    refs = world["ref"][:5]
    report = evaluate_system(refs, _test_set(tmp_path, world), spec, system="mix", trained_on="kiwi",
                             reward_terms=found)
    assert report["reward_terms"] == found and report["heldout"] == ["comet"]
    # A COMET term makes the COMET a training metric too: no held-out judge is left.
    with_comet = found + [{"name": "m", "path": str(world["comet"]), "weight": 1.0, "metric": "comet"}]
    report = evaluate_system(refs, _test_set(tmp_path, world), spec, system="mix", trained_on="kiwi",
                             reward_terms=with_comet)
    assert report["heldout"] == []


def _test_set(tmp_path, world):
    path = tmp_path / "test.tsv"
    write_tsv(path, world["src"][:5], world["ref"][:5])
    return path


def _report(system, hyp, ref, trained_on=None, heldout=(), **scores) -> dict:
    return {"format": FORMAT, "system": system, "seed": 1, "config_id": system, "data": {"path": "t", "sha256": "s"},
            "segments": {"ref": list(ref), "hyp": list(hyp), **{k: list(v) for k, v in scores.items()}},
            "trained_on": trained_on, "heldout": list(heldout)}


def test_compare_counts_every_trained_term_as_a_training_qe():
    from qeebm.evaluation.compare import Entry, compare

    def entries(*reports):
        return [Entry(Path(f"runs/{r['system']}/eval/test.json"), validate_report(r)) for r in reports]

    rnd = np.random.default_rng(4)
    words = [f"w{i}" for i in range(60)]
    refs = [" ".join(rnd.choice(words, size=8)) + "." for _ in range(30)]
    base_hyp = [" ".join(w if rnd.random() > 0.5 else "x" for w in r.split()) for r in refs]
    better_hyp = [" ".join(w if rnd.random() > 0.1 else "x" for w in r.split()) for r in refs]
    kiwi, judge = rnd.uniform(0.4, 0.6, 30), rnd.uniform(0.4, 0.6, 30)
    mix = [{"name": "kiwi", "path": "qe/kiwi", "weight": 1.0, "metric": "kiwi"},
           {"name": "chrf", "path": "chrf", "weight": 0.5, "metric": "chrf"}]

    def system(judge_gain):
        r = _report("mix", better_hyp, refs, kiwi=kiwi + 0.05, judge=judge + judge_gain, trained_on="kiwi",
                    heldout=["judge"])
        r["reward_terms"] = mix
        return r

    sft = _report("sft", base_hyp, refs, kiwi=kiwi, judge=judge)
    hacked = compare(entries(sft, system(0.0)), metrics=["chrf", "kiwi", "judge"], sacrebleu_test=False)
    assert hacked.improved("mix", "chrf") and hacked.improved("mix", "kiwi")
    assert [w.split(" significantly")[0] for w in hacked.warnings] == [
        "WARNING: possible reward hacking: mix improves its training QE Kiwi",
        "WARNING: possible reward hacking: mix improves its training metric chrF++"]
    honest = compare(entries(sft, system(0.03)), metrics=["chrf", "kiwi", "judge"], sacrebleu_test=False)
    assert honest.warnings == []
    # Without the terms only Kiwi is a training QE.
    plain = system(0.0)
    del plain["reward_terms"]
    result = compare(entries(sft, plain), metrics=["chrf", "kiwi", "judge"], sacrebleu_test=False)
    assert len(result.warnings) == 1 and "Kiwi" in result.warnings[0]


# ---------------------------------------------------------------------------------------------
# Config errors


@pytest.mark.parametrize("override, message", [
    ("reward.terms=[{name: a, path: chrf}, {name: a, path: chrf}]", r"'reward.terms\[1\].name': the name 'a' is given twice"),
    ("reward.terms=[{name: a, path: chrf, weight: .inf}]", r"'reward.terms\[0\].weight' \(a\) must be a finite number"),
    ("reward.terms=[{name: a, path: chrf, weight: .nan}]", r"'reward.terms\[0\].weight' \(a\) must be a finite number"),
    ("reward.terms=[{name: 'a b', path: chrf}]", r"'reward.terms\[0\].name' must be a word"),
    ("reward.terms=[{name: a}]", r"'reward.terms\[0\].path' \(a\) must name"),
])
def test_config_mistakes_are_one_line_errors_naming_the_key(world, tmp_path, override, message):
    with pytest.raises(QeebmError, match=message) as err:
        config(world, tmp_path, "reinforce", override)
    assert "\n" not in str(err.value)


def test_an_unknown_term_path_names_its_key(world, tmp_path):
    cfg = config(world, tmp_path, "reinforce", terms(("kiwi", world["kiwi"], 1.0), ("gone", tmp_path / "nowhere", 1.0)))
    with pytest.raises(QeebmError, match=r"config key 'reward.terms\[1\].path' \(gone\): QE model .*nowhere"):
        build(cfg)


def test_a_reference_term_needs_a_pool_with_references(world, tmp_path):
    cfg = config(world, tmp_path, "grpo", terms(("kiwi", world["kiwi"], 1.0), ("chrf", "chrf", 1.0)), pool="plain")
    with pytest.raises(QeebmError, match=r"config key 'reward.terms': chrf read\(s\) the reference .*mono\.txt is plain text"):
        build(cfg)


@pytest.mark.parametrize("method, override, message", [
    ("qe-ebm", None, "QE-EBM's energy is a gradient through one QE"),
    ("qe-finetune", "qe_finetune.selection=mbr", "selection=mbr chooses by qe_finetune.utility"),
])
def test_methods_without_a_composite_refuse_it(world, tmp_path, method, override, message):
    extra = [override] if override else []
    cfg = config(world, tmp_path, method, *extra, terms(("kiwi", world["kiwi"], 1.0), ("chrf", "chrf", 1.0)))
    with pytest.raises(QeebmError, match=message):
        METHODS[method].check_config(cfg)
    # QE-EBM takes one term that restates qe.path.
    if method == "qe-ebm":
        METHODS[method].check_config(config(world, tmp_path, method, terms(("kiwi", world["kiwi"], 1.0))))
        with pytest.raises(QeebmError, match="reward.terms"):
            METHODS[method].check_config(config(world, tmp_path, method, terms(("kiwi", world["kiwi"], 2.0))))
