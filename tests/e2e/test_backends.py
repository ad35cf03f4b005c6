"""The loop under accelerate's backends and trackers: FSDP and ZeRO-3 refused with the reason before
anything loads; DeepSpeed ZeRO-2 given the run's batch and clipping, and (when deepspeed is
installed) two CPU processes under it following DDP's curve and resuming exactly; trackers chosen by
``logging.report_to``, checked by name, wandb offline when installed."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch

from qeebm.errors import QeebmError
from qeebm.training import checkpoint as ckpt
from qeebm.training.backends import configure_deepspeed, make_accelerator
from qeebm.training.loop import train

from support.runs import assert_identical, finish, launch_two, make_config, read_metrics, write_tiny_world

HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
HAS_WANDB = importlib.util.find_spec("wandb") is not None


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return write_tiny_world(tmp_path_factory.mktemp("world"))


@pytest.mark.parametrize("env,message", [
    ({"ACCELERATE_USE_FSDP": "true"}, "FSDP is not supported: the translator's weights must stay whole"),
    ({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"}, "DeepSpeed ZeRO-3 is not supported"),
])
def test_weight_sharding_backends_are_refused_before_loading(base, tmp_path, monkeypatch, env, message):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    # A model path that does not exist: the refusal must come first.
    cfg = make_config(base, tmp_path / "run", "model.name_or_path=/nonexistent")
    with pytest.raises(QeebmError, match=message) as err:
        train(cfg)
    assert "generate()" in str(err.value) and "ZeRO-2" in str(err.value)
    assert not (tmp_path / "run").exists()


def test_relative_weighting_is_refused_under_deepspeed_before_loading(base, tmp_path, monkeypatch):
    # Its per-term gradients are extra autograd passes, which DeepSpeed reduces as backward passes.
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    cfg = make_config(base, tmp_path / "run", "model.name_or_path=/nonexistent", "method=qe-ebm",
                      "qe_ebm.weighting=relative")
    with pytest.raises(QeebmError, match="qe_ebm.weighting=relative is not supported under DeepSpeed") as err:
        train(cfg)
    assert "weighting=absolute" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(not HAS_DEEPSPEED, reason="deepspeed is not installed (pip install deepspeed)")
def test_deepspeed_config_takes_the_runs_batch_and_clipping(base, tmp_path, monkeypatch, fresh_accelerate_state):
    # The shipped config's values, as `accelerate launch --config_file deepspeed_zero2.yaml` exports them.
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")
    monkeypatch.setenv("ACCELERATE_GRADIENT_CLIPPING", "0.5")
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "1")
    cfg = make_config(base, tmp_path / "run", "optim.batch_size=16", "optim.grad_accum=4", "optim.max_grad_norm=2.0")
    accelerator = make_accelerator(cfg, tmp_path / "run")
    assert accelerator.state.deepspeed_plugin.zero_stage == 2
    configure_deepspeed(accelerator, cfg)
    ds = accelerator.state.deepspeed_plugin.deepspeed_config
    # One process: 16 = 4 micro-steps of 4; DeepSpeed counts no accumulation (the loop marks the
    # boundary) and clips at the run's optim.max_grad_norm, not the launcher's 0.5.
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"], ds["train_batch_size"]) == (4, 1, 4)
    assert ds["gradient_clipping"] == 2.0 and ds["zero_optimization"]["stage"] == 2


def _wait(procs: dict, timeout: float = 300) -> None:
    for name, proc in procs.items():
        out = finish(proc, timeout, f"run '{name}'")
        assert proc.returncode == 0, f"run '{name}' failed:\n{out[-4000:]}"


def _ddp_then_deepspeed(base: Path, tmp_path: Path, args: list[str]) -> None:
    """The same run under DDP (``tmp_path/ddp``), then under DeepSpeed (``tmp_path/ds``), two CPU
    processes each. Not both at once: beside one busy process (the other pytest worker), the ZeRO-2
    test with both jobs at once took 102 s and 127 CPU-s on 2 cores, one job after the other 48 s and
    65 CPU-s."""
    _wait({"ddp": launch_two(base, tmp_path / "ddp", *args, backend="ddp")})
    _wait({"deepspeed": launch_two(base, tmp_path / "ds", *args, backend="deepspeed")})


@pytest.mark.usefixtures("one_launch_at_a_time")
@pytest.mark.slow
@pytest.mark.skipif(not HAS_DEEPSPEED, reason="deepspeed is not installed (pip install deepspeed)")
def test_deepspeed_zero2_on_two_cpu_processes_follows_ddp_and_resumes_exactly(base, tmp_path):
    """recipes/accelerate/deepspeed_zero2.yaml with 2 CPU processes (DeepSpeed's CPU accelerator,
    gloo): 20 SFT steps give DDP's loss curve within 1e-4, clipping included; resumed from its step-10
    checkpoint, a run ends with the uninterrupted DeepSpeed run's weights and optimiser partitions."""
    args = ["optim.max_steps=20", "optim.grad_accum=2", "optim.max_grad_norm=0.5", "output.save_every=10"]
    _ddp_then_deepspeed(base, tmp_path, args)
    assert "backend DEEPSPEED" in (tmp_path / "ds" / "train.log").read_text()
    curve = {name: [r["loss"] for r in read_metrics(tmp_path / name)] for name in ("ddp", "ds")}
    assert len(curve["ddp"]) == 20 and curve["ds"] == pytest.approx(curve["ddp"], rel=1e-4)
    norms = {name: [r["grad_norm"] for r in read_metrics(tmp_path / name)] for name in ("ddp", "ds")}
    assert norms["ds"] == pytest.approx(norms["ddp"], rel=1e-4)
    last = ckpt.step_dir(tmp_path / "ds" / "checkpoints", 20)
    assert sorted(p.name for p in last.glob("optimizer*")) == ["optimizer-0.pt", "optimizer-1.pt"]
    ddp_w, ds_w = (ckpt.load_file(ckpt.step_dir(tmp_path / n / "checkpoints", 20) / "model.pt") for n in ("ddp", "ds"))
    # recipes/README.md quotes these (pytest -s -k zero2_on_two).
    loss_gap = max(abs(a - b) / abs(a) for a, b in zip(curve["ddp"], curve["ds"]))
    weight_gap = max((ds_w[k] - ddp_w[k]).abs().max().item() for k in ddp_w)
    print(f"\ndeepspeed zero-2 vs ddp over 20 steps: loss curves {loss_gap:.1e} relative, weights {weight_gap:.1e} absolute")
    for key in ddp_w:
        torch.testing.assert_close(ds_w[key], ddp_w[key], rtol=0, atol=1e-5, msg=key)

    # Resumed from the checkpoint the uninterrupted run wrote at step 10 (a run of its own that stops
    # there writes the same files, and a launch more costs this test a third of its time).
    shutil.copytree(ckpt.step_dir(tmp_path / "ds" / "checkpoints", 10), ckpt.step_dir(tmp_path / "resumed" / "checkpoints", 10))
    _wait({"second half": launch_two(base, tmp_path / "resumed", *args, backend="deepspeed")})
    assert "resuming from" in (tmp_path / "resumed" / "train.log").read_text()
    again = ckpt.step_dir(tmp_path / "resumed" / "checkpoints", 20)
    for name in ("model.pt", "optimizer-0.pt", "optimizer-1.pt", "scheduler.pt"):
        assert_identical(ckpt.load_file(last / name), ckpt.load_file(again / name), name)


