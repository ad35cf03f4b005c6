"""A method is one unit: its class says its config section, whether it trains against a QE and
whether it samples; everything else (the evaluation's training-QE flag, the key upgrades of the
sampling sections, the recipes) follows from it, checked here."""

from __future__ import annotations

import dataclasses

import yaml

from qeebm.config import SAMPLING_SECTIONS, Config
from qeebm.evaluation.evaluate import QE_TRAINED_METHODS
from qeebm.methods import METHODS
from qeebm.utils.resources import CONFIGS


def test_each_method_section_is_a_config_section():
    sections = {f.name for f in dataclasses.fields(Config)}
    for name, method in METHODS.items():
        assert method.name == name
        assert method.section is None or method.section in sections, (name, method.section)


def test_the_sampling_sections_are_those_of_the_sampling_methods():
    # A section with a `sampling` subsection is one whose method draws samples of its own.
    sampling = {m.section for m in METHODS.values()
                if m.section and "sampling" in {f.name for f in dataclasses.fields(getattr(Config(), m.section))}}
    assert sampling == set(SAMPLING_SECTIONS)


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
