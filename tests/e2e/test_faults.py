"""Faults a long run meets: a non-finite loss (skipped, counted, logged; too many in a row stop the
run), a checkpoint file that would run code when loaded (refused), a damaged checkpoint or model
directory (named; resume falls back to the newest intact checkpoint, exactly), and preemption by a
signal (at the next micro-step: checkpoint, exit 0, exact resume; in one process with SIGTERM, and
a real two-process gloo run with SIGUSR1)."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from qeebm.cli import main
from qeebm.data.step_sampler import StepSampler
from qeebm.errors import QeebmError
from qeebm.qe.energy import KiwiEnergy
from qeebm.training import checkpoint as ckpt
from qeebm.training.loop import train
from qeebm.utils import integrity

from support.qe import ENERGY_ONLY, qe_config
from support.runs import assert_identical, finish, launch_two, make_config, read_metrics


def qe_ebm_config(kiwi_world, run_dir, *overrides):
    # Energy only, from the first step, two micro-batches per step; a checkpoint after every step.
    return qe_config(kiwi_world, run_dir, *ENERGY_ONLY, "optim.grad_accum=2", "output.save_every=1", "output.keep_last=0",
                     *overrides)


def poison_energy(monkeypatch, bad_calls: set[int]) -> None:
    """KiwiEnergy's forward returns NaN for one sample on the given calls (one call per micro-batch)."""
    real = KiwiEnergy.forward
    calls = {"n": 0}

    def forward(self, *args, **kwargs):
        calls["n"] += 1
        energy = real(self, *args, **kwargs)
        if calls["n"] in bad_calls:
            energy = energy + torch.where(torch.arange(len(energy)) == 0, torch.nan, 0.0).to(energy)
        return energy

    monkeypatch.setattr(KiwiEnergy, "forward", forward)


def test_nan_energy_skips_the_update_and_logs_the_batch(kiwi_world, tmp_path, monkeypatch):
    # Calls 3 and 4 are step 2's two micro-batches: one NaN in the first spoils the step's update.
    poison_energy(monkeypatch, {3})
    run = tmp_path / "run"
    cfg = qe_ebm_config(kiwi_world, run, "optim.max_steps=3", "optim.warmup_steps=2", "optim.scheduler=linear")
    assert train(cfg).step == 3
    records = read_metrics(run)
    assert [r["nonfinite"] for r in records] == [0.0, 1.0, 0.0]
    assert records[1]["loss"] != records[1]["loss"]  # the logged loss is NaN
    # Step 2 changed nothing: weights, optimiser (moments and step count) and schedule as after step 1.
    step = {s: ckpt.step_dir(run / "checkpoints", s) for s in (1, 2, 3)}
    for name in ("model.pt", "optimizer.pt", "scheduler.pt"):
        assert_identical(ckpt.load_file(step[1] / name), ckpt.load_file(step[2] / name), name)
    assert not torch.equal(ckpt.load_file(step[3] / "model.pt")["lm_head.weight"],
                           ckpt.load_file(step[2] / "model.pt")["lm_head.weight"])
    # The lr of step 3 is the one step 2 would have had (warm-up 2 steps of a linear schedule).
    assert records[2]["lr"] == records[1]["lr"]
    assert ckpt.read_state(step[3])["nonfinite_steps"] == 1
    # train.log names the step's examples, as the step samplers drew them (of the pairs the length
    # filter kept, and of the source-only pool).
    text = (run / "train.log").read_text(encoding="utf-8")
    kept = int(re.search(r"train: kept (\d+) of", text).group(1))
    pool = int(re.search(r"mono: kept (\d+) of", text).group(1))
    line = next(x for x in text.splitlines() if "step 2: 1 of 1 update(s) skipped" in x)
    assert f"training pairs {StepSampler(kept, 8, cfg.seed).global_indices(1)}" in line
    assert f"source-only sentences {StepSampler(pool, 8, cfg.seed + 1).global_indices(1)}" in line


def test_nonfinite_steps_in_a_row_stop_the_run(kiwi_world, tmp_path, monkeypatch):
    # Every micro-batch from step 2 on is poisoned; the second bad step in a row stops the run.
    poison_energy(monkeypatch, set(range(3, 100)))
    run = tmp_path / "run"
    cfg = qe_ebm_config(kiwi_world, run, "optim.max_steps=6", "optim.max_nonfinite_steps=2")
    with pytest.raises(QeebmError) as err:
        train(cfg)
    message = str(err.value)
    assert "2 steps in a row (to step 3)" in message and "max_nonfinite_steps=2" in message
    # Step 2 was skipped, so its checkpoint holds step 1's weights: the last good ones, intact.
    assert str(ckpt.step_dir(run / "checkpoints", 2)) in message
    assert [p.name for p in ckpt.list_checkpoints(run / "checkpoints")] == ["step-0000001", "step-0000002"]
    assert_identical(ckpt.load_file(ckpt.step_dir(run / "checkpoints", 1) / "model.pt"),
                     ckpt.load_file(ckpt.step_dir(run / "checkpoints", 2) / "model.pt"))


