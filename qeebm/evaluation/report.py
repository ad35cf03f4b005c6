"""The evaluation report: one JSON file per evaluated system and split (``<run>/eval/<split>.json``).

A report keeps the per-segment rows, not just corpus numbers, so ``scripts/compare.py`` can bootstrap
any metric by resampling rows (sacrebleu's paired bootstrap resampling, applied to every metric)::

    {"format": "qeebm-eval/1",
     "system": "qe-ebm-static",          # table row; several seeds of one system share it
     "seed": 231,                        # int, or null for an untrained model
     "config_id": "3f2a...",             # config_id() of the training config: equal across seeds
     "model": "...", "decoding": {...},  # free-form provenance
     "data": {"path": "...", "sha256": "..."},            # sha256 is required: compare refuses mixed test sets
     "versions": {"qeebm": ..., "sacrebleu": ..., "comet": ..., "torch": ...},
     "corpus": {"bleu": 23.4, "chrf": 51.2, "ter": 60.1, "comet": 0.81, ...},
     "signatures": {"bleu": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0", ...},
     "segments": {"src": [...], "ref": [...], "hyp": [...],               # ref and hyp are required
                  "comet": [...], "kiwi": [...], "judge": [...]},        # any other key: one number per segment
     "trained_on": "kiwi",              # the QE the system was optimised against, or null
     "heldout": ["judge", "comet"],     # judges it never saw in training (nor in selection)
     # only for a composite reward (reward.terms): every term, and the metric it is (or null)
     "reward_terms": [{"name": "kiwi", "path": "...", "weight": 1.0, "metric": "kiwi"}, ...],
     # only when the hypotheses were chosen among candidates (qeebm/translation/qad.py, --rerank / --mbr):
     "selection": {"rule": "rerank", "model": "...", "utility": null, "candidates": 8, "mode": "beam",
                   "signature": "rule:rerank|qe:...|candidates:8|gen:beam8|max_new:50",  # also signatures.selection
                   "changed": 0.41, "seconds": {"generate": 9.1, "select": 0.6}, "ms_per_segment": 19.4},
     "selected_on": "kiwi"}             # the metric whose model chose them, or null

BLEU, chrF++ and TER are not stored per segment: they are recomputed from ``hyp``/``ref`` as
sacrebleu's additive sufficient statistics (``segment_stats``), with the options read back from the
report's signature. BLEU's tokenizer is sacrebleu's default for the target language (zh for
Chinese, ja-mecab for Japanese, ko-mecab for Korean, 13a otherwise: ``bleu_tokenizer``) unless one
is chosen; the signature's ``tok:`` records it. A neural metric is the same thing with the
statistics ``[score, 1]``, so one resampling routine serves both kinds and a resampled corpus score
equals the score of the resampled corpus exactly.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from qeebm.config import config_from_dict, to_dict, upgrade_keys
from qeebm.errors import QeebmError
from qeebm.metrics.registry import SACREBLEU_METRICS, SELECTION_RULES
from qeebm.metrics.sacrebleu import corpus_from_stats, metric_signature, segment_stats

FORMAT = "qeebm-eval/1"
TEXT_KEYS = ("src", "ref", "hyp")


def _fail(where: Any, message: str):
    raise QeebmError(f"{where}: {message}")


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def validate_report(report: Any, where: Any = "report") -> dict:
    """Check the structure described in the module docstring; return the report unchanged.
    Raises a one-line ``QeebmError`` naming ``where`` and the first missing or bad key."""
    if not isinstance(report, dict):
        _fail(where, f"expected a JSON object, found {type(report).__name__}")
    for key in ("format", "system", "seed", "data", "segments"):
        if key not in report:
            _fail(where, f"missing key '{key}'")
    if report["format"] != FORMAT:
        _fail(where, f"key 'format' is {report['format']!r}, expected '{FORMAT}'")
    if not isinstance(report["system"], str) or not report["system"].strip():
        _fail(where, "key 'system' must be a non-empty string")
    seed = report["seed"]
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        _fail(where, f"key 'seed' must be an integer or null, found {seed!r}")
    if report.get("config_id") is not None and not isinstance(report["config_id"], str):
        _fail(where, "key 'config_id' must be a string or null")
    data = report["data"]
    if not isinstance(data, dict):
        _fail(where, "key 'data' must be an object")
    if not isinstance(data.get("sha256"), str) or not data["sha256"]:
        _fail(where, "missing key 'data.sha256'")

    segments = report["segments"]
    if not isinstance(segments, dict):
        _fail(where, "key 'segments' must be an object")
    for key in ("ref", "hyp"):
        if key not in segments:
            _fail(where, f"missing key 'segments.{key}'")
    n = len(segments["hyp"]) if isinstance(segments["hyp"], list) else -1
    if n <= 0:
        _fail(where, "key 'segments.hyp' must be a non-empty list")
    for key, values in segments.items():
        if not isinstance(values, list):
            _fail(where, f"key 'segments.{key}' must be a list")
        if len(values) != n:
            _fail(where, f"key 'segments.{key}' has {len(values)} values for {n} hypotheses")
        if key in TEXT_KEYS:
            bad = next((i for i, v in enumerate(values) if not isinstance(v, str)), None)
            if bad is not None:
                _fail(where, f"key 'segments.{key}' item {bad} is not a string")
        else:
            bad = next((i for i, v in enumerate(values) if not _is_number(v)), None)
            if bad is not None:
                _fail(where, f"key 'segments.{key}' item {bad} is {values[bad]!r}, not a finite number")

    for key in ("corpus", "signatures", "versions", "decoding"):
        if key in report and not isinstance(report[key], dict):
            _fail(where, f"key '{key}' must be an object")
    for key, value in report.get("corpus", {}).items():
        if not _is_number(value):
            _fail(where, f"key 'corpus.{key}' is {value!r}, not a finite number")
    for key, value in report.get("signatures", {}).items():
        if not isinstance(value, str):
            _fail(where, f"key 'signatures.{key}' must be a string")
    trained_on = report.get("trained_on")
    if trained_on is not None and not isinstance(trained_on, str):
        _fail(where, "key 'trained_on' must be a metric name or null")
    heldout = report.get("heldout", [])
    if not isinstance(heldout, list) or not all(isinstance(h, str) for h in heldout):
        _fail(where, "key 'heldout' must be a list of metric names")
    terms = report.get("reward_terms", [])
    if not isinstance(terms, list):
        _fail(where, "key 'reward_terms' must be a list")
    for i, term in enumerate(terms):
        if not (isinstance(term, dict) and isinstance(term.get("name"), str) and isinstance(term.get("path"), str)
                and _is_number(term.get("weight")) and (term.get("metric") is None or isinstance(term["metric"], str))):
            _fail(where, f"key 'reward_terms' item {i} must hold a name, a path, a finite weight and a metric name or null")
    selected_on = report.get("selected_on")
    if selected_on is not None and not isinstance(selected_on, str):
        _fail(where, "key 'selected_on' must be a metric name or null")
    if "selection" in report:
        selection = report["selection"]
        if not isinstance(selection, dict):
            _fail(where, "key 'selection' must be an object")
        if selection.get("rule") not in SELECTION_RULES:
            _fail(where, f"key 'selection.rule' is {selection.get('rule')!r}, expected one of {', '.join(SELECTION_RULES)}")
        candidates = selection.get("candidates")
        if not isinstance(candidates, int) or isinstance(candidates, bool) or candidates < 1:
            _fail(where, f"key 'selection.candidates' is {candidates!r}, not a positive integer")
        if not isinstance(selection.get("signature"), str):
            _fail(where, "key 'selection.signature' must be a string")
    return report


def read_report(path) -> dict:
    """Load and validate one report; every failure is a one-line ``QeebmError`` naming the file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise QeebmError(f"{path}: no such evaluation report") from None
    except (OSError, UnicodeDecodeError) as err:
        raise QeebmError(f"{path}: cannot read ({err})") from None
    try:
        report = json.loads(text)
    except json.JSONDecodeError as err:
        raise QeebmError(f"{path}: not valid JSON ({err})") from None
    return validate_report(report, path)


