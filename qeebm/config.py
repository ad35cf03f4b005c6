"""The one typed configuration of a qeebm run.

Every default is visible in the dataclasses below and, for a method's own section, in the dataclass
its module declares with ``method_section``; an experiment YAML holds only its differences,
and command-line overrides are dotted ``key=value`` pairs (``optim.lr=1e-4``). An unknown key or a
value of the wrong type is an error naming the key and the closest valid one, raised before any
model is loaded.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import importlib
import logging
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from qeebm.errors import QeebmError
from qeebm.guards import GuardConfig

LOG = logging.getLogger("qeebm.config")

TINYWORLD_DIR = "data/tinyworld"
# One name per system everywhere: its recipe (recipes/configs/tiny_NAME.yaml, recipes/configs/real/
# NAME.yaml), its run directory, the report's "system". The lists below are the order the demo, the
# sweep and the real recipes' default plan take them in; a system with a recipe and in no list still
# runs when named (and with `qeebm demo --systems all`), after the listed ones.
SYSTEMS = ("sft", "reinforce", "ppo", "qe-ebm-static", "qe-ebm-dynamic", "qe-finetune")
# Systems with recipes of their own (tiny and real) that the demo, the sweep and a recipe's default
# plan leave out; a recipe runs them when ``--systems`` names them.
EXTRA_SYSTEMS = ("dpo", "cpo", "grpo")
# QE-EBM with gradient estimators other than straight-through against the tiny Kiwi; tiny recipes only.
KIWI_ESTIMATOR_SYSTEMS = ("qe-ebm-softmax", "qe-ebm-reinmax", "qe-ebm-loo-cv")
# The tiny world's positive control: systems whose recipe trains against an energy or reward that
# knows the answer (the world's true reference of every pool sentence; qeebm/experiments/demo.py,
# ``target``); tiny recipes only. QE-EBM's other gradient estimators are positive-control rows of their own.
ESTIMATOR_SYSTEMS = ("qe-ebm-softmax-oracle", "qe-ebm-reinmax-oracle", "qe-ebm-loo-cv-oracle")
ORACLE_SYSTEMS = ("qe-ebm-oracle", "reinforce-oracle", "reinforce-chrf", "dpo-oracle", "grpo-oracle", *ESTIMATOR_SYSTEMS)
# The published seeds; every `--seeds N` takes the first N (the tiny world's single-seed tables use 42).
SEEDS = (42, 231, 6)
# The file of each split inside a data directory (the tiny world's ``data/``, a prepared corpus).
SPLIT_FILES = {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv", "mono": "mono.txt"}


def data_path_overrides(data_dir: str | Path) -> list[str]:
    """``data.<split>.path=`` overrides pointing every split at its file in ``data_dir``."""
    return [f"data.{split}.path={Path(data_dir) / name}" for split, name in SPLIT_FILES.items()]


@dataclass
class LoraConfig:
    """Optional LoRA adapters on the translator (peft)."""

    enabled: bool = False
    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "v_proj"])


@dataclass
class BottleneckConfig:
    """Optional bottleneck adapters on an mBART translator, the reference code's kind (the
    ``adapters`` package, AdapterHub: ``pip install 'qeebm[adapters]'``). ``kind``: ``seq_bn``
    (Pfeiffer: one bottleneck after each layer's feed-forward block), ``seq_bn_inv`` (the same plus an
    invertible adapter on the encoder's embeddings: the paper's) or ``double_seq_bn`` (Houlsby: one
    after the attention block too). ``reduction_factor``: d_model / bottleneck width (mBART-50: 1024
    / 16 = 64). adapters integrates mBART but not M2M100, so NLLB translators cannot have them; and
    they are not linear, so a saved translator keeps the base and the adapter apart (``bottleneck/``
    beside the base's files) instead of merging them as LoRA's are."""

    enabled: bool = False
    kind: str = "seq_bn_inv"
    reduction_factor: int = 16


@dataclass
class ModelConfig:
    """The translator: an NLLB-200 (M2M100) or mBART-50 checkpoint, a hub id or a local directory."""

    name_or_path: str = f"{TINYWORLD_DIR}/nllb-base"
    # NLLB codes everywhere (eng_Latn, khk_Cyrl); mapped to mBART-50 codes for mBART models.
    src_lang: str = "eng_Latn"
    tgt_lang: str = "khk_Cyrl"
    # None keeps the checkpoint's dropout; 0.0 makes training steps deterministic (parity checks).
    dropout: Optional[float] = None
    # Recompute each layer's activations in the backward pass instead of keeping them (transformers'
    # gradient checkpointing): less memory for one more forward of time; the gradients are the same.
    # transformers recomputes in train mode only: SFT's, QE-EBM's and the CE term's forwards; REINFORCE's
    # policy forward and PPO's (ppo.disable_dropout) run in eval mode and keep their activations.
    gradient_checkpointing: bool = False
    lora: LoraConfig = field(default_factory=LoraConfig)
    bottleneck: BottleneckConfig = field(default_factory=BottleneckConfig)


@dataclass
class CorpusConfig:
    """One corpus. ``format``: tsv / jsonl (columns by name), text (``path`` = source file,
    ``tgt_path`` = target file), hf (``path`` = dataset name or a local ``save_to_disk`` directory)
    or auto (by file extension). An empty ``path`` means the corpus is not used."""

    path: str = ""
    format: str = "auto"
    tgt_path: str = ""
    src_column: str = "src"
    tgt_column: str = "tgt"
    hf_config: str = ""
    split: str = "train"
    # Read at most this many examples (0 = all); how many were left is logged.
    max_examples: int = 0


def _tinyworld_corpus(split: str) -> CorpusConfig:
    return CorpusConfig(path=f"{TINYWORLD_DIR}/data/{SPLIT_FILES[split]}")


@dataclass
class DataConfig:
    """Labelled pairs (train/dev/test) and the source-only pool (mono)."""

    train: CorpusConfig = field(default_factory=lambda: _tinyworld_corpus("train"))
    dev: CorpusConfig = field(default_factory=lambda: _tinyworld_corpus("dev"))
    test: CorpusConfig = field(default_factory=lambda: _tinyworld_corpus("test"))
    mono: CorpusConfig = field(default_factory=lambda: _tinyworld_corpus("mono"))
    # Drop training pairs whose source or target has more than this many translator tokens (0 = keep all).
    max_tokens: int = 50
    dedup: bool = True
    # "fail": a bad line is a one-line error (exit 2); "skip": bad lines are counted, logged and dropped.
    on_error: str = "fail"


@dataclass
class OptimConfig:
    """Optimiser, schedule and budget. ``batch_size`` is global: examples per optimiser step over all
    processes and accumulation micro-steps (must divide exactly).

    The budget: a run stops after ``max_steps`` optimiser steps or ``max_epochs`` epochs of the
    labelled pairs (those left after the length filter; an epoch is their count / ``batch_size``
    steps, rounded up at the end), whichever comes first; 0 turns that bound off, and one of them
    must be on. The schedule's end (linear, cosine) is that number of steps. Early stopping
    (``eval.patience``) never ends a run before ``min_epochs`` epochs."""

    lr: float = 3e-4
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-6
    weight_decay: float = 1e-5
    scheduler: str = "linear"  # linear | cosine | constant
    warmup_steps: int = 100
    max_steps: int = 1000
    max_epochs: float = 0.0
    min_epochs: float = 0.0
    batch_size: int = 16
    grad_accum: int = 1
    max_grad_norm: float = 0.5  # 0 disables clipping
    mixed_precision: str = "no"  # no | fp16 | bf16
    label_smoothing: float = 0.1
    # A step whose loss or gradient norm is not finite is skipped (no weight, optimiser or schedule
    # change), counted and logged; this many in a row stop the run (0 = never stop).
    max_nonfinite_steps: int = 5


@dataclass
class GenerationConfig:
    """Decoding for validation, evaluation and ``qeebm translate``."""

    num_beams: int = 5
    max_new_tokens: int = 50
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    # Epsilon sampling (Hewitt et al. 2022): tokens below this probability are never drawn; 0 = off.
    epsilon: float = 0.0
    batch_size: int = 32
    # How a sampled token is drawn (SAMPLERS): the same distribution either way, other draws.
    sampler: str = "inverse-cdf"


@dataclass
class SamplingConfig:
    """How a method that learns from its own translations draws them: ``num_samples`` (K) per
    source-only sentence, at most ``max_new_tokens``, at ``temperature`` with top-k / nucleus
    truncation (0 and 1.0: ancestral sampling). One section, ``<method>.sampling``, in QE-EBM,
    REINFORCE and PPO; each method documents what it does with truncation. ``sampler``: how each
    token is drawn, as ``GenerationConfig.sampler``."""

    num_samples: int = 5
    max_new_tokens: int = 50
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    sampler: str = "inverse-cdf"


@dataclass
class EvalConfig:
    """Periodic validation, best-checkpoint selection and early stopping.

    Every validation decodes the dev set (``generation``) and computes BLEU, chrF++ and the
    teacher-forced NLL (``loss``); ``qe_metrics`` adds quality estimators' mean scores of the decoded
    dev set: ``kiwi`` is the QE the run trains against (``qe.path``, or ``kiwi_path`` when set),
    ``judge`` a held-out QE (``judge_path``). ``metric`` selects ``best/`` and drives early stopping
    (the published setup selects on validation COMET-Kiwi); each of ``also_best`` keeps its own best
    checkpoint in ``best-<metric>/`` (``loss`` is minimised, every other metric maximised). Metrics
    that ``metric`` or ``also_best`` name are computed whether or not ``qe_metrics`` lists them."""

    # Steps between validations; 0 disables periodic validation. With an epoch budget
    # (optim.max_epochs) at most one epoch's steps, as the published trainer validates every
    # min(100, batches per epoch) batches.
    every: int = 100
    max_examples: int = 0  # 0 = whole dev set
    metric: str = "chrf"  # bleu | chrf | loss | kiwi | judge
    mode: str = "max"  # max | min
    patience: int = 0  # validations without improvement before stopping; 0 = never stop early
    qe_metrics: list[str] = field(default_factory=list)  # kiwi | judge
    kiwi_path: str = ""  # "" = qe.path, the QE the run trains against
    judge_path: str = ""
    also_best: list[str] = field(default_factory=list)
    # Also validate before the first step (a fresh run only): the starting model's scores begin the
    # curves, and a run that never beats its start selects the start itself.
    at_start: bool = False
    # sacrebleu's BLEU tokenizer for validation (and a run's evaluation); "" = sacrebleu's default for
    # model.tgt_lang: zh for Chinese, ja-mecab for Japanese, ko-mecab for Korean, 13a otherwise.
    bleu_tokenize: str = ""


@dataclass
class LoggingConfig:
    """``every``: steps between metric records. ``diagnostics``: on those steps, also the gradient
    norm of each weighted term of the loss (CE, energy, policy gradient, ...) over the trainable
    parameters, and each term's norm ratio and cosine against the CE term (``diag/`` keys), measured
    on the step's first micro-batch: two or three extra backward passes every ``every`` steps.
    ``report_to``: where the records go besides ``metrics.jsonl``, any of accelerate's trackers
    (tensorboard, wandb, mlflow, comet_ml, aim, clearml, dvclive, ...); an empty list logs to
    metrics.jsonl alone. wandb runs offline with WANDB_MODE=offline; mlflow logs where its own
    settings (MLFLOW_TRACKING_URI) point."""

    every: int = 10
    diagnostics: bool = True
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"])
    progress_bar: bool = True


@dataclass
class OutputConfig:
    run_dir: str = "runs/sft"
    save_every: int = 200  # steps; a checkpoint is also written at the end of training
    keep_last: int = 2  # periodic checkpoints kept (the best one is kept separately)
    # Continue from the newest checkpoint in run_dir when there is one.
    resume: bool = True
    # Signals that preempt a run (SLURM and Kubernetes send SIGTERM; SLURM's --signal often SIGUSR1):
    # the current step finishes, a checkpoint is written and the run exits 0, to be resumed by the
    # same command. An empty list leaves the signals' default actions alone.
    preempt_signals: list[str] = field(default_factory=lambda: ["SIGTERM", "SIGUSR1"])


@dataclass
class QEConfig:
    """The quality estimator QE-EBM trains against: a CometKiwi-style checkpoint in comet's format (a
    local directory or a hub id).

    ``mode``: "static" keeps it frozen; "dynamic" also trains it, once every ``interval`` steps after
    ``warmup_steps``, with its own AdamW, on the labelled batch: the reference against K fresh samples
    of the (frozen) translator. ``loss``: "nce" (published) is BCE-with-logits on logit = QE(x, y) -
    noise_weight * log pbar(y|x) (pbar: the translator's mean token probability, label-smoothed by
    ``label_smoothing``), target 1 for the reference and 0 for each sample; "rank-nce" is the ranking
    form of NCE on the same logits: cross-entropy of picking the reference among itself and its K
    samples; "margin" asks QE(x, ref) >= QE(x, y_k) + ``margin``.
    ``train_parts``: any of "head" (estimator), "layerwise" (layer-wise attention), "lora" (peft LoRA
    adapters on the QE encoder, ``lora_*``). The translator's optimiser never sees QE parameters.
    ``heldout_path`` (dynamic): judged rows (TSV with a header naming src, mt, score, or JSONL with
    those keys; the tiny world writes ``qe/heldout.tsv``; "auto": the ``heldout.tsv`` beside the QE
    directory ``path`` when there is one, else none), whose first ``heldout_max_rows`` (0: all)
    the current QE scores on the first logged step (``logging.every``), and again on the first
    logged step after every further ``heldout_every`` QE updates: ``qe-ebm/heldout_pearson`` /
    ``heldout_spearman`` with the true score in metrics.jsonl, and ``qe-ebm/heldout_updates``, the
    updates the measured QE had (0, the QE as loaded, when ``warmup_steps`` >= ``logging.every``)."""

    path: str = f"{TINYWORLD_DIR}/qe/kiwi"
    mode: str = "static"  # static | dynamic
    warmup_steps: int = 200  # dynamic: optimiser steps before the first QE update
    interval: int = 1  # dynamic: one QE update on every step that is a multiple of this, after warm-up
    loss: str = "nce"  # nce | rank-nce | margin
    label_smoothing: float = 0.1  # of log pbar in the NCE logit
    noise_weight: float = 1.0  # of log pbar in the NCE logit (1: NCE; 0: the QE's own ranking)
    margin: float = 0.1  # margin loss: reference above each sample by this much
    train_parts: list[str] = field(default_factory=lambda: ["head", "layerwise", "lora"])
    lr: float = 3e-4
    weight_decay: float = 0.0
    max_grad_norm: float = 0.0  # 0 disables clipping of the QE update
    lora_r: int = 8
    lora_alpha: int = 16
    lora_target_modules: list[str] = field(default_factory=lambda: ["query", "value"])
    heldout_path: str = ""  # dynamic: judged (src, mt, score) rows; "auto": beside `path`; "" = none
    heldout_every: int = 10  # QE updates between held-out measurements
    heldout_max_rows: int = 500  # the first rows of heldout_path only (0: all), to keep it cheap
    # The energy's QE encoder recomputes each layer in the backward pass instead of keeping its
    # activations (a CometKiwi on XLM-R / InfoXLM only): less memory, the same gradients.
    gradient_checkpointing: bool = False


@dataclass
class RewardTerm:
    """One named part of a composite reward: ``path`` is a QE or metric the toolkit loads (a
    CometKiwi-style directory or hub id, a reference-based COMET or XCOMET) or ``chrf`` (sentence
    chrF++ against the pool's reference); its score counts ``weight`` times."""

    name: str = ""
    path: str = ""
    weight: float = 1.0


@dataclass
class RewardConfig:
    """What the reward-based methods (REINFORCE, PPO, GRPO, DPO/CPO's ranking, QE finetuning's
    rerank selection) score a translation with: the weighted sum of ``terms``, each term's mean
    logged as ``reward/<name>``; empty: the QE at ``qe.path`` alone, unlogged. Guard penalties
    (``guards``) apply to the sum as to a single QE's score. With terms, ``qe.path`` is no longer
    the reward; it stays what validation's ``kiwi`` metric and ``qeebm qe-check`` read. QE-EBM's
    energy is a gradient through one QE, ``qe.path``: it takes no composite."""

    terms: list[RewardTerm] = field(default_factory=list)


# ----------------------------------------------------------------------------------------------
# Method sections: a method's settings live beside its code (``qeebm/methods/<name>.py``), each
# dataclass registered under its section name by ``method_section``.


@dataclass(frozen=True)
class MethodSection:
    """A method's config section: its dataclass, the string keys with a fixed set of values
    (``choices``, keyed inside the section), keys that had another name (``renamed``: old -> new,
    read with a deprecation line), and whether run configs saved before it existed lack it
    (``added``: such a config resumes as if it held the section's defaults)."""

    settings: type
    choices: dict[str, tuple[str, ...]]
    renamed: dict[str, str]
    added: bool


_METHOD_SECTIONS: dict[str, MethodSection] = {}


def method_section(name: str, *, choices: dict | None = None, renamed: dict | None = None, added: bool = False):
    """Class decorator: the dataclass becomes the config section ``name`` (``cfg.<name>``, the
    YAML's ``<name>:`` mapping), with its defaults, types and checks like every other section."""

    def register(cls: type) -> type:
        known = _METHOD_SECTIONS.get(name)
        if name in _CORE_KEYS or (known is not None and known.settings.__qualname__ != cls.__qualname__):
            raise QeebmError(f"config section '{name}' is defined twice ({cls.__qualname__})")
        _METHOD_SECTIONS[name] = MethodSection(cls, dict(choices or {}), dict(renamed or {}), added)
        return cls

    return register


def method_sections() -> dict[str, MethodSection]:
    """Every method's section, in the order of the methods package's modules. The methods package
    sits above this module, so it is looked up by name when a config is first built, as a plugin
    is, and never imported at module level (tests/unit/test_layers.py)."""
    methods = importlib.import_module("qeebm.methods")
    if not hasattr(methods, "METHODS"):
        raise RuntimeError("a Config was built while qeebm.methods was being imported: build it inside a function")
    return _METHOD_SECTIONS


def _section_defaults() -> dict[str, Any]:
    return {name: section.settings() for name, section in method_sections().items()}


@dataclass
class Config:
    """A run's whole configuration. The method sections (``cfg.qe_ebm``, ``cfg.reinforce``, ...)
    are attributes too, kept in ``sections``; in YAML and in ``to_dict`` they sit at the top level
    like the others."""

    method: str = "sft"
    seed: int = 42
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    qe: QEConfig = field(default_factory=QEConfig)
    sections: dict[str, Any] = field(default_factory=_section_defaults)
    # Reward-hacking guards (qeebm/guards.py) for the methods that switch them on.
    guards: GuardConfig = field(default_factory=GuardConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)

    def __getattr__(self, name: str) -> Any:
        # Only reached when ordinary lookup fails: a method section, or a real AttributeError.
        sections = self.__dict__.get("sections")
        if sections is not None and name in sections:
            return sections[name]
        raise AttributeError(f"config has no key or section '{name}'")


# The top-level keys that are not method sections.
_CORE_KEYS = frozenset(f.name for f in dataclasses.fields(Config)) - {"sections"}


# ----------------------------------------------------------------------------------------------
# Loading, overriding, checking


def _closest(key: str, options: list[str], prefix: str = "") -> str:
    match = difflib.get_close_matches(key, options, n=1, cutoff=0.5)
    return f" (did you mean '{prefix}{match[0]}'?)" if match else f" (valid keys: {', '.join(options)})"


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp``; allow the harmless widenings YAML needs
    (int -> float, list -> tuple). Anything else is an error naming ``key``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except QeebmError as err:
                errors.append(err)
        raise errors[0]
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise QeebmError(f"config key '{key}' must be a mapping, got {value!r}")
        return _build(tp, value, prefix=f"{key}.")
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise QeebmError(f"config key '{key}' must be a list, got {value!r}")
        (item,) = typing.get_args(tp)
        return [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise QeebmError(f"config key '{key}' must be a list of {len(args)} values, got {value!r}")
        return tuple(_coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):
        # YAML 1.1 reads "1e-4" as a string; accept it as the float it plainly is.
        try:
            return float(value)
        except ValueError:
            pass
    if tp in (int, float, str, bool):
        if isinstance(value, tp) and not (tp is int and isinstance(value, bool)):
            return value
        raise QeebmError(f"config key '{key}' must be {tp.__name__}, got {value!r}")
    raise TypeError(f"unsupported config annotation {tp} for '{key}'")


def _build(cls: type, values: dict, prefix: str = "") -> Any:
    types_ = _field_types(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    if cls is Config:
        del types_["sections"]
        sections = method_sections()
        kwargs["sections"] = {name: _coerce(values.get(name, {}), section.settings, name)
                              for name, section in sections.items()}
        values = {k: v for k, v in values.items() if k not in sections}
    for key, value in values.items():
        if key not in types_:
            options = list(types_) + (list(kwargs["sections"]) if cls is Config else [])
            raise QeebmError(f"unknown config key '{prefix}{key}'{_closest(key, options, prefix)}")
        factory = fields[key].default_factory
        if isinstance(value, dict) and dataclasses.is_dataclass(types_[key]) and factory is not dataclasses.MISSING:
            # A section's own defaults (REINFORCE's top_p 0.9 in reinforce.sampling) survive setting
            # one of its keys: the given keys go over the field's default, not the class's.
            value = _merge(dataclasses.asdict(factory()), value)
        kwargs[key] = _coerce(value, types_[key], f"{prefix}{key}")
    return cls(**kwargs)


def _merge(base: dict, update: dict) -> dict:
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_override(item: str) -> dict:
    """``a.b.c=value`` -> ``{"a": {"b": {"c": value}}}``; the value is parsed as YAML."""
    if "=" not in item:
        raise QeebmError(f"override '{item}' must look like key=value (e.g. optim.lr=1e-4)")
    key, raw = item.split("=", 1)
    value = yaml.safe_load(raw) if raw.strip() else ""
    out: dict = {}
    node = out
    parts = key.strip().split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


CORPUS_FORMATS = ("auto", "tsv", "jsonl", "text", "hf")


def sampling_sections() -> tuple[str, ...]:
    """The method sections with a ``sampling`` field (SamplingConfig): the methods that draw their
    own samples."""
    return tuple(name for name, section in method_sections().items()
                 if "sampling" in {f.name for f in dataclasses.fields(section.settings)})


# "inverse-cdf": one uniform per row and a search of the cumulative probabilities (the default);
# "multinomial": transformers' own sampling, torch.multinomial, which draws one exponential per
# vocabulary entry and row at every step (the toolkit's sampler before version 0.2.0 (CHANGELOG.md):
# it reproduces runs made with it exactly, and it was half of a tiny-world rollout).
SAMPLERS = ("inverse-cdf", "multinomial")
# String fields with a fixed set of values, checked after the types so the message can list them
# (a method section's are its ``method_section(choices=...)``).
CHOICES = {
    "data.on_error": ("fail", "skip"),
    "model.bottleneck.kind": ("seq_bn", "seq_bn_inv", "double_seq_bn"),
    "optim.scheduler": ("linear", "cosine", "constant"),
    "optim.mixed_precision": ("no", "fp16", "bf16"),
    "eval.mode": ("max", "min"),
    "qe.mode": ("static", "dynamic"),
    "qe.loss": ("nce", "rank-nce", "margin"),
    "generation.sampler": SAMPLERS,
    **{f"data.{split}.format": CORPUS_FORMATS for split in SPLIT_FILES},
}


def choices() -> dict[str, tuple[str, ...]]:
    """``CHOICES`` and every method section's own, by dotted key."""
    out = dict(CHOICES)
    for name, section in method_sections().items():
        out |= {f"{name}.{key}": allowed for key, allowed in section.choices.items()}
    out |= {f"{name}.sampling.sampler": SAMPLERS for name in sampling_sections()}
    return out


def _check_choices(cfg: Config) -> None:
    for key, allowed in choices().items():
        node: Any = cfg
        for part in key.split("."):
            node = getattr(node, part)
        if node not in allowed:
            raise QeebmError(f"config key '{key}' must be one of {', '.join(allowed)}; got {node!r}")


# The sampling keys lived flat in each method's section before ``<method>.sampling`` gathered them.
_SAMPLING_KEYS = tuple(f.name for f in dataclasses.fields(SamplingConfig))
# Keys with a new name are given by their section (``method_section(renamed=...)``). A weight is
# named for what it weighs: the paper's alpha and beta (QE-EBM's CE and energy weights) read as its
# symbols in docs and logs (qe-ebm/alpha, qe-ebm/beta), but "beta" is also DPO's scale, Adam's betas
# and chrF's recall weight, and "alpha" LoRA's scale.
def renamed_keys() -> list[tuple[str, str, str]]:
    """(section, old, new) for every renamed key."""
    return [(name, old, new) for name, section in method_sections().items() for old, new in section.renamed.items()]


def upgrade_keys(values: dict, warn: bool = True) -> dict:
    """``values`` with older key names read as today's, one deprecation line each when ``warn``:
    the flat sampling keys (``reinforce.top_p``) moved to their section
    (``reinforce.sampling.top_p``), and the renamed keys (``renamed_keys``). Both forms at once
    is an error. Saved run configs go through this too, so an old run directory still resumes."""
    out = dict(values)
    for section, old, new in renamed_keys():
        node = out.get(section)
        if not isinstance(node, dict) or old not in node:
            continue
        if new in node:
            raise QeebmError(f"config keys '{section}.{old}' and '{section}.{new}' both given: keep '{section}.{new}'")
        node = dict(node)
        node[new] = node.pop(old)
        out[section] = node
        if warn:
            LOG.warning("config key '%s.%s' is now '%s.%s'; the old name still works for now", section, old,
                        section, new)
    for section in sampling_sections():
        node = out.get(section)
        if not isinstance(node, dict) or not any(k in node for k in _SAMPLING_KEYS):
            continue
        node = dict(node)
        nested = dict(node.get("sampling") or {})
        for key in _SAMPLING_KEYS:
            if key not in node:
                continue
            if key in nested:
                raise QeebmError(f"config keys '{section}.{key}' and '{section}.sampling.{key}' both given: "
                                 f"keep '{section}.sampling.{key}'")
            nested[key] = node.pop(key)
            if warn:
                LOG.warning("config key '%s.%s' is now '%s.sampling.%s'; the old name still works for now",
                            section, key, section, key)
        node["sampling"] = nested
        out[section] = node
    return out


def added_sections() -> tuple[str, ...]:
    """Sections added after run directories were saved, whose absence meant what their defaults
    mean: a saved run config without one resumes as if it held them (no bottleneck adapters, no
    reward terms, and each method section registered with ``added=True``)."""
    return ("model.bottleneck", "reward", *(name for name, s in method_sections().items() if s.added))


def saved_added_sections(values: dict) -> dict:
    """A run directory's saved config with each of ``added_sections()`` it lacks filled in with the
    defaults. Only for saved configs, as ``saved_sampler_defaults``."""
    out = copy.deepcopy(values)
    defaults = to_dict(Config())
    for key in added_sections():
        *parents, last = key.split(".")
        node, default = out, defaults
        for part in parents:
            node, default = node.get(part) if isinstance(node, dict) else None, default[part]
        if isinstance(node, dict) and last not in node:
            node[last] = copy.deepcopy(default[last])
    return out


def saved_sampler_defaults(values: dict) -> dict:
    """A run directory's saved config as its run was: one written before ``sampler`` existed drew
    with torch.multinomial, so its missing sampler keys are "multinomial". Resuming it with
    today's default is then refused naming them, and ``...sampler=multinomial`` overrides resume it
    exactly. Only for saved configs: a recipe without the key means the default."""
    out = copy.deepcopy(values)
    for section, path in [("generation", ()), *((s, ("sampling",)) for s in sampling_sections())]:
        node = out.get(section)
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict) and "sampler" not in node:
            node["sampler"] = "multinomial"
    return out


# A term's name becomes a metric key (``reward/<name>``): a plain word.
TERM_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*\Z")


def _check_reward_terms(cfg: Config) -> None:
    names: set[str] = set()
    for i, term in enumerate(cfg.reward.terms):
        key = f"reward.terms[{i}]"
        if not TERM_NAME.match(term.name):
            raise QeebmError(f"config key '{key}.name' must be a word (letters, digits, _ . -, starting with a "
                             f"letter); got {term.name!r}")
        if term.name in names:
            raise QeebmError(f"config key '{key}.name': the name {term.name!r} is given twice")
        names.add(term.name)
        if not term.path.strip():
            raise QeebmError(f"config key '{key}.path' ({term.name}) must name a QE directory, a hub id or 'chrf'")
        if not math.isfinite(term.weight):
            raise QeebmError(f"config key '{key}.weight' ({term.name}) must be a finite number; got {term.weight}")


def config_from_dict(values: dict, warn: bool = True) -> Config:
    cfg = _build(Config, upgrade_keys(values, warn=warn))
    _check_choices(cfg)
    _check_reward_terms(cfg)
    return cfg


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Defaults <- YAML file <- dotted overrides, checked against the dataclasses."""
    values: dict = {}
    if path:
        path = Path(path)
        if not path.is_file():
            raise QeebmError(f"config file not found: {path}")
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as err:
            raise QeebmError(f"{path}: invalid YAML: {str(err).splitlines()[0]}") from None
        if not isinstance(loaded, dict):
            raise QeebmError(f"{path}: top level must be a mapping")
        values = loaded
    for item in overrides:
        values = _merge(values, parse_override(item))
    try:
        return config_from_dict(values)
    except QeebmError as err:
        where = f"{path}: " if path else ""
        raise QeebmError(f"{where}{err}") from None


def to_dict(cfg: Any) -> dict:
    """Plain, YAML-safe dict (tuples become lists) for the run directory's resolved config."""

    def plain(v: Any) -> Any:
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    out = plain(dataclasses.asdict(cfg))
    if isinstance(cfg, Config):  # the method sections at the top level, where YAML has them
        out = {k: v for key, value in out.items()
               for k, v in (value.items() if key == "sections" else [(key, value)])}
    return out


def flat_dict(d: dict, prefix: str = "") -> dict:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``: a config dict keyed by dotted keys."""
    out = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(flat_dict(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def dump_config(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, allow_unicode=True)