@pytest.mark.parametrize("override,message", [
    ("output.preempt_signals=[SIGTERM,SIGFOO]", "output.preempt_signals: unknown signal 'SIGFOO'"),
    ("optim.max_nonfinite_steps=-1", "optim.max_nonfinite_steps must be >= 0"),
])
def test_bad_fault_settings_fail_before_loading(kiwi_world, tmp_path, override, message):
    with pytest.raises(QeebmError, match=re.escape(message)):
        train(make_config(kiwi_world["base"], tmp_path / "run", "model.name_or_path=/nonexistent", override))


def test_apply_update_applies_or_skips_without_touching_the_state():
    from accelerate import Accelerator

    from qeebm.training.backends import APPLIED, NONFINITE, apply_update

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    params = list(model.parameters())

    def state():
        return ({k: v.clone() for k, v in model.state_dict().items()},
                {k: {n: t.clone() if torch.is_tensor(t) else t for n, t in v.items()} for k, v in optimizer.state_dict()["state"].items()})

    x = torch.ones(2, 3)
    model(x).sum().backward()
    norm, outcome = apply_update(accelerator, optimizer, params, max_norm=1e9, loss_finite=True)
    assert outcome == APPLIED and norm > 0 and all(p.grad is None for p in params)
    applied = state()
    # A non-finite loss (as agreed over processes): nothing moves, the gradients are dropped.
    model(x).sum().backward()
    assert apply_update(accelerator, optimizer, params, max_norm=1e9, loss_finite=False)[1] == NONFINITE
    assert_identical(state(), applied) and all(p.grad is None for p in params)
    # A finite loss whose gradients overflowed (no loss scaler): skipped too, AdamW's step count kept.
    model(x).sum().backward()
    params[0].grad[0, 0] = torch.inf
    norm, outcome = apply_update(accelerator, optimizer, params, max_norm=1e9, loss_finite=True)
    assert outcome == NONFINITE and norm == torch.inf
    assert_identical(state(), applied) and all(p.grad is None for p in params)


