"""Checkpoints: an interrupted run resumes exactly, a crash while saving never leaves a checkpoint
that resume would trust, and a run directory refuses to continue under a different config."""

from __future__ import annotations

import errno
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from ddp_parity import assert_identical, make_config, read_metrics, write_tiny_world
from qeebm import checkpoint as ckpt
from qeebm.errors import QeebmError
from qeebm.loop import train


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return write_tiny_world(tmp_path_factory.mktemp("world"))


def load(run_dir: Path, step: int, name: str):
    return torch.load(ckpt.step_dir(Path(run_dir) / "checkpoints", step) / name, weights_only=True)


def test_interrupted_run_resumes_exactly(base, tmp_path):
    # Dropout stays on (the tiny model's 0.1), so the result depends on the restored RNG states.
    # Validation every 2 steps also runs at B's extra stop at step 3; it must not move any RNG.
    # The constant schedule does not depend on max_steps, which differs between B's two halves.
    common = ["model.dropout=null", "eval.every=2", "optim.warmup_steps=2"]
    straight = make_config(base, tmp_path / "A", *common, "optim.max_steps=6")
    train(straight)
    first = make_config(base, tmp_path / "B", *common, "optim.max_steps=3")
    assert train(first).step == 3
    second = make_config(base, tmp_path / "B", *common, "optim.max_steps=6")
    assert train(second).step == 6
    for name in ("model.pt", "optimizer.pt", "scheduler.pt"):
        assert_identical(load(tmp_path / "A", 6, name), load(tmp_path / "B", 6, name), name)
    # The resumed run's log holds each step once, with the uninterrupted run's values.
    a, b = read_metrics(tmp_path / "A"), read_metrics(tmp_path / "B")
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in a] == [r["loss"] for r in b]
    state = ckpt.read_state(ckpt.step_dir(tmp_path / "B" / "checkpoints", 6))
    assert state["step"] == 6 and [v["step"] for v in state["validations"]] == [2, 3, 4, 6]


def test_a_fresh_start_keeps_no_record_of_an_attempt_killed_before_its_first_checkpoint(base, tmp_path):
    # The attempt validated at step 0 and logged a step, then died with no checkpoint to resume from.
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 0, "val/chrf": 99.0}\n{"step": 1, "loss": 99.0}\n')
    train(make_config(base, run, "eval.every=2", "eval.at_start=true", "optim.max_steps=2"))
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2, 2] and 99.0 not in [v for r in records for v in r.values()]


@pytest.mark.parametrize("failure", [RuntimeError("disk full"), OSError(errno.ENOSPC, "No space left on device"),
                                     PermissionError(errno.EACCES, "Permission denied")], ids=["crash", "enospc", "eacces"])
def test_failed_checkpoint_write_keeps_the_previous_checkpoint(base, tmp_path, monkeypatch, failure):
    run = tmp_path / "run"
    cfg = make_config(base, run, "optim.max_steps=4", "output.save_every=2", "output.keep_last=1")
    real_save = torch.save
    calls = {"n": 0}

    def failing_save(obj, f, *args, **kwargs):
        calls["n"] += 1
        # Calls 1-4 write the step-2 checkpoint; the step-4 one dies halfway through a file.
        if calls["n"] == 6:
            Path(f).write_bytes(b"half a tensor")
            raise failure
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(QeebmError) as err:
        train(cfg)
    monkeypatch.setattr(torch, "save", real_save)
    # The message names the checkpoint, the cause and the checkpoint that is left.
    message = str(err.value)
    assert str(ckpt.step_dir(run / "checkpoints", 4)) in message and str(failure) in message
    assert f"previous checkpoint ({ckpt.step_dir(run / 'checkpoints', 2)}) is untouched" in message
    # keep_last=1 pruned nothing: step 2 is still the newest complete checkpoint, and loadable.
    assert [p.name for p in ckpt.list_checkpoints(run / "checkpoints")] == ["step-0000002"]
    assert not list((run / "checkpoints").glob(".tmp-*"))
    for name in ("model.pt", "optimizer.pt", "scheduler.pt", "rng-0.pt"):
        load(run, 2, name)

    result = train(cfg)
    assert result.step == 4
    assert "resuming from" in (run / "train.log").read_text(encoding="utf-8")
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3, 4]
    # Only now, with step 4 complete, is step 2 pruned.
    assert [p.name for p in ckpt.list_checkpoints(run / "checkpoints")] == ["step-0000004"]