METHOD_ARGS = {
    # PPO's value head (the method's extra parameters) joins DeepSpeed's one engine.
    "ppo": ["method=ppo", "ppo.sampling.max_new_tokens=6", "ppo.minibatches=2", "ppo.epochs=1"],
    # QE-dynamic's QE keeps its own optimiser outside the engine, its gradients summed by the method.
    "qe-ebm-dynamic": ["method=qe-ebm", "qe.mode=dynamic", "qe.warmup_steps=0", "qe.train_parts=[head]",
                       "qe_ebm.sampling.num_samples=2", "qe_ebm.sampling.max_new_tokens=6", "qe_ebm.energy_weight=1.0", "qe_ebm.energy_ramp_steps=0"],
}


@pytest.mark.usefixtures("one_launch_at_a_time")
@pytest.mark.slow
@pytest.mark.skipif(not HAS_DEEPSPEED, reason="deepspeed is not installed (pip install deepspeed)")
@pytest.mark.parametrize("method", sorted(METHOD_ARGS))
def test_deepspeed_runs_the_methods_with_their_own_parameters_as_ddp_does(base, tmp_path, method):
    """Two steps under DeepSpeed ZeRO-2 and under DDP (2 CPU processes each): the same losses, and
    the method's own trained state (PPO's value head, the dynamic QE) the same and moved."""
    from qeebm.data.corpus import write_lines
    from qeebm.qe.tiny import build_tiny_kiwi

    from support.tiny import tiny_texts, tokenizer_dir

    write_lines(tmp_path / "mono.txt", tiny_texts(64, seed=5)[0::2])
    kiwi = build_tiny_kiwi(tmp_path / "kiwi", tokenizer_dir("xlmr"))
    args = [*METHOD_ARGS[method], f"data.mono.path={tmp_path / 'mono.txt'}", f"qe.path={kiwi}", "optim.max_steps=2",
            "data.dev.path=", "output.save_every=1", "output.keep_last=0"]
    _ddp_then_deepspeed(base, tmp_path, args)
    curve = {name: [r["loss"] for r in read_metrics(tmp_path / name)] for name in ("ddp", "ds")}
    assert len(curve["ddp"]) == 2 and curve["ds"] == pytest.approx(curve["ddp"], rel=1e-4)
    # No gradient diagnostics under DeepSpeed: their extra autograd passes would be reduced as backward passes.
    diag = {name: {k for r in read_metrics(tmp_path / name) for k in r if k.startswith("diag/")} for name in ("ddp", "ds")}
    assert not diag["ds"] and (diag["ddp"] or method != "ppo")

    def own(name, step):
        state = ckpt.load_file(ckpt.step_dir(tmp_path / name / "checkpoints", step) / "method.pt")
        return state["value_head"] if method == "ppo" else state["qe"]

    assert any(not torch.equal(own("ds", 1)[k], own("ds", 2)[k]) for k in own("ds", 1))  # trained under DeepSpeed
    for step in (1, 2):
        for key, value in own("ddp", step).items():
            torch.testing.assert_close(own("ds", step)[key], value, rtol=0, atol=1e-5, msg=key)