class _RunsCode:
    """Unpickling this calls os.system: what a checkpoint from elsewhere could do to torch.load."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("name", ["model.pt", "optimizer.pt", "scheduler.pt", "rng-0.pt", "method.pt"])
def test_a_checkpoint_that_would_run_code_is_refused(kiwi_world, tmp_path, name):
    run = tmp_path / "run"
    train(make_config(kiwi_world["base"], run, "optim.max_steps=1"))
    marker = tmp_path / "code-ran"
    path = ckpt.step_dir(run / "checkpoints", 1) / name
    torch.save({"state": _RunsCode(marker)}, path)  # pickling runs nothing; unpickling would
    reseal(path.parent)  # whoever crafts the file can forge its digest too
    with pytest.raises(QeebmError, match=rf"{re.escape(str(path))}: refused to load"):
        if name == "method.pt":
            ckpt.load_method_state(path.parent, _MethodWithState())
        else:
            train(make_config(kiwi_world["base"], run, "optim.max_steps=2"))  # resumes from step 1
    assert not marker.exists()
    # The file is a real threat: a plain unpickling runs its code.
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_a_qe_checkpoint_that_would_run_code_is_refused(kiwi_world, tmp_path):
    import shutil

    from qeebm.qe.models import load_qe

    kiwi = tmp_path / "kiwi"
    shutil.copytree(kiwi_world["kiwi"], kiwi)
    (ckpt_file,) = kiwi.glob("checkpoints/*.ckpt")
    state = torch.load(ckpt_file, weights_only=True)
    marker = tmp_path / "code-ran"
    torch.save({**state, "hyper_parameters": {**state["hyper_parameters"], "x": _RunsCode(marker)}}, ckpt_file)
    with pytest.raises(QeebmError, match=f"comet could not load {re.escape(str(ckpt_file))}"):
        load_qe(str(kiwi))
    assert not marker.exists()


class _MethodWithState:
    name = "stateful"

    def load_state_dict(self, state):
        raise AssertionError("a refused file reached the method")


def _signal_workers(job: subprocess.Popen, metrics: Path, after: int, sig: int) -> None:
    """Wait until ``metrics`` holds ``after`` records, then signal every process the launcher started."""
    import psutil

    deadline = time.monotonic() + 120
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= after):
        if job.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"the run ended or stalled before it could be signalled:\n{finish(job, 5)[-3000:]}")
        time.sleep(0.05)
    for worker in psutil.Process(job.pid).children(recursive=True):
        worker.send_signal(sig)


def signal_in_backward(monkeypatch, n: int, sig: int = signal.SIGTERM) -> list[int]:
    """Raise ``sig`` in the middle of the loop's ``n``-th micro-step of the run (counted from 1, by
    its backward pass); the returned list numbers every micro-step that ran."""
    import qeebm.training.loop

    real = qeebm.training.loop.backward
    ran: list[int] = []

    def backward(accelerator, loss):
        ran.append(len(ran) + 1)
        if len(ran) == n:
            signal.raise_signal(sig)
        real(accelerator, loss)

    monkeypatch.setattr(qeebm.training.loop, "backward", backward)
    return ran


def assert_same_end(straight: Path, resumed: Path, step: int, names=("model.pt", "optimizer.pt", "scheduler.pt")) -> None:
    assert [r["step"] for r in read_metrics(resumed)] == list(range(1, step + 1))
    assert [r["loss"] for r in read_metrics(resumed)] == [r["loss"] for r in read_metrics(straight)]
    for name in names:
        assert_identical(ckpt.load_file(ckpt.step_dir(straight / "checkpoints", step) / name),
                         ckpt.load_file(ckpt.step_dir(resumed / "checkpoints", step) / name), name)


LORA = ["model.lora.enabled=true", "model.lora.r=4", "model.lora.dropout=0.1"]


@pytest.mark.parametrize("adapters", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("micro, stopped", [(2, 2), (4, 3)], ids=["mid-step", "last-micro-step"])
def test_a_signal_stops_the_run_at_the_next_micro_step_and_the_same_command_resumes_exactly(
        kiwi_world, tmp_path, monkeypatch, capsys, adapters, micro, stopped):
    """One process, 4 micro-steps a step, SIGTERM in the middle of step 3's micro-step ``micro``: no
    micro-step starts after it. Signalled before the last one, step 3 is dropped (its partial
    gradients with it) and the checkpoint is step 2's; in the last one, the step completes and is
    checkpointed. A LoRA run's checkpoint holds only its adapters. The same config then ends as an
    uninterrupted run, bit for bit (dropout on: the generators are put back too)."""
    import qeebm.training.loop

    common = ["optim.grad_accum=4", "optim.max_steps=6", "model.dropout=null", "optim.scheduler=linear",
              "optim.warmup_steps=2", *(LORA if adapters else [])]
    train(make_config(kiwi_world["base"], tmp_path / "straight", *common))
    before = signal.getsignal(signal.SIGTERM)
    real = qeebm.training.loop.backward
    ran = signal_in_backward(monkeypatch, 2 * 4 + micro)
    cfg = make_config(kiwi_world["base"], tmp_path / "run", *common)
    result = train(cfg)
    assert result.preempted and result.step == stopped
    assert ran == list(range(1, 2 * 4 + micro + 1))  # the signalled micro-step finished; none began after it
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is gone with the run
    root = tmp_path / "run" / "checkpoints"
    assert ckpt.latest_checkpoint(root) == ckpt.step_dir(root, stopped)
    left = " (step 3 was left at a micro-step and runs again on resume)" if stopped == 2 else ""
    assert f"preempted by SIGTERM after step {stopped} of 6{left}: checkpoint {ckpt.step_dir(root, stopped)} written" \
        in capsys.readouterr().out
    saved = ckpt.load_file(ckpt.step_dir(root, stopped) / "model.pt")
    assert (ckpt.step_dir(root, stopped) / ckpt.BASE).is_file() == adapters
    assert all("lora_" in k for k in saved) == adapters
    monkeypatch.setattr(qeebm.training.loop, "backward", real)
    assert train(cfg).step == 6
    assert f"resuming from {ckpt.step_dir(root, stopped)}" in (tmp_path / "run" / "train.log").read_text()
    assert_same_end(tmp_path / "straight", tmp_path / "run", 6)


def test_a_signal_in_the_first_step_leaves_a_step_0_checkpoint_that_resumes_exactly(kiwi_world, tmp_path, monkeypatch):
    import qeebm.training.loop

    common = ["optim.grad_accum=2", "optim.max_steps=2", "model.dropout=null"]
    train(make_config(kiwi_world["base"], tmp_path / "straight", *common))
    real = qeebm.training.loop.backward
    signal_in_backward(monkeypatch, 1)
    cfg = make_config(kiwi_world["base"], tmp_path / "run", *common)
    assert train(cfg).step == 0
    assert ckpt.latest_checkpoint(tmp_path / "run" / "checkpoints").name == "step-0000000"
    monkeypatch.setattr(qeebm.training.loop, "backward", real)
    assert train(cfg).step == 2
    assert_same_end(tmp_path / "straight", tmp_path / "run", 2)


def stateful(kiwi_world, method: str) -> list[str]:
    """A method whose own state changes within a step, two micro-steps a step."""
    sampled = [f"data.mono.path={kiwi_world['mono']}", f"qe.path={kiwi_world['kiwi']}", "optim.grad_accum=2", "model.dropout=null"]
    return {
        # the running mean moves in finish_rollouts, before the micro-steps
        "reinforce": ["method=reinforce", "reinforce.baseline=running_mean", "reinforce.sampling.num_samples=2",
                      "reinforce.sampling.max_new_tokens=8", *sampled],
        # the KL controller moves in finish_rollouts; 2 epochs x 2 minibatches = 4 updates a step
        "ppo": ["method=ppo", "ppo.minibatches=2", "ppo.sampling.max_new_tokens=8", *sampled],
        # loo-cv's weight adds each micro-step's sums in loss
        "qe-ebm": ["method=qe-ebm", "qe_ebm.estimator=loo-cv", "qe_ebm.ce_weight=1.0", "qe_ebm.energy_weight=1.0",
                   "qe_ebm.energy_ramp_steps=0", "qe_ebm.sampling.num_samples=2", "qe_ebm.sampling.max_new_tokens=8", *sampled],
        # the teacher is refreshed at step 3 before the micro-steps, and left so by the undo
        "dpo": ["method=dpo", "preference.refresh_every=2", "preference.num_candidates=3", "preference.max_new_tokens=8",
                "preference.guards=false", "optim.lr=0.05", *sampled],
        # QE-dynamic's QE takes its update before the micro-steps: its steps run to their end
        "qe-dynamic": ["method=qe-ebm", "qe.mode=dynamic", "qe.warmup_steps=1", "qe_ebm.sampling.num_samples=2",
                       "qe_ebm.sampling.max_new_tokens=8", *sampled],
    }[method]


@pytest.mark.parametrize("method, micro, stopped", [
    ("reinforce", 1, 2),
    ("qe-ebm", 1, 2),
    ("ppo", 1, 2),  # in the step's first update
    ("ppo", 3, 3),  # in its second: the first was applied, so the step runs to its end
    ("dpo", 1, 2),
    ("qe-dynamic", 1, 3),
])
def test_a_step_left_at_a_micro_step_leaves_no_trace_of_its_method_state(kiwi_world, tmp_path, monkeypatch, method, micro,
                                                                         stopped):
    """SIGTERM in step 3's micro-step ``micro`` (counted over the step's updates) of a method whose own
    state moves within the step: the run stops at ``stopped``, and resumed it ends as an
    uninterrupted run, the method's state (``method.pt``) included."""
    import qeebm.training.loop

    per_step = 8 if method == "ppo" else 2
    common = [*stateful(kiwi_world, method), "optim.max_steps=4", "output.keep_last=0"]
    train(make_config(kiwi_world["base"], tmp_path / "straight", *common))
    real = qeebm.training.loop.backward
    signal_in_backward(monkeypatch, 2 * per_step + micro)
    cfg = make_config(kiwi_world["base"], tmp_path / "run", *common)
    assert train(cfg).step == stopped
    monkeypatch.setattr(qeebm.training.loop, "backward", real)
    assert train(cfg).step == 4
    assert_same_end(tmp_path / "straight", tmp_path / "run", 4, ("model.pt", "optimizer.pt", "scheduler.pt", "method.pt"))


