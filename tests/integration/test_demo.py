"""The demo's SFT plateau: shipped where it is the plateau a world, seed and base would
train, trained otherwise, and refused when its files are not what was shipped."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from qeebm.errors import QeebmError
from qeebm.experiments import demo


@pytest.fixture(scope="module")
def plateau(micro_world, tmp_path_factory):
    """A micro world's plateau, trained with the smoke budget, exported as the demo ships one."""
    root = tmp_path_factory.mktemp("plateau")
    run = root / "plateau-seed42"
    demo.train_plateaus({42: run}, micro_world, demo.budget(quick=True))
    return run, demo.export_plateau(run, micro_world, 42, out=root / "shipped")


def test_the_shipped_plateau_is_used_only_for_its_own_world_seed_and_base(micro_world, plateau, tmp_path):
    run, shipped = plateau
    assert demo.shipped_plateau(micro_world, 42, "nllb", shipped) == shipped
    assert demo.shipped_plateau(micro_world, 231, "nllb", shipped) is None
    assert demo.shipped_plateau(micro_world, 42, "mbart", shipped) is None
    # Another world (other labelled pairs): not this plateau.
    other = tmp_path / "world"
    shutil.copytree(micro_world, other)
    (other / "data" / "train.tsv").write_text("src\ttgt\na\tb\n", encoding="utf-8")
    assert demo.shipped_plateau(other, 42, "nllb", shipped) is None
    source = json.loads((shipped / "source.json").read_text())
    assert {"best/model.safetensors", "metrics.jsonl", "config.yaml"} <= set(source["files"])
    assert "data/train.tsv" in source["inputs"] and "nllb-base/model.safetensors" in source["inputs"]


def test_the_demo_copies_the_shipped_plateau_and_its_curve(micro_world, plateau, tmp_path, monkeypatch):
    run, shipped = plateau
    monkeypatch.setattr(demo, "SHIPPED_PLATEAU", shipped)
    # The full demo's budget: the shipped plateau is the one it would train.
    copied = tmp_path / "plateau"
    timings = demo.train_plateaus({42: copied}, micro_world, demo.budget(quick=False))
    assert not [k for k in timings if k.startswith("train/")]
    assert (copied / "shipped.json").is_file() and demo.plateau_done(copied)
    assert (copied / "best" / "model.safetensors").read_bytes() == (run / "best" / "model.safetensors").read_bytes()
    assert demo.plateau_summary({42: copied}) == demo.plateau_summary({42: run})
    # --train-plateau trains it instead; another budget never takes the shipped one.
    assert not demo.plateau_done(tmp_path / "again")
    monkeypatch.setattr(demo, "run_jobs", lambda jobs, in_process=False: {f"train/{label}": 0.0 for label, _, _ in jobs})
    assert "train/plateau/42" in demo.train_plateaus({42: tmp_path / "again"}, micro_world, demo.budget(False), train=True)
    assert "train/plateau/42" in demo.train_plateaus({42: tmp_path / "quick"}, micro_world, demo.budget(True))


def test_a_damaged_shipped_plateau_is_refused_naming_the_file(micro_world, plateau, tmp_path):
    _, shipped = plateau
    bad = tmp_path / "shipped"
    shutil.copytree(shipped, bad)
    weights = bad / "best" / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(QeebmError, match=r"model\.safetensors: differs from its digest"):
        demo.shipped_plateau(micro_world, 42, "nllb", bad)


def test_the_demo_evaluates_a_shipped_plateau_on_its_own_world(micro_world, plateau, tmp_path, monkeypatch):
    # A shipped plateau's config names the world it was trained in by a path relative to wherever
    # that was; the demo reads the test set of the world it runs in.
    run, shipped = plateau
    copied = tmp_path / "plateau"
    shutil.copytree(shipped, copied)
    config = yaml.safe_load((copied / "config.yaml").read_text())
    config["data"]["test"]["path"] = "data/tinyworld/data/test.tsv"  # as the shipped one has it
    (copied / "config.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.chdir(tmp_path)
    [(path, _)] = demo._evaluate_worker([(str(copied), "plateau", "best", "test", None)], str(micro_world),
                                        own_process=False)
    report = json.loads(open(path).read())
    lines = (micro_world / "data" / "test.tsv").read_text(encoding="utf-8").splitlines()[1:]
    assert report["segments"]["src"] == [line.split("\t")[0] for line in lines]


def test_a_shipped_plateau_copied_names_the_world_it_runs_in(micro_world, plateau, tmp_path, monkeypatch):
    # Shipped, the config names the default world (data/tinyworld/...); copied into a demo on another
    # world, it names that world's files as the seeds' trained plateaus do, so they share a config_id.
    run, shipped = plateau
    moved = tmp_path / "shipped"
    shutil.copytree(shipped, moved)
    text = (moved / "config.yaml").read_text().replace(str(micro_world), demo.TINYWORLD_DIR)
    assert demo.TINYWORLD_DIR + "/data/train.tsv" in text
    (moved / "config.yaml").write_text(text)
    source = json.loads((moved / "source.json").read_text())
    source["files"]["config.yaml"] = demo.sha256_file(moved / "config.yaml")
    (moved / "source.json").write_text(json.dumps(source))
    monkeypatch.setattr(demo, "SHIPPED_PLATEAU", moved)
    copied = tmp_path / "plateau"
    demo.train_plateaus({42: copied}, micro_world, demo.budget(quick=False))
    assert (copied / "shipped.json").is_file()
    assert yaml.safe_load((copied / "config.yaml").read_text()) == yaml.safe_load((run / "config.yaml").read_text())
