"""Checkpoints: an interrupted run resumes exactly, a crash while saving never leaves a checkpoint
that resume would trust, and a run directory refuses to continue under a different config."""

from __future__ import annotations

import errno
import json
import random
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file as load_safetensors
from safetensors.torch import save_file as save_safetensors

from qeebm.errors import QeebmError
from qeebm.training import checkpoint as ckpt
from qeebm.training.loop import train
from qeebm.translation.translator import Translator
from qeebm.utils import integrity

from support.runs import assert_identical, make_config, read_metrics, write_tiny_world
from support.tiny import make_tiny_translator_dir


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


LORA = ["model.lora.enabled=true", "model.lora.r=4", "model.lora.dropout=0.1"]


def as_full_state_dict(step: Path, cfg) -> None:
    """Rewrite LoRA checkpoint ``step`` as one holding the whole state dict and no base record, with
    its digests: the layout of a LoRA checkpoint written before adapter-only ones."""
    model = Translator.load(cfg.model).model
    ckpt.load_model(step, model)
    torch.save(model.state_dict(), step / "model.pt")
    (step / ckpt.BASE).unlink()
    state = integrity.unsealed(json.loads((step / "state.json").read_text()))
    names = [p.name for p in step.iterdir() if p.name != "state.json"]
    (step / "state.json").write_text(json.dumps(integrity.seal(state, step, names), indent=1))


def test_an_interrupted_lora_run_resumes_exactly_from_its_adapters(base, tmp_path):
    # Dropout on in the model and the adapters: the result depends on the restored RNG states.
    common = [*LORA, "model.dropout=null"]
    train(make_config(base, tmp_path / "A", *common, "optim.max_steps=4"))
    assert train(make_config(base, tmp_path / "B", *common, "optim.max_steps=2")).step == 2
    # C: B stopped at step 2 too, its checkpoint in the full-state-dict layout; it resumes as well.
    shutil.copytree(tmp_path / "B", tmp_path / "C")
    as_full_state_dict(ckpt.step_dir(tmp_path / "C" / "checkpoints", 2), make_config(base, tmp_path / "C", *common))
    assert ckpt.load_file(ckpt.step_dir(tmp_path / "C" / "checkpoints", 2) / "model.pt").keys() \
        > load(tmp_path / "B", 2, "model.pt").keys()
    straight = read_metrics(tmp_path / "A")
    for run in ("B", "C"):
        assert train(make_config(base, tmp_path / run, *common, "optim.max_steps=4")).step == 4
        for name in ("model.pt", "optimizer.pt", "scheduler.pt"):
            assert_identical(load(tmp_path / "A", 4, name), load(tmp_path / run, 4, name), f"{run}: {name}")
        # The merged weights evaluation loads: the frozen base plus the same adapters.
        assert_identical(load_safetensors(str(tmp_path / "A" / "final" / "model.safetensors")),
                         load_safetensors(str(tmp_path / run / "final" / "model.safetensors")), f"{run}: final")
        resumed = read_metrics(tmp_path / run)
        assert [r["step"] for r in resumed] == [1, 2, 3, 4]
        assert [r["loss"] for r in resumed] == [r["loss"] for r in straight]


def test_a_lora_checkpoint_holds_the_trainable_tensors_and_names_its_base(base, tmp_path):
    cfg = make_config(base, tmp_path / "run", *LORA, "optim.max_steps=1")
    train(cfg)
    step = ckpt.step_dir(tmp_path / "run" / "checkpoints", 1)
    model = Translator.load(cfg.model).model
    full = model.state_dict(keep_vars=True)
    saved = ckpt.load_file(step / "model.pt")
    trainable = sorted(k for k, v in full.items() if v.requires_grad)
    assert trainable and all("lora_" in k for k in trainable) and len(trainable) < len(full)
    assert sorted(saved) == trainable
    assert all(saved[k].shape == full[k].shape for k in saved)
    # Its size is its tensors' bytes plus a little of torch's format, a small part of the full state dict's.
    torch.save(model.state_dict(), tmp_path / "full.pt")
    size, full_size = (step / "model.pt").stat().st_size, (tmp_path / "full.pt").stat().st_size
    tensors = sum(v.numel() * v.element_size() for v in saved.values())
    print(f"tiny LoRA checkpoint: model.pt {size} bytes ({tensors} of tensors), full state dict {full_size} bytes")
    assert tensors <= size < tensors + 1024 * len(saved) and size < full_size / 5
    # The record of the frozen base, covered by the checkpoint's digests like every other file.
    record = json.loads((step / ckpt.BASE).read_text())
    assert record == ckpt.base_record(cfg.model.name_or_path)
    assert record["name_or_path"] == cfg.model.name_or_path and len(record["sha256"]) == 64
    assert ckpt.BASE in json.loads((step / "state.json").read_text())["files"]
    # Neither a model that trains everything nor one with other adapters takes it.
    with pytest.raises(QeebmError, match="holds only adapters, trained on .*this run trains the whole model"):
        ckpt.check_base(step, None)
    for other in ("model.lora.enabled=false", "model.lora.target_modules=[q_proj]", "model.lora.r=2"):
        with pytest.raises(QeebmError, match=re.escape(f"{step / 'model.pt'}: its tensors are not this model's trainable ones")):
            ckpt.load_model(step, Translator.load(make_config(base, tmp_path / "run", *LORA, other).model).model)