# Dropout on and a linear schedule: a resumed run must restore the RNG states and the schedule too.
TWO_PROCESS_ARGS = ["optim.max_steps=20", "optim.grad_accum=2", "model.dropout=null", "optim.scheduler=linear",
                    "optim.warmup_steps=5", "logging.every=1"]


@pytest.fixture(scope="module")
def straight_two(kiwi_world, tmp_path_factory, launch_turn) -> Path:
    """An uninterrupted two-process run of TWO_PROCESS_ARGS: what every signalled one must end as."""
    run = tmp_path_factory.mktemp("straight_two") / "run"
    with launch_turn:
        proc = launch_two(kiwi_world["base"], run, *TWO_PROCESS_ARGS)
        out = finish(proc, 180)
    assert proc.returncode == 0, out[-3000:]
    return run


@pytest.mark.usefixtures("one_launch_at_a_time")
@pytest.mark.slow
def test_preempted_two_process_run_resumes_exactly(kiwi_world, straight_two, tmp_path):
    """A running two-process job gets SIGUSR1 on every worker (what SLURM does to a job's tasks;
    torchrun starts each worker in a session of its own): the processes agree on the micro-step to
    stop at (the signals may reach them at different ones), write a checkpoint and exit 0, and so
    does the launcher; the same command resumes, and the run ends as an uninterrupted one."""
    run = tmp_path / "preempted"
    job = launch_two(kiwi_world["base"], run, *TWO_PROCESS_ARGS)
    _signal_workers(job, run / "metrics.jsonl", after=2, sig=signal.SIGUSR1)
    out = finish(job, 120)
    assert job.returncode == 0, out[-3000:]
    stopped = int(re.search(r"preempted by SIGUSR1 after step (\d+) of 20", out).group(1))
    assert 2 <= stopped < 20 and "run the same command to resume" in out
    last = ckpt.step_dir(run / "checkpoints", stopped)
    assert ckpt.latest_checkpoint(run / "checkpoints") == last
    # Both processes took part in that checkpoint.
    assert {p.name for p in last.glob("rng-*.pt")} == {"rng-0.pt", "rng-1.pt"}

    resumed = launch_two(kiwi_world["base"], run, *TWO_PROCESS_ARGS)
    out = finish(resumed, 180)
    assert resumed.returncode == 0, out[-3000:]
    assert f"resuming from {last}" in (run / "train.log").read_text()
    assert_same_end(straight_two, run, 20)


