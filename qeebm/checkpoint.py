"""Training checkpoints: write atomically, find the newest, restore everything a resume needs.

A checkpoint is ``<run_dir>/checkpoints/step-XXXXXXX/`` holding ``model.pt`` (state dict of the
unwrapped model), ``optimizer.pt``, ``scheduler.pt``, ``state.json`` (the loop's counters), one
``rng-<rank>.pt`` per process and, for a method that owns state (``state_dict``/``load_state_dict``:
QE-dynamic's QE and its optimiser), ``method.pt``. It is assembled in a hidden temporary directory and renamed into place
only when every file is written, so an interrupted save leaves the previous checkpoint as the newest
complete one; resume ignores anything that is not a ``step-*`` directory.

``prepare_run_dir`` decides whether a run resumes: only from its own run directory, and only when
the config there differs at most in keys that do not change the weights (``RESUMABLE_CHANGES``).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
import yaml

from qeebm.config import Config, dump_config, to_dict
from qeebm.errors import QeebmError

STEP_DIR = re.compile(r"^step-(\d+)$")
# Config keys that may change between a run and its resume: they do not change the weights.
RESUMABLE_CHANGES = ("logging.", "output.", "optim.max_steps", "eval.every", "eval.patience")


@contextlib.contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Yield a temporary sibling of ``final`` to fill; on success it replaces ``final`` by rename.
    On an exception the temporary directory is removed and ``final`` is untouched."""
    final = Path(final)
    tmp = final.parent / f".tmp-{final.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _replace_dir(tmp, final)


def _replace_dir(src: Path, final: Path) -> None:
    # rename() cannot replace a non-empty directory: move the old one aside first, so a crash in
    # between leaves it recoverable under .old-* rather than half-overwritten.
    old = final.parent / f".old-{final.name}"
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(src, final)
    shutil.rmtree(old, ignore_errors=True)


def write_text_atomic(path: Path, text: str) -> None:
    path = Path(path)
    tmp = path.parent / f".tmp-{path.name}"
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------
# Random number generators


def rng_state() -> dict:
    """Python, numpy, torch CPU and (when present) CUDA generator states of this process, in a
    form ``torch.load(weights_only=True)`` accepts."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@contextlib.contextmanager
def preserve_rng() -> Iterator[None]:
    """Run a block (validation, say) without moving any generator, so how often it runs never
    changes the training trajectory."""
    saved = rng_state()
    try:
        yield
    finally:
        set_rng_state(saved)


# ----------------------------------------------------------------------------------------------
# Saving and loading


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step-{step:07d}"


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := STEP_DIR.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(root: Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1] if found else None


def save_checkpoint(root: Path, step: int, *, model, optimizer, scheduler, state: dict, accelerator, keep_last: int,
                    method_state: dict | None = None) -> Path:
    """Write checkpoint ``step`` under ``root`` from every process (collective: all must call).

    The main process writes the model, optimiser, scheduler and ``state``; every process writes its
    own RNG file into the same temporary directory; the main process renames it into place once all
    are done and then keeps only the newest ``keep_last`` checkpoints (``keep_last`` < 1 keeps all).
    ``method_state`` (the method's ``state_dict()``, the same on every process) goes to ``method.pt``.
    """
    root, final = Path(root), step_dir(root, step)
    tmp = root / f".tmp-{final.name}"
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()
    accelerator.wait_for_everyone()
    try:
        torch.save(rng_state(), tmp / f"rng-{accelerator.process_index}.pt")
        if accelerator.is_main_process:
            torch.save(accelerator.unwrap_model(model).state_dict(), tmp / "model.pt")
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
            (tmp / "state.json").write_text(json.dumps(state, indent=1), encoding="utf-8")
            if method_state is not None:
                torch.save(method_state, tmp / "method.pt")
    except BaseException:
        if accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        _replace_dir(tmp, final)
        if keep_last > 0:
            for old in list_checkpoints(root)[:-keep_last]:
                shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def config_changes(old: dict, new: dict, ignore: tuple[str, ...] = ()) -> list[str]:
    """Dotted keys whose values differ between two config dicts (a key missing from one side
    differs), leaving out keys that start with any prefix in ``ignore``."""

    def flat(d: dict, prefix: str = "") -> dict:
        out = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return out

    a, b = flat(old), flat(new)
    missing = object()
    return sorted(k for k in a.keys() | b.keys() if a.get(k, missing) != b.get(k, missing) and not k.startswith(ignore))


def read_state(path: Path) -> dict:
    return json.loads((Path(path) / "state.json").read_text(encoding="utf-8"))


def load_checkpoint(path: Path, *, model, optimizer, scheduler) -> dict:
    """Load model, optimiser and scheduler state from ``path`` in place; return the loop state.
    RNG states are restored separately (``restore_rng``), as the last thing before training."""
    path = Path(path)
    model.load_state_dict(torch.load(path / "model.pt", map_location="cpu", weights_only=True))
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True))
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", map_location="cpu", weights_only=True))
    return read_state(path)


def load_method_state(path: Path, method) -> None:
    """Restore the state a method owns (``method.pt``) when the method has any."""
    if not hasattr(method, "load_state_dict"):
        return
    file = Path(path) / "method.pt"
    if not file.is_file():
        raise QeebmError(f"cannot resume from {path}: it has no method.pt with the state of method '{getattr(method, 'name', '?')}'")
    method.load_state_dict(torch.load(file, map_location="cpu", weights_only=True))


def restore_rng(path: Path, rank: int) -> bool:
    """Restore this process's generators from ``path``; False when the checkpoint has no file for
    ``rank`` (it was written by fewer processes)."""
    file = Path(path) / f"rng-{rank}.pt"
    if not file.is_file():
        return False
    set_rng_state(torch.load(file, weights_only=True))
    return True


# ----------------------------------------------------------------------------------------------
# The run directory


def prepare_run_dir(cfg: Config, run_dir: Path, accelerator) -> Path | None:
    """Check ``run_dir`` against this run, write config.yaml; return the checkpoint to resume from."""
    saved, latest = run_dir / "config.yaml", latest_checkpoint(run_dir / "checkpoints")
    if latest is not None and not cfg.output.resume:
        raise QeebmError(f"{run_dir} already holds checkpoints ({latest.name}); set output.resume=true to continue, "
                         "or choose another output.run_dir")
    if saved.is_file() and cfg.output.resume:
        old = yaml.safe_load(saved.read_text(encoding="utf-8")) or {}
        differ = config_changes(old, to_dict(cfg), ignore=RESUMABLE_CHANGES)
        if differ:
            raise QeebmError(f"cannot resume {run_dir}: config differs in {', '.join(differ)} "
                             "(start the changed run in another output.run_dir)")
    accelerator.wait_for_everyone()  # everyone has read the old config before it is replaced
    if accelerator.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(saved, dump_config(cfg))
    accelerator.wait_for_everyone()
    return latest if cfg.output.resume else None
