"""One process and two processes with the same global batch train the same model (docs/design.md).

``tests/integration/test_loop.py::test_ddp_parity`` runs this script on a tiny world it prepared
(with ``tests`` on PYTHONPATH)

    ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2 --num_machines 1 \
        --mixed_precision no --dynamo_backend no tests/support/runs.py BASE.yaml [key=value ...]

and compares the run's metrics.jsonl curve and final checkpoint with a one-process run's. (``--cpu``
with two processes starts only one, hence ``--multi_gpu`` with ACCELERATE_USE_CPU.) The module also
holds the tiny-run set-up that the loop and checkpoint tests share.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import yaml

from qeebm.config import Config, load_config

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent


def assert_identical(a, b, where: str = "") -> None:
    """Nested state dicts equal bit for bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_identical(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_identical(x, y, f"{where}[{i}]")
    elif hasattr(a, "__dict__") and not isinstance(a, type):
        # A plain record (DeepSpeed's loss scaler): the same class and the same fields.
        assert type(a) is type(b), where
        assert_identical(vars(a), vars(b), where)
    else:
        assert a == b, where


def write_tiny_world(root: Path) -> Path:
    """A tiny random NLLB translator, 64 training and 16 dev pairs under ``root``, and a base config
    (``root/base.yaml``) for runs of a few steps: no warm-up, constant schedule, greedy validation
    on 8 dev pairs, logging every step, no periodic validation or checkpoints."""
    from qeebm.data.corpus import write_tsv

    from support.tiny import tiny_texts, tiny_translator_dir

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    texts = tiny_texts(160, seed=3)
    src, tgt = texts[0::2], texts[1::2]
    write_tsv(root / "train.tsv", src[:64], tgt[:64])
    write_tsv(root / "dev.tsv", src[64:80], tgt[64:80])
    base = {
        "seed": 7,
        "model": {"name_or_path": str(tiny_translator_dir("nllb")), "dropout": 0.0},
        "data": {"train": {"path": str(root / "train.tsv")}, "dev": {"path": str(root / "dev.tsv")}},
        "optim": {"lr": 1e-3, "warmup_steps": 0, "scheduler": "constant", "max_steps": 3, "batch_size": 8,
                  "grad_accum": 1, "max_grad_norm": 0.0, "weight_decay": 0.0},
        "generation": {"num_beams": 1, "max_new_tokens": 8, "batch_size": 8},
        "eval": {"every": 0, "max_examples": 8, "metric": "loss", "mode": "min"},
        "logging": {"every": 1, "report_to": [], "progress_bar": False},
        "output": {"save_every": 0, "keep_last": 2},
    }
    path = root / "base.yaml"
    path.write_text(yaml.safe_dump(base), encoding="utf-8")
    return path



def write_tiny_world_with_mono(root: Path) -> Path:
    """``write_tiny_world`` plus a 32-sentence source-only pool (``data.mono``), for the methods that sample."""
    from qeebm.data.corpus import write_lines

    from support.tiny import tiny_texts

    path = write_tiny_world(root)
    write_lines(Path(root) / "mono.txt", tiny_texts(64, seed=5)[0::2])
    values = yaml.safe_load(path.read_text(encoding="utf-8"))
    values["data"]["mono"] = {"path": str(Path(root) / "mono.txt")}
    path.write_text(yaml.safe_dump(values), encoding="utf-8")
    return path

def make_config(base: Path, run_dir: Path, *overrides: str) -> Config:
    return load_config(base, [f"output.run_dir={run_dir}", *overrides])


def read_metrics(run_dir: Path) -> list[dict]:
    """Training records of metrics.jsonl (validation records left out), in order."""
    lines = (Path(run_dir) / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [r for r in map(json.loads, lines) if "loss" in r]


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    """Model state of the newest checkpoint in ``run_dir`` (of a LoRA run: its trainable tensors)."""
    from qeebm.training.checkpoint import latest_checkpoint

    found = latest_checkpoint(Path(run_dir) / "checkpoints")
    assert found is not None, f"no checkpoint in {run_dir}"
    return torch.load(found / "model.pt", weights_only=True)


def assert_only_adapters_trained(before: dict[str, torch.Tensor], run_dir: Path, scaling: float) -> None:
    """A LoRA run changed its adapters and nothing else. ``before``: the peft model's state dict at the
    start; ``scaling``: lora alpha / r. The newest checkpoint holds exactly the adapters, each changed;
    ``final/`` (merged) holds the base as it was, plus ``scaling`` x B @ A on each adapted layer."""
    from safetensors.torch import load_file

    after = final_weights(run_dir)
    adapters = sorted(k for k in before if "lora_" in k)
    assert adapters and sorted(after) == adapters
    assert [k for k in adapters if torch.equal(before[k], after[k])] == []
    merged, seen = load_file(str(Path(run_dir) / "final" / "model.safetensors")), set()
    for key, value in before.items():
        name = key.removeprefix("base_model.model.").replace(".base_layer.", ".")
        if "lora_" in key or name not in merged:  # the file keeps one name of tied weights
            continue
        if key.endswith(".base_layer.weight"):
            layer = key.removesuffix("base_layer.weight")
            delta = after[f"{layer}lora_B.default.weight"] @ after[f"{layer}lora_A.default.weight"]
            torch.testing.assert_close(merged[name], value + scaling * delta, msg=name)
        else:
            assert torch.equal(merged[name], value), name
        seen.add(name)
    assert seen == merged.keys()


def launch_two(base: Path, run_dir: Path, *args: str, backend: str = "ddp", script: Path | None = None):
    """This script (or ``script``, which takes the same arguments) under ``accelerate launch`` with 2
    CPU processes: DDP over gloo, or ``backend="deepspeed"`` with recipes/accelerate/deepspeed_zero2.yaml
    (DeepSpeed's CPU accelerator). The launcher gets a process group of its own, so a test can always
    end it."""
    import subprocess

    env = launch_env()
    if backend == "deepspeed":
        env[GLOO_ONLY] = "1"
        launch = ["--config_file", str(REPO / "recipes/accelerate/deepspeed_zero2.yaml"), "--num_processes", "2"]
    else:
        # ``--cpu`` with two processes starts only one, hence ``--multi_gpu`` with ACCELERATE_USE_CPU.
        launch = ["--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
                  "--dynamo_backend", "no"]
        env["ACCELERATE_USE_CPU"] = "true"
    cmd = [*LAUNCH, *launch, "--main_process_port", str(free_port()), str(script or Path(__file__).resolve()), str(base),
           *args, f"output.run_dir={run_dir}"]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


# Set for DeepSpeed runs: reduce over gloo, not DeepSpeed's shared-memory kernels (``main``).
GLOO_ONLY = "QEEBM_TEST_DEEPSPEED_GLOO"

# `accelerate launch` as the recipes start it: accelerate's launcher without its CLI, which imports
# every other subcommand first (2 s of each launch's start here).
LAUNCH = [sys.executable, "-m", "accelerate.commands.launch"]


def launch_env() -> dict[str, str]:
    """A launched run's environment: one thread a process, no hub, and the repository and tests
    importable."""
    import os

    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS), os.environ.get("PYTHONPATH", "")])}