@pytest.mark.usefixtures("one_launch_at_a_time")
@pytest.mark.slow
def test_two_processes_leave_the_step_together_when_one_of_them_is_signalled(kiwi_world, straight_two, tmp_path,
                                                                           monkeypatch):
    """Only process 1 gets SIGUSR1, in the middle of step 3's first micro-step: both processes agree
    before the second, leave step 3, write step 2's checkpoint together and exit 0; resumed, the run
    ends as an uninterrupted one."""
    run = tmp_path / "preempted"
    monkeypatch.setenv("QEEBM_TEST_SIGNAL", "1:5")  # support.runs.signal_one_process: 2 micro-steps a step
    job = launch_two(kiwi_world["base"], run, *TWO_PROCESS_ARGS)
    monkeypatch.delenv("QEEBM_TEST_SIGNAL")
    out = finish(job, 120)
    assert job.returncode == 0, out[-3000:]
    assert "preempted by a signal to another process after step 2 of 20 (step 3 was left at a micro-step" in out, \
        out[-3000:]
    last = ckpt.step_dir(run / "checkpoints", 2)
    assert ckpt.latest_checkpoint(run / "checkpoints") == last
    assert {p.name for p in last.glob("rng-*.pt")} == {"rng-0.pt", "rng-1.pt"}
    resumed = launch_two(kiwi_world["base"], run, *TWO_PROCESS_ARGS)
    out = finish(resumed, 180)
    assert resumed.returncode == 0, out[-3000:]
    assert_same_end(straight_two, run, 20)


# ----------------------------------------------------------------------------------------------
# Damaged checkpoints and model directories

PARTS = ["model.pt", "optimizer.pt", "scheduler.pt", "rng-0.pt", "method.pt", "state.json"]
KINDS = ["truncated", "empty", "flipped"]


