"""scripts/sweep.py: the trial grid every method gets (the runs themselves are the demo's, tested there)."""

import importlib.util
import sys
from pathlib import Path

import pytest

from qeebm.experiments.demo import default_systems

spec = importlib.util.spec_from_file_location("sweep", Path(__file__).resolve().parents[2] / "scripts" / "sweep.py")
sweep = importlib.util.module_from_spec(spec)
sys.modules["sweep"] = sweep
spec.loader.exec_module(sweep)


def test_sft_tries_its_learning_rates_and_nothing_else():
    assert sweep.grid("sft", 0.0) == [(f"lr {lr:g}", [f"optim.lr={lr:g}"]) for lr in sweep.SFT_LRS]


@pytest.mark.parametrize("name", [n for n in default_systems() if n not in ("sft", "ppo")])
def test_every_other_method_gets_the_same_budget_at_sfts_learning_rates(name):
    knob, values, _ = sweep.grid_of(name)
    # The default: SFT's learning rate, each of three knob values once; PPO's four trials are its two
    # knob values at two learning rates.
    settings = sweep.grid(name, 8e-3, (1.0,))
    assert len(settings) == 3 and len(sweep.grid("ppo", 8e-3, (1.0,))) == 4
    assert [o for _, o in settings] == [["optim.lr=0.008", f"{knob}={v:g}"] for v in values]
    # --lr-factors 0.5,1: each knob value at both rates.
    assert [o for _, o in sweep.grid(name, 8e-3, (0.5, 1.0))] == \
        [[f"optim.lr={lr}", f"{knob}={v:g}"] for lr in ("0.004", "0.008") for v in values]


def test_ppo_also_gets_those_rates_per_optimiser_update():
    from qeebm.config import load_config
    from qeebm.experiments.demo import CONFIGS, budget, run_overrides, tiny_recipe

    # The demo's PPO makes epochs x minibatches updates per step: the factor the extra rates use.
    cfg = load_config(CONFIGS / tiny_recipe("ppo"), [o for o in run_overrides("ppo", Path("w"), Path("r"), budget(False), 42,
                                                                              Path("start")) if o.startswith("ppo.")])
    assert cfg.ppo.epochs * cfg.ppo.minibatches == sweep.PPO_UPDATES_PER_STEP
    lrs = [o[0] for _, o in sweep.grid("ppo", 8e-3, (1.0,))]
    assert lrs == ["optim.lr=0.008"] * 2 + ["optim.lr=0.001"] * 2


def test_the_positive_control_gets_its_methods_grid():
    assert sweep.grid_of("qe-ebm-oracle") == sweep.grid_of("qe-ebm-softmax-oracle") == sweep.KNOBS["qe-ebm-static"]
    assert sweep.grid_of("reinforce-oracle") == sweep.grid_of("reinforce-chrf") == sweep.KNOBS["reinforce"]
    assert sweep.grid_of("dpo-oracle") == sweep.KNOBS["dpo"]
    assert sweep.grid_of("grpo-oracle") == sweep.KNOBS["grpo"]
    assert sweep.grid_of("qe-ebm-loo-cv-oracle") == sweep.grid_of("qe-ebm-loo-cv") == ("qe_ebm.rho", (0.3, 1.0, 3.0), "rho")
    with pytest.raises(KeyError, match="no tuning grid"):
        sweep.grid_of("unheard-of")


@pytest.mark.parametrize("name", [n for n in default_systems() if n != "sft"])
def test_every_knob_is_a_key_of_its_methods_recipe(name):
    from qeebm.config import load_config
    from qeebm.experiments.demo import CONFIGS, tiny_recipe

    knob, values, _ = sweep.grid_of(name)
    cfg = load_config(CONFIGS / tiny_recipe(name), [f"{knob}={values[-1]:g}"])
    section, key = knob.split(".")
    assert getattr(getattr(cfg, section), key) == values[-1]


def test_qe_strength_pairs_each_seed_with_the_baselines_same_seed(tmp_path):
    spec = importlib.util.spec_from_file_location("qe_strength", Path(__file__).resolve().parents[2] / "scripts" / "qe_strength.py")
    qe_strength = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(qe_strength)
    header = "system,seeds,metric,scale,score,delta,seed_scores\n"
    rows = ["sft,42 6,chrf,1.0,50.0,,50.0 49.0", "sft,42 6,judge,100.0,41.0,,40.0 42.0",
            # seeds listed in another order: the differences are 51 - 50 and 52 - 49
            "reinforce,6 42,chrf,1.0,51.5,1.5,52.0 51.0", "reinforce,6 42,judge,100.0,42.0,1.0,43.0 41.0",
            "ppo,42 6,chrf,1.0,40.0,-10.0,40.0 40.0"]
    path = tmp_path / "comparison.csv"
    path.write_text(header + "\n".join(rows) + "\n")
    got = qe_strength.gains(path)
    assert set(got) == {"reinforce"}  # a system without a signal in SYSTEMS is left out
    mean, sd = got["reinforce"]["chrf"]
    assert mean == pytest.approx(2.0) and sd == pytest.approx(2 ** 0.5)
    mean, sd = got["reinforce"]["judge"]
    assert mean == pytest.approx(1.0) and sd == pytest.approx(0.0, abs=1e-9)