def write_report(path, report: dict) -> Path:
    """Validate and write atomically: a reader sees the old file or the new one, never half of one."""
    path = Path(path)
    validate_report(report, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # allow_nan=False: a NaN score must fail here, not in a later json.loads elsewhere
    text = json.dumps(report, ensure_ascii=False, indent=1, allow_nan=False) + "\n"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".tmp-{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


# ----------------------------------------------------------------------------------------------
# Building a report (for `qeebm evaluate`)


def config_id(config: dict, ignore: Sequence[str] = ("seed", "output", "logging")) -> str:
    """A short hash of a training config with the top-level keys that differ between seeds of one
    experiment (the seed, where it is written, how it is logged) left out. A path that names the
    run's own seed (``.../plateau-seed231/best``: each seed continues its own SFT plateau under the
    tiny world's protocol) hashes with the seed left out of it too. A config saved before
    ``<method>.sampling`` existed hashes as its upgraded form, and a config saved before a key was
    added hashes with that key's default, so its runs group with newer ones."""
    seed = config.get("seed")
    own = re.compile(rf"seed{seed}(?![0-9])") if isinstance(seed, int) else None

    def unseeded(value):
        if isinstance(value, dict):
            return {k: unseeded(v) for k, v in value.items()}
        if isinstance(value, list):
            return [unseeded(v) for v in value]
        return own.sub("seed{seed}", value) if own is not None and isinstance(value, str) else value

    try:
        full = to_dict(config_from_dict(config, warn=False))
    except (QeebmError, TypeError, ValueError):
        full = upgrade_keys(config, warn=False)  # not a whole run config: hash what there is
    kept = {k: unseeded(v) for k, v in full.items() if k not in ignore}
    blob = json.dumps(kept, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]



def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def build_report(
    *,
    system: str,
    seed: int | None,
    config_id: str | None,
    hyp: Sequence[str],
    ref: Sequence[str],
    data_sha256: str,
    src: Sequence[str] | None = None,
    scores: dict[str, Sequence[float]] | None = None,
    data_path: str | None = None,
    model: str | None = None,
    decoding: dict | None = None,
    trained_on: str | None = None,
    heldout: Sequence[str] = (),
    signatures: dict[str, str] | None = None,
    sacrebleu: Sequence[str] = SACREBLEU_METRICS,
) -> dict:
    """A validated report with the corpus scores of the ``sacrebleu`` metrics (default BLEU,
    chrF++ and TER) and the mean of every neural score filled in.
    ``scores`` maps a metric name ('comet', 'kiwi', 'xcomet', 'judge') to one number per segment;
    ``signatures`` overrides sacrebleu's default options (e.g. a different BLEU tokeniser)."""
    signatures = dict(signatures or {})
    segments: dict[str, list] = {}
    if src is not None:
        segments["src"] = list(src)
    segments["ref"], segments["hyp"] = list(ref), list(hyp)
    corpus = {}
    for name in sacrebleu:
        corpus[name] = corpus_from_stats(name, segment_stats(name, hyp, ref, signatures.get(name)), signatures.get(name))
        signatures[name] = metric_signature(name, signatures.get(name))
    for name, values in (scores or {}).items():
        segments[name] = [float(v) for v in values]
        corpus[name] = float(np.mean(segments[name])) if segments[name] else float("nan")
    versions = {dist: _version(dist) for dist in ("qeebm", "sacrebleu", "unbabel-comet", "torch", "transformers")}
    report = {
        "format": FORMAT,
        "system": system,
        "seed": seed,
        "config_id": config_id,
        "model": model,
        "decoding": dict(decoding or {}),
        "data": {"path": data_path, "sha256": data_sha256},
        "versions": {("comet" if k == "unbabel-comet" else k): v for k, v in versions.items()},
        "corpus": corpus,
        "signatures": signatures,
        "segments": segments,
        "trained_on": trained_on,
        "heldout": list(heldout),
    }
    return validate_report(report)