def damage(path: Path, kind: str) -> bytes:
    """Damage a file as a cut copy, a failing disk or a sync tool does; return its new bytes. A
    flipped bit in state.json turns the step's digit into another, so the file is still valid JSON."""
    data = path.read_bytes()
    if kind == "truncated":
        new = data[: len(data) // 2]
    elif kind == "empty":
        new = b""
    else:
        at = data.index(b'"step": ') + len(b'"step": ') if path.name == "state.json" else len(data) // 2
        new = data[:at] + bytes([data[at] ^ 1]) + data[at + 1:]
    path.write_bytes(new)
    return new


def reseal(step: Path) -> None:
    """Record the digests of ``step``'s files as they are now."""
    state = integrity.unsealed(json.loads((step / "state.json").read_text()))
    names = [p.name for p in step.iterdir() if p.name != "state.json"]
    (step / "state.json").write_text(json.dumps(integrity.seal(state, step, names), indent=1))


def strip_digests(root: Path) -> None:
    """Make every checkpoint under ``root`` look written before digests were recorded."""
    for step in ckpt.list_checkpoints(root):
        state = json.loads((step / "state.json").read_text())
        (step / "state.json").write_text(json.dumps(integrity.unsealed(state), indent=1))


def snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def qe_run(kiwi_world, tmp_path_factory) -> Path:
    """An uninterrupted QE-EBM static run of 3 steps (sampling, so resume must restore the RNGs),
    a checkpoint after every step, all kept; the tests damage copies of it."""
    run = tmp_path_factory.mktemp("qe_run") / "run"
    train(qe_ebm_config(kiwi_world, run, "optim.max_steps=3"))
    return run


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("part", PARTS)
def test_a_damaged_checkpoint_is_set_aside_for_the_newest_intact_one(qe_run, tmp_path, caplog, part, kind):
    root = tmp_path / "checkpoints"
    shutil.copytree(qe_run / "checkpoints", root)
    written = (root / "step-0000003" / part).read_bytes()
    new = damage(root / "step-0000003" / part, kind)
    with caplog.at_level(logging.INFO, logger="qeebm"):
        assert ckpt.newest_intact(root) == ckpt.step_dir(root, 2)
    if part == "state.json":
        cause = {"truncated": "not valid JSON (", "empty": "empty (0 bytes)",
                 "flipped": "its content does not match its own sha256 (changed after it was written)"}[kind]
    else:
        cause = {"truncated": f"truncated ({len(new)} of {len(written)} bytes)", "empty": f"empty (0 of {len(written)} bytes)",
                 "flipped": "changed (same size, but its sha256 is not the one in state.json)"}[kind]
    (line,) = warnings_of(caplog)
    assert line.startswith(f"skipped checkpoint step-0000003: {root / 'step-0000003' / part}: damaged: {cause}")
    assert line.endswith("; kept as step-0000003.damaged; resuming from step-0000002") and "\n" not in line
    # Set aside, not deleted: every file as it was found, the damaged one included.
    assert [p.name for p in ckpt.list_checkpoints(root)] == ["step-0000001", "step-0000002"]
    original = snapshot(qe_run / "checkpoints" / "step-0000003")
    assert snapshot(root / "step-0000003.damaged") == original | {part: new}


def test_damaged_checkpoints_are_set_aside_under_names_never_taken(qe_run, tmp_path):
    root = tmp_path / "checkpoints"
    shutil.copytree(qe_run / "checkpoints", root)
    (root / "step-0000003.damaged").mkdir()  # left by an earlier fall-back at the same step
    damage(root / "step-0000003" / "model.pt", "truncated")
    assert ckpt.newest_intact(root) == ckpt.step_dir(root, 2)
    assert sorted(p.name for p in root.iterdir()) == ["step-0000001", "step-0000002", "step-0000003.damaged",
                                                       "step-0000003.damaged-2"]
    assert not any((root / "step-0000003.damaged").iterdir())


@pytest.mark.parametrize("kind", KINDS)
def test_a_checkpoint_written_before_digests_is_checked_by_what_its_files_allow(qe_run, tmp_path, caplog, kind):
    root = tmp_path / "checkpoints"
    shutil.copytree(qe_run / "checkpoints", root)
    strip_digests(root)
    with caplog.at_level(logging.INFO, logger="qeebm"):
        assert ckpt.newest_intact(root) == ckpt.step_dir(root, 3)  # intact: it still resumes
    assert f"{ckpt.step_dir(root, 3)} was written without file digests" in caplog.text and not warnings_of(caplog)
    caplog.clear()
    written = (root / "step-0000003" / "model.pt").read_bytes()
    damage(root / "step-0000003" / "model.pt", kind)
    with caplog.at_level(logging.INFO, logger="qeebm"):
        assert ckpt.newest_intact(root) == ckpt.step_dir(root, 2)
    # A cut archive has lost its directory (at the end); a flipped bit fails its part's CRC-32.
    cause = {"truncated": f"truncated or garbled ({len(written) // 2} bytes; BadZipFile: ", "empty": "empty (0 bytes)",
             "flipped": "changed (the CRC-32 of its part "}[kind]
    (line,) = warnings_of(caplog)
    assert line.startswith(f"skipped checkpoint step-0000003: {root / 'step-0000003' / 'model.pt'}: damaged: {cause}")


@pytest.mark.parametrize("digests", [True, False], ids=["digests", "before-digests"])
def test_a_run_with_damaged_newest_checkpoints_resumes_from_the_intact_one_exactly(kiwi_world, qe_run, tmp_path, digests):
    """The newest checkpoint's model.pt cut short (a copy between machines), the one before it with a
    flipped bit in its optimiser state: the same command resumes from step 1, and ends with the
    uninterrupted run's weights, optimiser, schedule and method state, and its losses."""
    run = tmp_path / "run"
    shutil.copytree(qe_run, run)
    root = run / "checkpoints"
    if not digests:
        strip_digests(root)
    cut = damage(root / "step-0000003" / "model.pt", "truncated")
    flipped = damage(root / "step-0000002" / "optimizer.pt", "flipped")
    # keep_last=1 prunes as the resumed run writes steps 2 and 3: the damaged ones are out of its way.
    assert train(qe_ebm_config(kiwi_world, run, "optim.max_steps=3", "output.keep_last=1")).step == 3
    log = (run / "train.log").read_text(encoding="utf-8")
    assert f"skipped checkpoint step-0000003: {root / 'step-0000003' / 'model.pt'}: damaged: " in log
    assert f"skipped checkpoint step-0000002: {root / 'step-0000002' / 'optimizer.pt'}: damaged: changed" in log
    assert f"resuming from {ckpt.step_dir(root, 1)} (step 1)" in log
    for name in ("model.pt", "optimizer.pt", "scheduler.pt", "method.pt"):
        assert_identical(ckpt.load_file(ckpt.step_dir(qe_run / "checkpoints", 3) / name),
                         ckpt.load_file(ckpt.step_dir(root, 3) / name), name)
    assert [r["loss"] for r in read_metrics(run)] == [r["loss"] for r in read_metrics(qe_run)]
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3]
    assert sorted(p.name for p in root.iterdir()) == ["step-0000002.damaged", "step-0000003", "step-0000003.damaged"]
    assert (root / "step-0000003.damaged" / "model.pt").read_bytes() == cut
    assert (root / "step-0000002.damaged" / "optimizer.pt").read_bytes() == flipped


