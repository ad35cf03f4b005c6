import copy
import dataclasses
from pathlib import Path

import pytest

from qeebm.config import Config, dump_config, load_config, parse_override
from qeebm.errors import QeebmError

RECIPES = sorted((Path(__file__).resolve().parents[2] / "recipes" / "configs").glob("*.yaml"))


def test_defaults_round_trip_through_yaml(tmp_path):
    cfg = load_config(overrides=["optim.lr=1e-4", "model.lora.enabled=true", "optim.betas=[0.9, 0.99]"])
    path = tmp_path / "c.yaml"
    path.write_text(dump_config(cfg))
    again = load_config(path)
    assert again == cfg
    assert again.optim.lr == 1e-4 and again.optim.betas == (0.9, 0.99) and again.model.lora.enabled


def test_overrides_apply_after_the_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  lr: 0.1\n  max_steps: 7\n")
    cfg = load_config(path, ["optim.lr=0.2"])
    assert (cfg.optim.lr, cfg.optim.max_steps) == (0.2, 7)
    assert cfg.optim.batch_size == Config().optim.batch_size


def test_int_widens_to_float_but_not_the_reverse():
    assert load_config(overrides=["optim.lr=1"]).optim.lr == 1.0
    with pytest.raises(QeebmError, match=r"'optim.max_steps' must be int, got 1.5"):
        load_config(overrides=["optim.max_steps=1.5"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("optim.lrr=1", "unknown config key 'optim.lrr' (did you mean 'optim.lr'?)"),
        ("optimm.lr=1", "unknown config key 'optimm' (did you mean 'optim'?)"),
        ("model.lora.rr=4", "unknown config key 'model.lora.rr' (did you mean 'model.lora.r'?)"),
        ("optim.lr=fast", "config key 'optim.lr' must be float, got 'fast'"),
        ("logging.progress_bar=3", "config key 'logging.progress_bar' must be bool, got 3"),
        ("model.lora.target_modules=q_proj", "config key 'model.lora.target_modules' must be a list"),
        ("optim.betas=[0.9]", "config key 'optim.betas' must be a list of 2 values"),
        ("optim.scheduler=cos", "config key 'optim.scheduler' must be one of linear, cosine, constant"),
        ("data.train.format=csv", "config key 'data.train.format' must be one of"),
        ("reinforce.sampling.sampler=gumbel", "config key 'reinforce.sampling.sampler' must be one of inverse-cdf, multinomial"),
        ("optim", "override 'optim' must look like key=value"),
    ],
)
def test_bad_keys_and_values_are_one_line_errors(override, message):
    with pytest.raises(QeebmError) as err:
        load_config(overrides=[override])
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_file_errors_name_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("optim:\n  lrate: 1\n")
    with pytest.raises(QeebmError, match=r"bad.yaml: unknown config key 'optim.lrate'"):
        load_config(path)
    with pytest.raises(QeebmError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")
    path.write_text("- a list\n")
    with pytest.raises(QeebmError, match="top level must be a mapping"):
        load_config(path)


def test_parse_override_nests_and_parses_yaml():
    assert parse_override("a.b.c=[1, 2]") == {"a": {"b": {"c": [1, 2]}}}
    assert parse_override("x=") == {"x": ""}


def test_every_field_has_a_default():
    def walk(cls):
        for f in dataclasses.fields(cls):
            assert f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING, f.name

    walk(Config)


@pytest.mark.parametrize("path", RECIPES, ids=[p.name for p in RECIPES])
def test_every_recipe_config_loads(path):
    load_config(path)


def test_old_flat_sampling_keys_are_read_as_the_sampling_section(caplog):
    old = load_config(None, ["reinforce.top_p=0.5", "reinforce.num_samples=3", "ppo.temperature=0.7"])
    new = load_config(None, ["reinforce.sampling.top_p=0.5", "reinforce.sampling.num_samples=3",
                             "ppo.sampling.temperature=0.7"])
    assert old == new and new.reinforce.sampling.top_p == 0.5 and new.ppo.sampling.temperature == 0.7
    assert "config key 'reinforce.top_p' is now 'reinforce.sampling.top_p'" in caplog.text
    with pytest.raises(QeebmError, match="'qe_ebm.top_k' and 'qe_ebm.sampling.top_k' both given"):
        load_config(None, ["qe_ebm.top_k=5", "qe_ebm.sampling.top_k=3"])



def test_the_weights_former_names_are_read_as_their_new_ones(caplog):
    old = load_config(None, ["reinforce.beta=0.3", "qe_finetune.beta=0.5"])
    assert (old.reinforce.pg_weight, old.qe_finetune.distill_weight) == (0.3, 0.5)
    assert old == load_config(None, ["reinforce.pg_weight=0.3", "qe_finetune.distill_weight=0.5"])
    assert "config key 'reinforce.beta' is now 'reinforce.pg_weight'" in caplog.text
    assert "config key 'qe_finetune.beta' is now 'qe_finetune.distill_weight'" in caplog.text
    with pytest.raises(QeebmError, match="'reinforce.beta' and 'reinforce.pg_weight' both given"):
        load_config(None, ["reinforce.beta=0.3", "reinforce.pg_weight=0.5"])
    # QE-EBM's weights are named for what they weigh; the paper's alpha and beta are the old keys.
    old = load_config(None, ["qe_ebm.beta_max=0.5", "qe_ebm.beta_ramp_steps=7", "qe_ebm.alpha=0.9",
                             "qe_ebm.alpha_coupling=2.0", "ppo.alpha=0.25", "preference.alpha=0.0"])
    c = old.qe_ebm
    assert (c.energy_weight, c.energy_ramp_steps, c.ce_weight, c.ce_coupling) == (0.5, 7, 0.9, 2.0)
    assert (old.ppo.ce_weight, old.preference.ce_weight) == (0.25, 0.0)
    assert "config key 'qe_ebm.beta_max' is now 'qe_ebm.energy_weight'" in caplog.text
    assert "config key 'ppo.alpha' is now 'ppo.ce_weight'" in caplog.text
    with pytest.raises(QeebmError, match="unknown config key 'qe_ebm.beta'"):
        load_config(None, ["qe_ebm.beta=0.3"])
    # LoRA's alpha is peft's name and stays.
    assert load_config(None, ["model.lora.alpha=8"]).model.lora.alpha == 8


def test_each_method_keeps_its_own_sampling_defaults():
    cfg = Config()
    # REINFORCE's published nucleus sampler, PPO's one rollout per source, QE-EBM's K = 5.
    assert (cfg.reinforce.sampling.top_p, cfg.reinforce.sampling.num_samples) == (0.9, 5)
    assert (cfg.ppo.sampling.top_p, cfg.ppo.sampling.num_samples) == (1.0, 1)
    assert (cfg.qe_ebm.sampling.top_p, cfg.qe_ebm.sampling.num_samples) == (1.0, 5)
    # Setting one key of a section keeps that section's other defaults, not SamplingConfig's.
    cfg = load_config(None, ["reinforce.sampling.num_samples=3", "ppo.sampling.max_new_tokens=8", "ppo.top_k=0"])
    assert (cfg.reinforce.sampling.top_p, cfg.reinforce.sampling.num_samples) == (0.9, 3)
    assert (cfg.ppo.sampling.num_samples, cfg.ppo.sampling.max_new_tokens) == (1, 8)


def test_a_saved_config_from_before_a_section_existed_reads_as_its_defaults():
    from qeebm.config import Config, added_sections, saved_added_sections, to_dict

    full = to_dict(Config())
    old = copy.deepcopy(full)
    for key in added_sections():
        *parents, last = key.split(".")
        node = old
        for part in parents:
            node = node[part]
        del node[last]
    assert old != full
    assert saved_added_sections(old) == full
    # A section the saved config holds is left as it was.
    assert saved_added_sections(full | {"grpo": {"epochs": 3}})["grpo"] == {"epochs": 3}