def test_resume_refuses_a_different_config(base, tmp_path):
    run = tmp_path / "run"
    train(make_config(base, run, "optim.max_steps=2"))
    with pytest.raises(QeebmError) as err:
        train(make_config(base, run, "optim.max_steps=2", "optim.lr=0.01", "seed=8"))
    assert "optim.lr" in str(err.value) and "seed" in str(err.value)
    assert "max_steps" not in str(err.value)
    # Settings that do not change the weights may differ.
    result = train(make_config(base, run, "optim.max_steps=3", "logging.every=2", "output.keep_last=1", "eval.patience=3"))
    assert result.step == 3


def test_a_run_saved_with_older_key_names_still_resumes(base, tmp_path):
    run = tmp_path / "run"
    train(make_config(base, run, "optim.max_steps=2"))
    saved = yaml.safe_load((run / "config.yaml").read_text())
    for section in ("qe_ebm", "reinforce", "ppo"):  # the layout before <method>.sampling existed
        saved[section].update(saved[section].pop("sampling"))
    saved["reinforce"]["beta"] = saved["reinforce"].pop("pg_weight")  # the weights' former names
    saved["qe_finetune"]["beta"] = saved["qe_finetune"].pop("distill_weight")
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    assert train(make_config(base, run, "optim.max_steps=3")).step == 3
    with pytest.raises(QeebmError, match="reinforce.sampling.top_p"):
        train(make_config(base, run, "optim.max_steps=4", "reinforce.sampling.top_p=0.5"))
    with pytest.raises(QeebmError, match="differs in reinforce.pg_weight"):
        train(make_config(base, run, "optim.max_steps=4", "reinforce.pg_weight=0.5"))


def test_a_run_saved_before_the_sampler_key_resumes_only_with_the_sampler_it_used(base, tmp_path):
    run = tmp_path / "run"
    train(make_config(base, run, "optim.max_steps=2"))
    saved = yaml.safe_load((run / "config.yaml").read_text())
    for node in (saved["generation"], *(saved[s]["sampling"] for s in ("qe_ebm", "reinforce", "ppo"))):
        del node["sampler"]  # written before commit e015914, when every run drew with torch.multinomial
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    with pytest.raises(QeebmError, match="generation.sampler.*qe_ebm.sampling.sampler"):
        train(make_config(base, run, "optim.max_steps=3"))
    multinomial = ["generation.sampler=multinomial",
                   *(f"{s}.sampling.sampler=multinomial" for s in ("qe_ebm", "reinforce", "ppo"))]
    assert train(make_config(base, run, "optim.max_steps=3", *multinomial)).step == 3


def test_existing_checkpoints_without_resume_are_an_error(base, tmp_path):
    run = tmp_path / "run"
    train(make_config(base, run, "optim.max_steps=1"))
    with pytest.raises(QeebmError, match="output.resume"):
        train(make_config(base, run, "optim.max_steps=1", "output.resume=false"))


def test_atomic_dir_leaves_the_old_directory_on_failure(tmp_path):
    final = tmp_path / "best"
    with ckpt.atomic_dir(final) as tmp:
        (tmp / "a.txt").write_text("one")
    with pytest.raises(ValueError):
        with ckpt.atomic_dir(final) as tmp:
            (tmp / "a.txt").write_text("two")
            raise ValueError("interrupted")
    assert (final / "a.txt").read_text() == "one"
    with ckpt.atomic_dir(final) as tmp:
        (tmp / "b.txt").write_text("three")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best"]
    assert sorted(p.name for p in final.iterdir()) == ["b.txt"]


def test_rng_state_round_trips_through_a_file(tmp_path):
    torch.manual_seed(1), random.seed(1), np.random.seed(1)
    np.random.normal()  # leaves a cached Gaussian in numpy's state
    torch.save(ckpt.rng_state(), tmp_path / "rng.pt")
    expected = (random.random(), np.random.normal(), torch.rand(3))
    random.seed(2), np.random.seed(2), torch.manual_seed(2)
    ckpt.set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    got = (random.random(), np.random.normal(), torch.rand(3))
    assert got[:2] == expected[:2] and torch.equal(got[2], expected[2])
    with ckpt.preserve_rng():
        torch.rand(5), random.random(), np.random.rand()
    after = (random.random(), torch.rand(1))
    ckpt.set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    random.random(), np.random.normal(), torch.rand(3)
    assert after[0] == random.random() and torch.equal(after[1], torch.rand(1))