@pytest.mark.parametrize("part", ["model.pt", "base.json"])
def test_a_damaged_lora_checkpoint_is_set_aside_and_the_run_resumes_exactly(kiwi_world, tmp_path, part):
    """A LoRA checkpoint (the adapters and the record of the frozen base) is checked like any other:
    a changed adapter file or base record sends the run back to the intact checkpoint before it."""
    args = ["model.lora.enabled=true", "model.lora.r=4", "optim.max_steps=2", "output.save_every=1"]
    straight, run = tmp_path / "straight", tmp_path / "run"
    train(make_config(kiwi_world["base"], straight, *args))
    shutil.copytree(straight, run)
    root = run / "checkpoints"
    assert (root / "step-0000002" / "base.json").is_file()
    damage(root / "step-0000002" / part, "flipped")
    train(make_config(kiwi_world["base"], run, *args))
    log = (run / "train.log").read_text(encoding="utf-8")
    assert f"skipped checkpoint step-0000002: {root / 'step-0000002' / part}: damaged: changed" in log
    assert f"resuming from {ckpt.step_dir(root, 1)} (step 1)" in log
    assert sorted(p.name for p in root.iterdir()) == ["step-0000001", "step-0000002", "step-0000002.damaged"]
    for name in ("model.pt", "optimizer.pt", "scheduler.pt"):
        assert_identical(ckpt.load_file(ckpt.step_dir(straight / "checkpoints", 2) / name),
                         ckpt.load_file(ckpt.step_dir(root, 2) / name), name)
    assert (ckpt.step_dir(root, 2) / "base.json").read_text() == (ckpt.step_dir(straight / "checkpoints", 2) / "base.json").read_text()
    assert [r["loss"] for r in read_metrics(run)] == [r["loss"] for r in read_metrics(straight)]