def free_port() -> int:
    """A TCP port free on this machine now, for a launcher's main process."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def finish(proc, timeout: float, name: str = "run") -> str:
    """The output of a launched run; its whole process group is killed if it overruns ``timeout``."""
    import os
    import signal
    import subprocess

    import pytest

    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"{name} did not finish in {timeout:.0f} s")


def signal_one_process(spec: str) -> None:
    """``RANK:N`` (env ``QEEBM_TEST_SIGNAL``): process RANK alone raises SIGUSR1 in the middle of its
    N-th micro-step (counted over the run by backward passes), as when a signal reaches one worker
    of a job before the others."""
    import os
    import signal

    import qeebm.training.loop

    rank, n = map(int, spec.split(":"))
    if int(os.environ.get("RANK", "0")) != rank:
        return
    real, ran = qeebm.training.loop.backward, []

    def backward(accelerator, loss):
        ran.append(1)
        if len(ran) == n:
            signal.raise_signal(signal.SIGUSR1)
        real(accelerator, loss)

    qeebm.training.loop.backward = backward


def main(argv: list[str]) -> None:
    import os

    from qeebm.training.loop import train

    if os.environ.get(GLOO_ONLY):
        # DeepSpeed's CPU accelerator reduces over shared memory with kernels it compiles at first use,
        # about 60 s of g++ in every new environment (the build depends on the venv's path); over gloo,
        # as the DDP runs, the tests compare ZeRO-2's own arithmetic.
        import importlib

        # By its module object: the package's attribute `torch` is torch itself.
        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    if os.environ.get("QEEBM_TEST_SIGNAL"):
        signal_one_process(os.environ["QEEBM_TEST_SIGNAL"])
    cfg = load_config(argv[0], argv[1:])
    train(cfg)


if __name__ == "__main__":
    main(sys.argv[1:])