def test_resuming_a_lora_run_on_another_base_is_one_line_naming_both(base, tmp_path):
    model = make_tiny_translator_dir(tmp_path, "nllb")
    run = tmp_path / "run"

    def config(steps: int):
        return make_config(base, run, *LORA, f"model.name_or_path={model}", f"optim.max_steps={steps}")

    train(config(1))
    before = ckpt.base_record(str(model))
    # The same directory, other weights (retrained or replaced in place): the config cannot tell.
    weights = model / "model.safetensors"
    original = weights.read_bytes()
    tensors = load_safetensors(str(weights))
    name = next(iter(tensors))
    tensors[name] = tensors[name] + 0.01
    save_safetensors(tensors, str(weights), metadata={"format": "pt"})
    after = ckpt.base_record(str(model))
    assert after["sha256"] != before["sha256"]
    with pytest.raises(QeebmError) as err:
        train(config(2))
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"cannot resume from {ckpt.step_dir(run / 'checkpoints', 1)}: its adapters were "
                              f"trained on the base {model} (weights sha256 {before['sha256'][:12]}), but this run's "
                              f"base is {model} (weights sha256 {after['sha256'][:12]})")
    # Back on the base it was trained on, the run resumes.
    weights.write_bytes(original)
    assert train(config(2)).step == 2


def test_a_base_is_identified_by_its_weight_files_wherever_they_are(tmp_path, monkeypatch):
    """A hub id's weights are found in its snapshot in the local cache; a copy of the same files has
    the same digest; the files transformers loads count (its safetensors before its .bin files)."""
    from huggingface_hub import constants

    local = make_tiny_translator_dir(tmp_path, "nllb")
    snapshot = tmp_path / "cache" / "models--org--tiny" / "snapshots" / "0123abcd"
    shutil.copytree(local, snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0123abcd")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    record = ckpt.base_record("org/tiny")
    assert record == {"name_or_path": "org/tiny", "sha256": ckpt.base_record(str(local))["sha256"]}
    (local / "pytorch_model.bin").write_bytes(b"not read: transformers loads the safetensors file")
    assert ckpt.base_record(str(local))["sha256"] == record["sha256"]
    (local / "model.safetensors").unlink()
    assert ckpt.base_record(str(local))["sha256"] != record["sha256"]
    with pytest.raises(QeebmError, match="'org/other': no local directory of that name, and it is not in the local"):
        ckpt.base_record("org/other")


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
        del node["sampler"]  # as written before the key existed, when every run drew with torch.multinomial
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


def test_the_disk_a_dry_run_computes_for_mbart50_is_counted_by_hand():
    from qeebm.config import LoraConfig, ModelConfig
    from qeebm.experiments.disk import translator_counts

    full = translator_counts(ModelConfig(name_or_path="facebook/mbart-large-50"))
    lora = translator_counts(ModelConfig(name_or_path="facebook/mbart-large-50", lora=LoraConfig(enabled=True)))
    # Embeddings 250,054 x 1024 (shared, tied to the head), positions 2 x 1026 x 1024; per encoder layer
    # 4 attention projections and 2 feed-forward matrices with biases, 2 layer norms; per decoder layer
    # 8 attention projections; 4 final layer norms; final_logits_bias 250,054.
    d, f, v = 1024, 4096, 250054
    attn, ffn, norm = d * d + d, 2 * d * f + d + f, 2 * d
    encoder = 12 * (4 * attn + ffn + 2 * norm)
    decoder = 12 * (8 * attn + ffn + 3 * norm)
    expected = v * d + 2 * 1026 * d + encoder + decoder + 4 * norm + v
    assert full.saved == full.trained == expected == 611_129_542
    # LoRA r=16 on q_proj and v_proj: 12 encoder layers x 2 + 12 decoder layers x 4 (self and cross).
    assert lora.saved == expected and lora.trained == 72 * 16 * (d + d)


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_the_dry_runs_disk_matches_the_files_a_run_writes(base, tmp_path, lora):
    from qeebm.experiments import disk

    cfg = make_config(base, tmp_path, *(LORA if lora else []), "optim.max_steps=2", "eval.every=2")
    train(cfg)
    planned = disk.run_disk(cfg, disk.translator_counts(cfg.model))
    step = ckpt.latest_checkpoint(tmp_path / "checkpoints")
    written = sum((step / name).stat().st_size for name in ("model.pt", "optimizer.pt"))
    # torch.save's pickle adds a few hundred bytes a tensor.
    assert planned.checkpoint_bytes <= written <= planned.checkpoint_bytes * 1.1 + 100_000
    dirs = [tmp_path / name for name in ("best", "final")]
    assert planned.model_dirs == len(dirs) + len(cfg.eval.also_best)
    for d in dirs:
        size = (d / "model.safetensors").stat().st_size
        assert planned.model_bytes / planned.model_dirs <= size <= planned.model_bytes / planned.model_dirs + 20_000
