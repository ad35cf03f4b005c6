"""Training checkpoints: write atomically, find the newest, restore everything a resume needs.

A checkpoint is ``<run_dir>/checkpoints/step-XXXXXXX/`` holding ``model.pt`` (state dict of the
unwrapped model; of an adapter model, LoRA or bottleneck, only the tensors that train, and
``base.json`` names the frozen base they belong to: ``base_record``), ``optimizer.pt`` (under
DeepSpeed one ``optimizer-<rank>.pt`` per process: each holds its partition), ``scheduler.pt``,
``state.json`` (the loop's counters), one ``rng-<rank>.pt`` per process and, for a method that owns
state (``state_dict``/``load_state_dict``: QE-dynamic's QE and its optimiser), ``method.pt``. It is
assembled in a hidden temporary directory and renamed into place only when every process has written
its files, so a failed or interrupted save leaves the previous checkpoint as the newest complete one;
resume ignores anything that is not a ``step-*`` directory, and older checkpoints are pruned
(``output.keep_last``) only after the new one is in place.

A file can still be damaged afterwards (a copy cut short, a failing disk, a sync tool): ``state.json``
records the size and sha256 of every other file and of its own content (``qeebm.utils.integrity``), and
resume checks them before it loads anything (``resume_checkpoint``). A damaged checkpoint is skipped
with a one-line warning and set aside as ``step-XXXXXXX.damaged`` (never deleted; out of the way of
pruning and of the checkpoint the resumed run writes at that step), and the run resumes from the
newest intact one; when none is intact the run stops with one line naming each, and nothing moves.

Every file is read back with ``torch.load(weights_only=True)``: tensors and plain containers only,
so a checkpoint from elsewhere cannot run code when loaded. DeepSpeed's optimiser partitions hold a
few of DeepSpeed's own records besides (its loss scaler, the partitions' fragment addresses); those,
and nothing else, are allowed by name (``_deepspeed_safe_globals``).

An adapter model's frozen base is most of its weights (mBART-50: 611M parameters against 2.4M in
the LoRA adapters) and never changes, so its checkpoints leave it out: the run loads the base from its
config, as at the start, and resume checks that it is the one the checkpoint recorded (``check_base``).

``prepare_run_dir`` decides whether a run resumes: only from its own run directory, and only when
the config there differs at most in keys that do not change the weights (``RESUMABLE_CHANGES``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import random
import re
import shutil
import zipfile
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
import yaml

from qeebm.config import (
    Config,
    dump_config,
    flat_dict,
    saved_added_sections,
    saved_sampler_defaults,
    to_dict,
    upgrade_keys,
)
from qeebm.errors import QeebmError, first_line
from qeebm.translation.translator import weight_files
from qeebm.utils.integrity import Damaged, check, read_record, seal, unsealed

log = logging.getLogger(__name__)

STATE = "state.json"
BASE = "base.json"  # an adapter checkpoint's record of its frozen base
STEP_DIR = re.compile(r"^step-(\d+)$")
# Config keys that may change between a run and its resume: they do not change the weights.
RESUMABLE_CHANGES = ("logging.", "output.", "optim.max_steps", "optim.max_epochs", "optim.min_epochs",
                     "optim.max_nonfinite_steps", "eval.every", "eval.patience", "eval.bleu_tokenize",
                     "model.gradient_checkpointing", "qe.gradient_checkpointing")


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


def _all_ok(accelerator, ok: bool) -> bool:
    """Whether ``ok`` holds on every process: a reduction instead of a barrier, so a process whose
    write failed still meets the others (a barrier would leave them waiting forever)."""
    if accelerator.num_processes == 1:
        return ok
    failed = torch.tensor([0.0 if ok else 1.0], device=accelerator.device)
    return accelerator.reduce(failed, "sum").item() == 0


def save_checkpoint(root: Path, step: int, *, model, optimizer, scheduler, state: dict, accelerator, keep_last: int,
                    method_state: dict | None = None, optimizer_per_process: bool = False,
                    base: dict | None = None) -> Path:
    """Write checkpoint ``step`` under ``root`` from every process (collective: all must call).
    ``model`` is the unwrapped translator: its weights are whole on every process under each
    backend the loop runs (backends.py).

    The main process writes the model, optimiser, scheduler and ``state``; every process writes its
    own RNG file (and, with ``optimizer_per_process``, its optimiser partition: DeepSpeed) into the
    same temporary directory; the main process renames it into place once all succeeded and then
    keeps only the newest ``keep_last`` checkpoints (``keep_last`` < 1 keeps all). ``method_state``
    (the method's ``state_dict()``, the same on every process) goes to ``method.pt``. ``base``, for a
    model that trains adapters only (LoRA, bottleneck), is its frozen base's ``base_record``: then
    ``model.pt`` holds only the tensors that train (``trainable_state``) and ``base.json`` the record.

    A failed write (disk full, no permission) on any process removes the temporary directory and
    raises ``QeebmError`` naming the checkpoint and the cause on every process; the previous
    checkpoints are untouched.
    """
    root, final = Path(root), step_dir(root, step)
    tmp = root / f".tmp-{final.name}"
    rank = accelerator.process_index
    error: BaseException | None = None
    if accelerator.is_main_process:
        try:
            root.mkdir(parents=True, exist_ok=True)
            for stale in root.glob(".tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
            tmp.mkdir()
        except OSError as err:
            error = err
    if _all_ok(accelerator, error is None):
        try:
            torch.save(rng_state(), tmp / f"rng-{rank}.pt")
            if optimizer_per_process:
                torch.save(optimizer.state_dict(), tmp / f"optimizer-{rank}.pt")
            if accelerator.is_main_process:
                torch.save(model.state_dict() if base is None else trainable_state(model), tmp / "model.pt")
                if base is not None:
                    (tmp / BASE).write_text(json.dumps(base, indent=1), encoding="utf-8")
                if not optimizer_per_process:
                    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
                torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
                if method_state is not None:
                    torch.save(method_state, tmp / "method.pt")
        except Exception as err:  # noqa: BLE001 - any failure of a write is reported below, on every process
            error = err
    # The state file goes last, once every process's files are in place: it records their digests.
    if _all_ok(accelerator, error is None) and accelerator.is_main_process:
        try:
            names = [p.name for p in tmp.iterdir() if p.is_file()]
            (tmp / STATE).write_text(json.dumps(seal(state, tmp, names), indent=1), encoding="utf-8")
        except Exception as err:  # noqa: BLE001 - as above
            error = err
    if not _all_ok(accelerator, error is None):
        if accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        previous = latest_checkpoint(root)
        cause = f"{type(error).__name__}: {error}" if error is not None else "a write failed on another process"
        raise QeebmError(f"could not write checkpoint {final}: {cause}; the previous checkpoint "
                         f"({previous if previous is not None else 'none'}) is untouched") from error
    if accelerator.is_main_process:
        _replace_dir(tmp, final)
        # Only step-* directories are pruned: a checkpoint set aside as damaged never is.
        if keep_last > 0:
            for old in list_checkpoints(root)[:-keep_last]:
                shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def config_changes(old: dict, new: dict, ignore: tuple[str, ...] = ()) -> list[str]:
    """Dotted keys whose values differ between two config dicts (a key missing from one side
    differs), leaving out keys that start with any prefix in ``ignore``."""

    a, b = flat_dict(old), flat_dict(new)
    missing = object()
    return sorted(k for k in a.keys() | b.keys() if a.get(k, missing) != b.get(k, missing) and not k.startswith(ignore))


def read_state(path: Path) -> dict:
    """The loop state a checkpoint's ``state.json`` holds (without its digests)."""
    return unsealed(read_record(Path(path) / STATE))


def load_file(path: Path):
    """``torch.load`` of one checkpoint file, tensors and plain containers only (``weights_only``):
    a pickle that would run code or build other objects is refused with a one-line error, and a
    file that cannot be read is named with the cause."""
    try:
        with torch.serialization.safe_globals(_deepspeed_safe_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        # torch's message is a page of advice; the refused name is the part that matters.
        found = re.search(r"Unsupported global: GLOBAL (\S+)|Unsupported operand \d+", str(err))
        what = found.group(1) or found.group(0) if found else type(err).__name__
        raise QeebmError(f"{path}: refused to load: it holds more than tensors and plain containers ({what})") from None
    except FileNotFoundError:
        raise Damaged(path, "missing") from None
    except (OSError, EOFError, RuntimeError, ValueError) as err:  # how torch reports a cut or garbled file
        raise Damaged(path, f"cannot be read ({type(err).__name__}: {first_line(err)})") from None


def _deepspeed_safe_globals() -> list:
    """DeepSpeed's own classes in its ZeRO optimiser's state dict (a loss scaler, ...), when it is
    installed: plain records, allowed by name. Nothing else besides tensors and containers loads."""
    try:
        from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address
    except ImportError:
        return []
    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


def trainable_state(model) -> dict[str, torch.Tensor]:
    """The entries of ``model``'s state dict that train (``requires_grad``): an adapter model's
    adapters and any other parameter left trainable, under every name it has (tied names included)."""
    state, copies = {}, {}
    for key, value in model.state_dict(keep_vars=True).items():
        if value.requires_grad:
            # Copied, once per parameter: one can be a view into a larger buffer (DeepSpeed's flat
            # groups), and torch.save writes a view's whole storage.
            if id(value) not in copies:
                copies[id(value)] = value.detach().clone()
            state[key] = copies[id(value)]
    return state


def load_model(path: Path, model) -> None:
    """The checkpoint's weights into ``model`` (the unwrapped translator), in place. An adapter
    checkpoint (``base.json``) fills the tensors that train, which must be exactly the model's; the
    frozen rest stays as loaded (``check_base`` tells whether it is the recorded base)."""
    path = Path(path)
    state = load_file(path / "model.pt")
    if not (path / BASE).is_file():
        model.load_state_dict(state)
        return
    _check_trainable(path / "model.pt", state, model)
    model.load_state_dict(state, strict=False)


def _check_trainable(file: Path, state: dict, model) -> None:
    """``state`` must be exactly ``model``'s trainable tensors, names and shapes: a partial load
    would leave the rest as initialised without a word."""
    want = {k: v.shape for k, v in trainable_state(model).items()}
    got = {k: v.shape for k, v in state.items()}
    if got == want:
        return
    missing, extra = sorted(want.keys() - got.keys()), sorted(got.keys() - want.keys())
    shaped = sorted(k for k in want.keys() & got.keys() if want[k] != got[k])
    raise QeebmError(f"{file}: its tensors are not this model's trainable ones ({len(missing)} missing, "
                     f"{len(extra)} unknown, {len(shaped)} of another shape; first {(missing + extra + shaped)[0]}): "
                     "written with other model.lora or model.bottleneck settings?")


def base_record(name_or_path: str) -> dict:
    """What an adapter checkpoint records of the frozen base its adapters were trained on: its name
    (hub id or directory) and a digest of its weight files, the sha256 of their ``seal`` record (each
    file's size and sha256), which tells another base behind the same name."""
    root, names = weight_files(name_or_path)
    return {"name_or_path": name_or_path, "sha256": seal({}, root, names)["sha256"]}


def check_base(path: Path, base: dict | None) -> None:
    """Raise a one-line QeebmError when checkpoint ``path`` holds adapters trained on another
    frozen base than ``base`` (this run's ``base_record``; None: the run trains the whole model). A
    checkpoint of the full state dict needs no base."""
    path = Path(path)
    if not (path / BASE).is_file():
        return
    saved = read_record(path / BASE)
    then = f"{saved.get('name_or_path')} (weights sha256 {str(saved.get('sha256'))[:12]})"
    if base is None:
        raise QeebmError(f"cannot resume from {path}: it holds only adapters, trained on {then}, "
                         "and this run trains the whole model")
    if saved.get("sha256") != base["sha256"]:
        now = f"{base['name_or_path']} (weights sha256 {base['sha256'][:12]})"
        raise QeebmError(f"cannot resume from {path}: its adapters were trained on the base {then}, "
                         f"but this run's base is {now}; resume on that base, or start anew in another output.run_dir")


def load_training_state(path: Path, *, optimizer, scheduler, accelerator) -> dict:
    """Optimiser and scheduler state from ``path`` (into the prepared optimiser); return the loop
    state. RNG states are restored separately (``restore_rng``), as the last thing before training."""
    path = Path(path)
    if (path / "optimizer.pt").is_file():
        optimizer.load_state_dict(load_file(path / "optimizer.pt"))
    else:
        # DeepSpeed: every process reads its own partition, which only fits the same process count.
        rank, world = accelerator.process_index, accelerator.num_processes
        written = len(list(path.glob("optimizer-*.pt")))
        if written != world or not (path / f"optimizer-{rank}.pt").is_file():
            raise QeebmError(f"cannot resume from {path}: its optimiser state is split over {written} DeepSpeed "
                             f"process(es); resume with {written}, not {world}")
        parts: list = [None] * world
        parts[rank] = load_file(path / f"optimizer-{rank}.pt")
        # The ZeRO optimiser's own loader; fp32 master weights from the partition, not the model.
        inner = getattr(optimizer, "optimizer", optimizer)
        inner.load_state_dict(parts, load_from_fp32_weights=True)
    scheduler.load_state_dict(load_file(path / "scheduler.pt"))
    return read_state(path)


def load_method_state(path: Path, method) -> None:
    """Restore the state a method owns (``method.pt``); a method with none (SFT) needs no file."""
    file = Path(path) / "method.pt"
    if not file.is_file():
        if method.state_dict():
            raise QeebmError(f"cannot resume from {path}: it has no method.pt with the state of method '{method.name}'")
        return
    method.load_state_dict(load_file(file))


def restore_rng(path: Path, rank: int) -> bool:
    """Restore this process's generators from ``path``; False when the checkpoint has no file for
    ``rank`` (it was written by fewer processes)."""
    file = Path(path) / f"rng-{rank}.pt"
    if not file.is_file():
        return False
    set_rng_state(load_file(file))
    return True


# ----------------------------------------------------------------------------------------------
# Checking before a resume


def verify_checkpoint(path: Path) -> None:
    """Raise ``Damaged`` naming a file of checkpoint ``path`` that is not what was written, and how.

    The digests in its state file cover every file. A checkpoint written before they were recorded
    gets what its files allow (and says so at INFO): its state file must parse, its model, optimiser
    and scheduler files exist, and each ``.pt`` file (a zip archive) match its members' CRC-32s."""
    path = Path(path)
    state = path / STATE
    if check(read_record(state), path, state):
        return
    log.info("%s was written without file digests: checked its state file's JSON and its files' zip CRC-32s only", path)
    for name in ("model.pt", "scheduler.pt"):
        if not (path / name).is_file():
            raise Damaged(path / name, "missing")
    if not (path / "optimizer.pt").is_file() and not any(path.glob("optimizer-*.pt")):
        raise Damaged(path / "optimizer.pt", "missing")
    for file in sorted(path.glob("*.pt")):
        _check_zip(file)


def _check_zip(path: Path) -> None:
    size = path.stat().st_size
    if size == 0:
        raise Damaged(path, "empty (0 bytes)")
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except Exception as err:  # noqa: BLE001 - zipfile reports a cut or garbled archive in several ways
        raise Damaged(path, f"truncated or garbled ({size} bytes; {type(err).__name__}: {first_line(err)})") from None
    if bad is not None:
        raise Damaged(path, f"changed (the CRC-32 of its part {bad} does not match)")


def newest_intact(root: Path) -> Path | None:
    """The newest checkpoint under ``root`` that passes ``verify_checkpoint``; None when there is
    none at all. Each newer one that fails is set aside (``set_aside``) with a one-line warning
    naming the file and the cause. When none passes, a QeebmError names every one, and nothing is
    moved: the same command then fails the same way instead of starting over."""
    skipped: list[tuple[Path, str]] = []
    for path in reversed(list_checkpoints(root)):
        try:
            verify_checkpoint(path)
        except (QeebmError, OSError) as err:
            skipped.append((path, str(err)))
            continue
        for bad, cause in skipped:
            aside = set_aside(bad)
            log.warning("skipped checkpoint %s: %s; kept as %s; resuming from %s", bad.name, cause, aside.name, path.name)
        return path
    if skipped:
        raise QeebmError(f"cannot resume from {root}: no checkpoint is intact: {'; '.join(c for _, c in skipped)} "
                         "(all left as they are)")
    return None


def set_aside(path: Path) -> Path:
    """Rename checkpoint ``path`` to ``<name>.damaged`` (``.damaged-2``, ... when taken): out of the
    ``step-*`` names that resume, pruning and the next save at that step act on."""
    aside, n = path.with_name(f"{path.name}.damaged"), 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}.damaged-{n}")
    try:
        os.rename(path, aside)
    except OSError as err:
        raise QeebmError(f"cannot set the damaged checkpoint {path} aside as {aside.name} ({err}); "
                         "move it out of the way to resume") from None
    return aside


def resume_checkpoint(root: Path, accelerator) -> Path | None:
    """``newest_intact`` of ``root``, found by the main process, the same on every process
    (collective: all must call). Only the main process reads, renames and warns."""
    found, error = None, None
    if accelerator.is_main_process:
        try:
            found = newest_intact(root)
        except Exception as err:  # noqa: BLE001 - the others learn of it below rather than wait forever
            error = err
    if accelerator.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        box = broadcast_object_list([str(found) if found is not None else None, str(error) if error else None])
        found = Path(box[0]) if box[0] is not None else None
        if error is None and box[1] is not None:
            raise QeebmError(box[1])
    if error is not None:
        raise error
    return found


# ----------------------------------------------------------------------------------------------
# The run directory


def prepare_run_dir(cfg: Config, run_dir: Path, accelerator) -> Path | None:
    """Check ``run_dir`` against this run, write config.yaml; return its newest checkpoint when the
    run resumes (unchecked: ``resume_checkpoint`` chooses the one to load)."""
    saved, latest = run_dir / "config.yaml", latest_checkpoint(run_dir / "checkpoints")
    if latest is not None and not cfg.output.resume:
        raise QeebmError(f"{run_dir} already holds checkpoints ({latest.name}); set output.resume=true to continue, "
                         "or choose another output.run_dir")
    if saved.is_file() and cfg.output.resume:
        old = yaml.safe_load(saved.read_text(encoding="utf-8")) or {}
        old = saved_added_sections(saved_sampler_defaults(upgrade_keys(old, warn=False)))
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