# ---------------------------------------------------------------------------------------- trackers
def test_unknown_or_missing_tracker_is_a_one_line_error(base, tmp_path):
    with pytest.raises(QeebmError, match="logging.report_to: unknown tracker 'tensorbord'; choose from .*tensorboard"):
        train(make_config(base, tmp_path / "a", "logging.report_to=[tensorbord]"))
    if not HAS_WANDB:
        with pytest.raises(QeebmError, match=r"tracker 'wandb' is not installed \(pip install wandb\)"):
            train(make_config(base, tmp_path / "b", "logging.report_to=[wandb]"))


def test_tensorboard_gets_every_logged_metric(base, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = make_config(base, tmp_path / "run", "optim.max_steps=3", "logging.report_to=[tensorboard]", "eval.every=3")
    train(cfg)
    (events,) = [p.parent for p in (tmp_path / "run" / "tb").rglob("events.out.tfevents.*") if p.parent.name == "qeebm"]
    acc = EventAccumulator(str(events))
    acc.Reload()
    records = read_metrics(tmp_path / "run")
    assert [e.step for e in acc.Scalars("train/loss")] == [r["step"] for r in records]
    assert [e.value for e in acc.Scalars("train/loss")] == pytest.approx([r["loss"] for r in records])
    assert [e.step for e in acc.Scalars("val/loss")] == [3]


@pytest.mark.skipif(not HAS_WANDB, reason="wandb is not installed (pip install wandb)")
def test_wandb_offline_run_holds_the_metrics(base, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = make_config(base, tmp_path / "run", "optim.max_steps=2", "logging.report_to=[wandb]")
    train(cfg)
    # The offline run's records (wandb's own reader of its run file): the history holds every step's loss.
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore

    (path,) = (tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb")
    store, losses = datastore.DataStore(), {}
    store.open_for_scan(str(path))
    while (data := store.scan_data()) is not None:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            if "train/loss" in items:
                losses[items["_step"]] = items["train/loss"]
    assert losses == {r["step"]: pytest.approx(r["loss"]) for r in read_metrics(tmp_path / "run")}
