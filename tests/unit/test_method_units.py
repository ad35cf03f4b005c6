"""A method is one unit: its module declares its config section, its class whether it trains against a
QE and whether it samples; everything else (the evaluation's training-QE flag, the key upgrades of the
sampling sections, the recipes) follows from it, checked here."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from qeebm import config
from qeebm.cli import build_parser
from qeebm.config import Config, method_sections, sampling_sections
from qeebm.errors import QeebmError
from qeebm.evaluation.command import metric_spec_from_args
from qeebm.evaluation.evaluate import QE_METRICS, QE_TRAINED_METHODS, MetricSpec
from qeebm.methods import METHODS
from qeebm.metrics.registry import DEFAULT_MODELS, DESCRIPTIONS, LABELS
from qeebm.utils.resources import CONFIGS


def test_each_method_section_is_a_config_section():
    sections = set(method_sections())
    for name, method in METHODS.items():
        assert method.name == name
        assert method.section is None or method.section in sections, (name, method.section)


def test_the_sampling_sections_are_those_of_the_sampling_methods():
    # A section with a `sampling` subsection is one whose method draws samples of its own.
    sampling = {m.section for m in METHODS.values()
                if m.section and "sampling" in {f.name for f in dataclasses.fields(getattr(Config(), m.section))}}
    assert sampling == set(sampling_sections())


def test_trained_on_qe_comes_from_the_method():
    assert QE_TRAINED_METHODS == {name for name, m in METHODS.items() if m.trained_on_qe}
    assert "sft" not in QE_TRAINED_METHODS and "qe-ebm" in QE_TRAINED_METHODS


def test_every_method_has_a_tiny_and_a_real_recipe():
    def methods(paths):
        return {yaml.safe_load(p.read_text())["method"] for p in paths}

    assert methods(CONFIGS.glob("tiny_*.yaml")) >= set(METHODS)
    assert methods((CONFIGS / "real").glob("*.yaml")) == set(METHODS)


def test_a_tiny_system_is_its_recipe(tmp_path, monkeypatch):
    # What a system trains against is read from its recipe, and a recipe no list names still runs.
    from qeebm.experiments import demo

    (tmp_path / "tiny_sft.yaml").write_text("method: sft\n")
    (tmp_path / "tiny_plateau.yaml").write_text("method: sft\n")
    (tmp_path / "tiny_new.yaml").write_text("method: reinforce\n")
    (tmp_path / "tiny_new-oracle.yaml").write_text(
        "method: reinforce\nqe: {path: data/tinyworld/qe/comet}\ndata: {mono: {path: data/tinyworld/data/mono_ref.tsv}}\n")
    (tmp_path / "tiny_new-chrf.yaml").write_text(
        "method: reinforce\nqe: {path: chrf}\ndata: {mono: {path: data/tinyworld/data/mono_ref.tsv}}\n")
    monkeypatch.setattr(demo, "CONFIGS", tmp_path)
    assert demo.default_systems() == ["sft", "new", "new-chrf", "new-oracle"]
    assert [demo.target(s) for s in ("sft", "new", "new-oracle", "new-chrf")] == [
        demo.KIWI, demo.KIWI, demo.ORACLE, demo.CHRF]


def test_the_listed_positive_control_is_what_its_recipes_train_against():
    from qeebm.config import ORACLE_SYSTEMS
    from qeebm.experiments import demo

    systems = demo.default_systems()
    assert {s for s in systems if demo.knows_reference(s)} == set(ORACLE_SYSTEMS)
    assert all(demo.target(s) == (demo.CHRF if s.endswith("-chrf") else demo.ORACLE) for s in ORACLE_SYSTEMS)


def test_a_method_section_is_declared_in_its_own_module(monkeypatch):
    # What a new method's module does: one decorated dataclass, and the config reads, checks,
    # upgrades and writes its section with no line in qeebm/config.py.
    monkeypatch.setattr(config, "_METHOD_SECTIONS", dict(config.method_sections()))

    @config.method_section("toy", choices={"mode": ("a", "b")}, renamed={"old": "weight"}, added=True)
    @dataclasses.dataclass
    class ToyConfig:
        weight: float = 1.0
        mode: str = "a"

    assert config.Config().toy == ToyConfig()
    cfg = config.load_config(None, ["toy.old=2", "toy.mode=b"])
    assert cfg.toy == ToyConfig(weight=2.0, mode="b")
    assert config.to_dict(cfg)["toy"] == {"weight": 2.0, "mode": "b"}
    assert config.config_from_dict(config.to_dict(cfg)) == cfg
    assert "toy" in config.added_sections()
    with pytest.raises(QeebmError, match="'toy.mode' must be one of a, b; got 'c'"):
        config.load_config(None, ["toy.mode=c"])
    with pytest.raises(QeebmError, match="unknown config key 'toy.wieght' \\(did you mean 'toy.weight'"):
        config.load_config(None, ["toy.wieght=1"])
    with pytest.raises(QeebmError, match="unknown config key 'tyo' \\(did you mean 'toy'"):
        config.load_config(None, ["tyo.weight=1"])
    with pytest.raises(QeebmError, match="'qe_ebm' is defined twice"):
        config.method_section("qe_ebm")(ToyConfig)
    with pytest.raises(QeebmError, match="'optim' is defined twice"):
        config.method_section("optim")(ToyConfig)


def test_the_builtin_neural_metrics_are_the_registry_s():
    assert QE_METRICS == tuple(DEFAULT_MODELS) == tuple(MetricSpec().qe_models())
    assert set(DEFAULT_MODELS) <= set(LABELS) & set(DESCRIPTIONS)
    args = build_parser().parse_args(["evaluate", *(a for name in DEFAULT_MODELS
                                                    for a in (f"--{name}", f"m-{name}", f"--{name}-batch-size", "3"))])
    spec = metric_spec_from_args(args)
    assert spec.qe_models() == {name: f"m-{name}" for name in DEFAULT_MODELS}
    assert spec.batch_sizes == dict.fromkeys(DEFAULT_MODELS, 3)