def test_a_run_whose_checkpoints_are_all_damaged_stops_with_one_line_naming_each(qe_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(qe_run, run)
    root = run / "checkpoints"
    bad = [root / "step-0000001" / "scheduler.pt", root / "step-0000002" / "rng-0.pt", root / "step-0000003" / "state.json"]
    for path, kind in zip(bad, KINDS):
        damage(path, kind)
    before = snapshot(root)
    # The same command as the run's: its own config.
    assert main(["train", "--config", str(run / "config.yaml"), f"output.run_dir={run}"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: cannot resume from {root}: no checkpoint is intact: ")
    assert all(f"{path}: damaged: " in line for path in bad)
    assert snapshot(root) == before  # nothing moved or deleted: the same command fails the same way


MODEL_CASES = [("digests", "model.safetensors", "truncated"), ("digests", "model.safetensors", "empty"),
               ("digests", "model.safetensors", "flipped"), ("digests", "tokenizer.json", "flipped"),
               ("none", "model.safetensors", "truncated"), ("none", "model.safetensors", "empty"),
               ("none", "config.json", "truncated")]


@pytest.mark.parametrize("record,name,kind", MODEL_CASES, ids=["-".join(c) for c in MODEL_CASES])
def test_translate_on_a_damaged_model_directory_is_one_line_naming_the_file(qe_run, tmp_path, capsys, record, name, kind):
    """final/ with its digests.json, and without one (a model directory from elsewhere: there a
    flipped tensor byte cannot be told from a trained one, a cut file can)."""
    model = tmp_path / "final"
    shutil.copytree(qe_run / "final", model)
    if record == "none":
        (model / "digests.json").unlink()
    size = (model / name).stat().st_size
    new = damage(model / name, kind)
    src = tmp_path / "src.txt"
    src.write_text("the cat sat\n", encoding="utf-8")
    assert main(["translate", "--model", str(model), "-i", str(src), "-o", str(tmp_path / "hyp.txt")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    cause = {("digests", "truncated"): f"truncated ({len(new)} of {size} bytes)",
             ("digests", "empty"): f"empty (0 of {size} bytes)",
             ("digests", "flipped"): "changed (same size, but its sha256 is not the one in digests.json)",
             ("none", "truncated"): "truncated (" if name.endswith(".safetensors") else "not valid JSON (",
             ("none", "empty"): "empty (0 bytes)"}[record, kind]
    assert line.startswith(f"error: {model / name}: damaged: {cause}")
    assert not (tmp_path / "hyp.txt").exists()


def test_evaluate_run_on_a_damaged_model_is_one_line_naming_the_file(kiwi_world, qe_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(qe_run, run)
    damage(run / "final" / "model.safetensors", "truncated")
    test = kiwi_world["base"].parent / "dev.tsv"
    assert main(["evaluate", "--run", str(run), "--test", str(test), "--no-neural"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: {run / 'final' / 'model.safetensors'}: damaged: truncated (")


def test_a_record_names_a_missing_or_grown_file_and_a_forged_record(tmp_path):
    (tmp_path / "a.pt").write_bytes(b"0123456789")
    (tmp_path / "b.json").write_text("{}")
    record = integrity.seal({"step": 4}, tmp_path, ["a.pt", "b.json"])
    assert record["files"]["a.pt"]["bytes"] == 10 and integrity.unsealed(record) == {"step": 4}
    where = tmp_path / "state.json"
    assert integrity.check(record, tmp_path, where) and not integrity.check({"step": 4}, tmp_path, where)
    (tmp_path / "a.pt").write_bytes(b"0123456789!")
    with pytest.raises(integrity.Damaged, match=re.escape(f"{tmp_path / 'a.pt'}: damaged: longer than written (11 bytes, 10 written)")):
        integrity.check(record, tmp_path, where)
    (tmp_path / "a.pt").unlink()
    with pytest.raises(integrity.Damaged, match=re.escape(f"{tmp_path / 'a.pt'}: damaged: missing (listed in state.json)")):
        integrity.check(record, tmp_path, where)
    # An edited value with the old digest, or a digest key lost to a flipped bit.
    for forged in ({**record, "step": 5}, {k: v for k, v in record.items() if k != "sha256"}):
        with pytest.raises(integrity.Damaged, match="does not match its own sha256"):
            integrity.check(forged, tmp_path, where)


def test_a_safetensors_file_must_end_where_its_header_says(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "model.safetensors"
    save_file({"w": torch.ones(4, 4)}, str(path))
    integrity.check_safetensors(path)
    data = path.read_bytes()
    for new, cause in ((data + b"\0", f"longer than its header says ({len(data) + 1} bytes, {len(data)} expected)"),
                       (data[:-1], f"truncated ({len(data) - 1} of {len(data)} bytes)"),
                       (data[:5], "truncated (5 bytes: shorter than its own header)"),
                       (data[:8] + b"{" * (len(data) - 8), "its header is not valid safetensors JSON")):
        path.write_bytes(new)
        with pytest.raises(integrity.Damaged, match=re.escape(f"{path}: damaged: {cause}")):
            integrity.check_safetensors(path)
