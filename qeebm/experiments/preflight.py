"""Everything a recipe's plan will touch, checked before its first training step.

``needs(plan)`` lists the translator, the corpus (or the tiny world's files) and every quality
estimator a run trains against, validates on or is evaluated with (COMET-Kiwi, COMET, XCOMET, the
judges), each with the roles it plays. Two rounds check them:

- ``access``: seconds. Each is a local path that is there, in the local Hugging Face cache, or on
  the hub and readable from here, asked of the hub client (``qeebm/utils/hub.py``: proxies, the login, a
  gated model's licence). Every real run does this before its data step, so a licence not accepted
  for XCOMET, which only the evaluation reads, stops the recipe before eighteen trainings, not after.
- ``fetch``: downloads each (the corpus through the data step itself) and loads it once on the CPU,
  as the run will, then frees it. ``recipes/<pair>.sh --check`` runs both rounds.

Each need prints one line, ``ok`` or ``FAIL`` with the reason; the first round with a failure ends
in one QeebmError that counts them.
"""

from __future__ import annotations

import gc
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from qeebm.data.corpus import read_corpus
from qeebm.errors import QeebmError
from qeebm.utils import hub


@dataclass
class Need:
    kind: str  # "translator" | "corpus" | "files" | "qe"
    name: str  # hub id, local path, or the corpus' description
    roles: list[str] = field(default_factory=list)

    def label(self) -> str:
        """``qe X (training: reinforce, ppo; validation: kiwi)``: each use once, with who uses it."""
        uses: dict[str, list[str]] = {}
        for role in dict.fromkeys(self.roles):
            use, _, who = role.partition(": ")
            uses.setdefault(use, []).append(who)
        text = "; ".join(f"{use}: {', '.join(w for w in who if w)}" if any(who) else use for use, who in uses.items())
        return f"{self.kind} {self.name} ({text})"


def needs(plan) -> list[Need]:
    """What ``plan`` (a qeebm.experiments.recipe.Plan) will load, in the order the recipe loads it."""
    from qeebm.training.loop import qe_metric_path, validation_qe_metrics

    found: dict[tuple[str, str], Need] = {}

    def add(kind: str, name: str, role: str) -> None:
        found.setdefault((kind, name), Need(kind, name)).roles.append(role)

    for run in plan.runs:
        add("translator", run.cfg.model.name_or_path, f"trained: {run.system}")
    if plan.tiny is None:
        add("corpus", plan.recipe.corpus.describe(), f"data step: {plan.data_dir}")
    else:
        for split in ("train", "dev", "test", "mono"):
            add("files", getattr(plan.runs[0].cfg.data, split).path, f"split: {split}")
    for run in plan.runs:
        if run.system != "sft":
            terms = run.cfg.reward.terms
            # sentence chrF++ ("chrf") loads nothing
            for path in [t.path for t in terms if t.path != "chrf"] if terms else [run.cfg.qe.path]:
                add("qe", path, f"training reward: {run.system}")
        for name in validation_qe_metrics(run.cfg):
            add("qe", qe_metric_path(run.cfg, name), f"validation: {name}")
    spec = plan.metric_spec()
    models = spec.qe_models()
    for name in spec.selected():
        if name in models:
            add("qe", models[name], f"evaluation: {name}")
    if plan.rerank:
        add("qe", plan.metrics["kiwi"], "reranking: kiwi")
    return list(found.values())


# ----------------------------------------------------------------------------------------------
# Round 1: access


def _is_local(name: str) -> bool:
    return name.startswith((".", "/", "~")) or Path(name).expanduser().exists()


def _access(need: Need, plan) -> str:
    from qeebm.data.prepare import check_hub, is_prepared

    if need.kind == "files":
        if not Path(need.name).is_file():
            raise QeebmError(f"{need.name} does not exist")
        return "there"
    if need.kind == "corpus":
        if is_prepared(plan.data_dir):
            return f"prepared in {plan.data_dir}"
        check_hub(plan.recipe.corpus, plan.data_dir)
        return "on the hub, readable from here"
    if _is_local(need.name):
        if need.kind == "qe":
            from qeebm.qe.models import resolve_checkpoint

            resolve_checkpoint(need.name)
        elif not Path(need.name).expanduser().is_dir():
            raise QeebmError(f"translator directory '{need.name}' does not exist")
        return "a local directory"
    if need.kind == "qe":
        from qeebm.qe.models import CHECKPOINT, KNOWN_ENCODERS

        where = hub.require(need.name, required=str(CHECKPOINT))
        if need.name in KNOWN_ENCODERS:
            # comet reads the encoder's config and tokenizer from its own repository.
            hub.require(KNOWN_ENCODERS[need.name], required="config.json")
        return where
    return hub.require(need.name, required="config.json")


# ----------------------------------------------------------------------------------------------
# Round 2: download and load


def _parameters(model) -> str:
    n = sum(p.numel() for p in model.parameters())
    return f"{n / 1e9:.1f}B parameters" if n >= 1e9 else f"{n / 1e6:.0f}M parameters" if n >= 1e6 else \
        f"{n:,} parameters"


def _fetch(need: Need, plan) -> str:
    if need.kind == "translator":
        from qeebm.translation.translator import Translator

        cfg = next(r.cfg.model for r in plan.runs if r.cfg.model.name_or_path == need.name)
        model = Translator.load(cfg).model
        return f"loaded, {_parameters(model)}"
    if need.kind == "qe":
        from qeebm.qe.models import load_qe, qe_kind

        model = load_qe(need.name)
        return f"loaded, {qe_kind(model)}, {_parameters(model)}"

    if need.kind == "corpus":
        plan.prepare_corpus()
    data = plan.runs[0].cfg.data
    splits = ("train", "dev", "test", "mono") if need.kind == "corpus" else [r.partition(": ")[2] for r in need.roles]
    counts = [f"{len(read_corpus(getattr(data, s), s, need_target=s != 'mono').src)} {s}" for s in splits]
    return "read, " + ", ".join(counts)


# ----------------------------------------------------------------------------------------------


def _round(title: str, items: list[Need], step: Callable[[Need, object], str], plan, out) -> None:
    failed = 0
    for need in items:
        start = time.monotonic()
        try:
            detail = step(need, plan)
        except QeebmError as err:
            failed += 1
            print(f"  FAIL {need.label()}: {err}", file=out, flush=True)
        else:
            print(f"  ok   {need.label()}: {detail} ({time.monotonic() - start:.0f} s)", file=out, flush=True)
        gc.collect()
    if failed:
        raise QeebmError(f"{title}: {failed} of {len(items)} models and data sets failed (the FAIL lines above); "
                         "nothing was trained")


def access(plan, out=None, items: Optional[list[Need]] = None) -> None:
    """Round 1 over ``needs(plan)``: seconds, nothing downloaded (a QeebmError if any fails)."""

    _round("access check", needs(plan) if items is None else items, _access, plan, out or sys.stderr)


def check(plan, out=None) -> None:
    """Both rounds, what ``--check`` does: access, then download and load everything once."""

    out = out or sys.stdout
    items = needs(plan)
    print(f"check 1/2, access: {len(items)} models and data sets", file=out, flush=True)
    access(plan, out, items)
    print("check 2/2, download and load each once on the CPU (the large ones take minutes the first time)",
          file=out, flush=True)
    _round("download and load", items, _fetch, plan, out)
