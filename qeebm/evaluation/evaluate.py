"""Scoring a system's test-set translations: sacrebleu BLEU, chrF++ and TER, the COMET family, judges.

``evaluate_system`` (and ``qeebm evaluate``) produce the evaluation report of qeebm/evaluation/report.py: BLEU,
chrF++ and TER as the ``sacrebleu`` command line computes them, and COMET, COMET-Kiwi, XCOMET and any
held-out judge as ``comet-score`` computes them. Neural metrics go through comet's own ``predict``
with comet-score's settings (the model in half precision, length batching by source, batch 16): in
fp16 a score's last bits depend on which segments share a batch, so anything else (qeebm's
``QEScorer`` included) agrees with comet-score only to about one fp16 step (2e-4 to 5e-4). Models
are loaded one at a time and freed after use: XCOMET-XL alone is 3.5B parameters.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import json
import logging
import re
import time
import warnings
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Optional, Sequence, Union

import torch

from qeebm.config import CorpusConfig, GenerationConfig, ModelConfig
from qeebm.data.corpus import Corpus, read_corpus
from qeebm.errors import QeebmError
from qeebm.evaluation.report import build_report, validate_report, write_report
from qeebm.evaluation.report import config_id as make_config_id
from qeebm.methods import METHODS
from qeebm.metrics.registry import DEFAULT_MODELS, SACREBLEU_METRICS
from qeebm.metrics.sacrebleu import bleu_tokenizer
from qeebm.qe.models import resolve_checkpoint
from qeebm.translation.decoding import decode_test
from qeebm.translation.qad import CHRF, Selection, candidate_generation, check_selection_model, decode_and_select
from qeebm.translation.translator import Translator

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------
# Which metrics, with which models

QE_METRICS = tuple(DEFAULT_MODELS)
DEFAULT_QE_BATCH_SIZE = 16  # comet-score's
PRECISIONS = ("fp16", "fp32")
# Methods whose reward or energy is the QE named by the config key qe.path (or reward.terms).
QE_TRAINED_METHODS = frozenset(name for name, method in METHODS.items() if method.trained_on_qe)
# A judge's name becomes a report key and a compare column: keep it a plain word.
JUDGE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*\Z")
_RESERVED = frozenset(SACREBLEU_METRICS + QE_METRICS + ("src", "ref", "hyp", "judges"))


@dataclass
class MetricSpec:
    """Which metrics ``evaluate_system`` computes, and with which models.

    ``metrics``: names among bleu, chrf, ter, the built-in neural metrics (comet, kiwi, xcomet:
    ``qeebm.metrics.registry.DEFAULT_MODELS``) and the judges' names ("judges" stands for all of
    them). None: the sacrebleu three, every neural metric that has a model and every judge.
    ``models``: built-in metric -> a hub id or a local comet directory (None or absent: no such
    metric); the hub defaults when not given. ``judges``: name -> model, for quality estimators the
    system never saw in training. ``batch_sizes``: by metric name ("judge" covers every judge without its own entry).
    ``precision``: "fp16" as comet-score, or "fp32". ``device``: None takes CUDA when present.
    ``bleu_tokenize``: sacrebleu's BLEU tokenizer; None takes sacrebleu's default for the target
    language (qeebm.metrics.sacrebleu.bleu_tokenizer: zh, ja-mecab, ko-mecab, else 13a)."""

    metrics: Optional[Sequence[str]] = None
    models: dict = field(default_factory=lambda: dict(DEFAULT_MODELS))
    judges: dict = field(default_factory=dict)
    batch_sizes: dict = field(default_factory=dict)
    precision: str = "fp16"
    device: Optional[str] = None
    bleu_tokenize: Optional[str] = None

    @classmethod
    def tinyworld(cls, world: Union[str, Path], **overrides) -> "MetricSpec":
        """The tiny world's estimators: comet = qe/comet, kiwi = qe/kiwi, judge = qe/judge (a
        reference-based COMET of another seed, size and data shard). It has no XCOMET, so there is
        none unless ``xcomet=`` names one (any built-in metric's keyword sets its model)."""
        qe = Path(world) / "qe"
        models = {"comet": str(qe / "comet"), "kiwi": str(qe / "kiwi")}
        models |= {name: overrides.pop(name) for name in QE_METRICS if name in overrides}
        return cls(models=models, judges={"judge": str(qe / "judge")}, **overrides)

    @classmethod
    def sacrebleu_only(cls) -> "MetricSpec":
        return cls(metrics=SACREBLEU_METRICS)

    def qe_models(self) -> dict[str, str]:
        """Every neural metric that has a model, in scoring order: name -> hub id or directory."""
        unknown = sorted(set(self.models) - set(QE_METRICS))
        if unknown:
            raise QeebmError(f"MetricSpec.models: {', '.join(unknown)} is no built-in metric ({', '.join(QE_METRICS)}); "
                             f"another model is a judge")
        models = {name: str(self.models[name]) for name in QE_METRICS if self.models.get(name)}
        for name, model in self.judges.items():
            if not isinstance(name, str) or not JUDGE_NAME.match(name) or name in _RESERVED:
                raise QeebmError(f"judge name {name!r} is not allowed: use a word (letters, digits, _ . -) "
                                 f"other than {', '.join(sorted(_RESERVED))}")
            models[name] = str(model)
        return models

    def selected(self) -> list[str]:
        """The metrics to compute, checked: the sacrebleu ones first, then in scoring order."""
        if self.precision not in PRECISIONS:
            raise QeebmError(f"QE precision '{self.precision}' is not one of {', '.join(PRECISIONS)}")
        models = self.qe_models()
        if self.metrics is None:
            for name in models:
                self.batch_size(name)
            return list(SACREBLEU_METRICS) + list(models)
        chosen: set[str] = set()
        for name in self.metrics:
            name = name.strip()
            for one in (list(self.judges) if name == "judges" else [name]):
                if one in SACREBLEU_METRICS or one in models:
                    chosen.add(one)
                elif one in QE_METRICS:
                    raise QeebmError(f"metric '{one}' has no model: name one with --{one} MODEL")
                else:
                    known = list(SACREBLEU_METRICS) + list(QE_METRICS) + ["judges"] + list(self.judges)
                    raise QeebmError(f"unknown metric '{one}' (choose from {', '.join(known)})")
        if not chosen:
            raise QeebmError("no metrics selected")
        selected = [m for m in SACREBLEU_METRICS if m in chosen] + [m for m in models if m in chosen]
        for name in selected:
            if name in models:
                self.batch_size(name)  # a bad one fails now, not after the decoding
        return selected

    def batch_size(self, name: str) -> int:
        if name in self.batch_sizes:
            size = self.batch_sizes[name]
        elif name in self.judges and "judge" in self.batch_sizes:
            size = self.batch_sizes["judge"]
        else:
            size = DEFAULT_QE_BATCH_SIZE
        if not isinstance(size, int) or size < 1:
            raise QeebmError(f"batch size of '{name}' must be a positive integer, got {size!r}")
        return size


def check_trained_on(trained_on: Optional[str], spec: MetricSpec) -> None:
    if trained_on is not None and trained_on not in set(SACREBLEU_METRICS) | set(QE_METRICS) | set(spec.judges):
        raise QeebmError(f"trained_on '{trained_on}' is not a metric name (one of "
                         f"{', '.join(SACREBLEU_METRICS + QE_METRICS + tuple(spec.judges))}, or none)")


def check_qe_models(spec: MetricSpec, names: Sequence[str]) -> None:
    """Find every selected QE checkpoint now, before the test set is translated: a hub id that is
    not cached fails here, in seconds, with load_qe's message."""

    models = spec.qe_models()
    for name in names:
        if name in models:
            resolve_checkpoint(models[name])


# ----------------------------------------------------------------------------------------------
# Neural scores


def _torch_device(device: Optional[str]) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise QeebmError(f"device '{device}' is not a torch device (cpu, cuda, cuda:N)") from None
    if dev.type not in ("cpu", "cuda"):
        raise QeebmError(f"device '{device}': only cpu and cuda are supported")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise QeebmError(f"device '{device}' was asked for but torch sees no CUDA device")
    return dev


@contextlib.contextmanager
def quiet_lightning():
    """Every comet ``predict`` builds a Lightning Trainer, which announces its devices at INFO
    level (comet-score --quiet hides the same lines) and repeats a deprecation warning about its own
    code that no qeebm user can act on."""
    loggers = [logging.getLogger(n) for n in ("lightning.pytorch", "pytorch_lightning", "lightning.fabric",
                                               "lightning_fabric")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*LeafSpec.*")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def qe_scores(model_path: str, src: Sequence[str], hyp: Sequence[str], ref: Optional[Sequence[str]] = None, *,
              batch_size: int = DEFAULT_QE_BATCH_SIZE, precision: str = "fp16",
              device: Optional[str] = None) -> tuple[list[float], str]:
    """Per-segment scores of one COMET-family model and the signature of how they were computed.

    The scores are comet-score's: the model halved for fp16 as comet-score does, then comet's own
    ``predict`` (its length batching by source). Reference-free models (CometKiwi) never see ``ref``.
    The model is freed before this returns."""

    from qeebm.qe.models import load_qe, qe_kind

    dev = _torch_device(device)
    model = load_qe(model_path)
    try:
        kind = qe_kind(model)
        uses_ref = kind != "kiwi"
        if uses_ref and ref is None:
            raise QeebmError(f"QE model {model_path} is reference-based ({kind}) and needs references")
        if precision == "fp16":
            model.half()
        samples = [{"src": s, "mt": m} for s, m in zip(src, hyp)]
        if uses_ref:
            for sample, r in zip(samples, ref):
                sample["ref"] = r
        gpus = 1 if dev.type == "cuda" else 0
        with quiet_lightning():
            # num_workers=0: forking data workers of a process holding a multi-GB model buys nothing here
            out = model.predict(samples, batch_size=batch_size, gpus=gpus,
                                devices=[dev.index or 0] if gpus else None, progress_bar=False,
                                accelerator="gpu" if gpus else "cpu", num_workers=0)
        scores = [float(x) for x in out.scores]
    finally:
        del model
        gc.collect()  # Lightning leaves a model <-> trainer reference cycle
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    signature = "|".join([f"model:{model_path}", f"kind:{kind}", f"refs:{'yes' if uses_ref else 'no'}",
                          f"precision:{precision}", f"batch:{batch_size}",
                          f"version:{metadata.version('unbabel-comet')}"])
    return scores, signature


# ----------------------------------------------------------------------------------------------
# Test sets, hypotheses, decoding


def read_test(test) -> tuple[list[str], list[str], Optional[str]]:
    """(sources, references, path) of a test corpus given as a path, a CorpusConfig or a Corpus."""

    if isinstance(test, Corpus):
        if test.tgt is None:
            raise QeebmError("the test corpus has no references")
        return list(test.src), list(test.tgt), None
    cfg = test if isinstance(test, CorpusConfig) else CorpusConfig(path=str(test))
    corpus = read_corpus(cfg, "test", need_target=True)
    return corpus.src, corpus.tgt, cfg.path


def segments_sha256(src: Sequence[str], ref: Sequence[str]) -> str:
    """sha256 of the scored segments, not of a file: one test set hashes alike whatever its file
    format, and a subset of it (max_examples) hashes differently."""
    blob = json.dumps({"src": list(src), "ref": list(ref)}, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def read_hypotheses(path: Union[str, Path]) -> list[str]:
    """One hypothesis a line. Lines are stripped as comet-score strips them (sacrebleu strips their
    right end; its tokenisers ignore the left), so both command lines score what the report holds."""
    path = Path(path)
    if not path.is_file():
        raise QeebmError(f"hypothesis file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise QeebmError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.strip() for line in lines]


def decoding_info(gen: GenerationConfig, translator=None) -> dict:
    info = {"num_beams": gen.num_beams, "max_new_tokens": gen.max_new_tokens, "batch_size": gen.batch_size,
            "do_sample": gen.do_sample}
    if gen.do_sample:
        info.update(temperature=gen.temperature, top_k=gen.top_k, top_p=gen.top_p, epsilon=gen.epsilon)
    if translator is not None:
        info.update(src_lang=translator.src_code, tgt_lang=translator.tgt_code)
    return info


# ----------------------------------------------------------------------------------------------
# One system -> one report


def evaluate_system(
    hyps_or_translator,
    test,
    metrics: Optional[MetricSpec] = None,
    *,
    system: str,
    seed: Optional[int] = None,
    config_id: Optional[str] = None,
    generation: Optional[GenerationConfig] = None,
    model: Optional[str] = None,
    decoding: Optional[dict] = None,
    trained_on: Optional[str] = None,
    heldout: Union[Sequence[str], str] = "auto",
    data_path: Optional[str] = None,
    selection: Union[Selection, dict, None] = None,
    tgt_lang: Optional[str] = None,
    reward_terms: Optional[Sequence[dict]] = None,
) -> dict:
    """Score one system on a test set; returns its validated report (qeebm/evaluation/report.py format).

    ``hyps_or_translator``: one hypothesis per test segment, or a ``Translator`` that decodes the
    test sources with ``generation`` (default GenerationConfig: beam 5, 50 new tokens) where it is.
    ``test``: a corpus path, CorpusConfig or Corpus with references. ``metrics``: default
    ``MetricSpec()`` (the public hub models). ``trained_on``: the metric the system was optimised
    against, or None; ``heldout``: "auto" is every neural metric computed except ``trained_on`` and
    the one the selection maximised. ``selection``: a ``qeebm.translation.qad.Selection`` the translator's
    candidates go through, or (with hypotheses) the record of the selection that chose them
    (``qad.selection_report``). ``tgt_lang``: the target language (NLLB or mBART-50 code), whose
    sacrebleu default chooses BLEU's tokenizer unless ``metrics.bleu_tokenize`` does; default: the
    translator's, and with hypotheses none (sacrebleu's 13a). ``reward_terms``: the terms of the
    composite reward the system was trained against (``infer_reward_terms``), recorded in the report;
    "auto" held-out metrics leave out every term's metric too. ``model``, ``decoding`` and
    ``data_path`` are provenance only."""
    from qeebm.translation.qad import Selection, check_selection_model, decode_and_select

    spec = metrics or MetricSpec()
    names = spec.selected()
    models = spec.qe_models()
    check_trained_on(trained_on, spec)
    src, ref, path = read_test(test)
    check_qe_models(spec, names)
    if tgt_lang is None and not isinstance(hyps_or_translator, (list, tuple)):
        tgt_lang = hyps_or_translator.tgt_code
    signatures: dict[str, str] = {}
    if "bleu" in names:
        # before decoding: a tokenizer whose packages are missing should cost seconds, not a decode
        signatures["bleu"] = f"tok:{bleu_tokenizer(tgt_lang, spec.bleu_tokenize)}"
    seconds: dict[str, float] = {}
    if isinstance(hyps_or_translator, (list, tuple)):
        if isinstance(selection, Selection):
            raise ValueError("a Selection needs a translator to make candidates; with hypotheses pass its record")
        hyps = [str(h) for h in hyps_or_translator]
        if len(hyps) != len(src):
            raise QeebmError(f"{len(hyps)} hypotheses for {len(src)} test segments ({data_path or path or 'test set'})")
    else:
        gen = generation or GenerationConfig()
        start = time.perf_counter()
        if isinstance(selection, Selection):
            check_selection_model(selection)
            hyps, selection = decode_and_select(lambda: hyps_or_translator, src, gen, selection, spec.device)
            decoding = decoding_info(selection_generation(gen, selection), hyps_or_translator) | (decoding or {})
        else:
            hyps = decode_test(hyps_or_translator, src, gen)
            decoding = decoding_info(gen, hyps_or_translator) | (decoding or {})
        seconds["decode"] = time.perf_counter() - start
    selected_on = infer_selected_on(selection, spec)

    neural = [n for n in names if n in models]
    scores = {}
    for name in neural:
        start = time.perf_counter()
        scores[name], signatures[name] = qe_scores(models[name], src, hyps, ref, batch_size=spec.batch_size(name),
                                                   precision=spec.precision, device=spec.device)
        seconds[name] = time.perf_counter() - start
        log.info("%s (%s): %.4f over %d segments in %.1f s", name, models[name], sum(scores[name]) / len(hyps),
                 len(hyps), seconds[name])
    if heldout == "auto":
        trained = {trained_on, selected_on} | {t.get("metric") for t in reward_terms or ()}
        heldout = [n for n in neural if n not in trained]


    sacre = [n for n in SACREBLEU_METRICS if n in names]
    report = build_report(system=system, seed=seed, config_id=config_id, hyp=hyps, ref=ref, src=src,
                          data_sha256=segments_sha256(src, ref), scores=scores, data_path=data_path or path,
                          model=model, decoding=decoding, trained_on=trained_on, heldout=list(heldout),
                          signatures=signatures, sacrebleu=sacre)
    report["signatures"] = {n: report["signatures"][n] for n in sacre + neural}
    report["seconds"] = {k: round(v, 3) for k, v in seconds.items()}
    if reward_terms:
        report["reward_terms"] = [dict(t) for t in reward_terms]
    if selection is not None:
        report["signatures"]["selection"] = selection["signature"]
        report["selection"] = selection
        report["selected_on"] = selected_on
    return validate_report(report)


def selection_generation(gen: GenerationConfig, selection: dict) -> GenerationConfig:
    """The decoding that made a selection's candidates (for the report's ``decoding``)."""

    return candidate_generation(gen, selection["candidates"], selection["mode"])


def infer_selected_on(selection: Optional[dict], spec: MetricSpec) -> Optional[str]:
    """The metric a selection maximised: the one whose model is the reranking QE or the MBR
    utility, if it is among the metrics computed (chrF++ as utility is consensus with the other
    candidates, not the reference's chrF++: None)."""
    if not selection:
        return None
    model = selection.get("model") or (selection.get("utility") if selection.get("utility") != "chrf" else None)
    if not model:
        return None
    return next((name for name, m in spec.qe_models().items() if _same_model(m, model)), None)


def selection_split(split: str, selection) -> str:
    """Where a run's selected evaluation goes beside its plain one: ``<split>-<rule>``."""
    return split if selection is None else f"{split}-{selection.rule}"


def selection_system(system: str, selection) -> str:
    """A selected evaluation's row name: the system's with ``+rerank`` or ``+mbr``."""
    return system if selection is None else f"{system}+{selection.rule}"


def eval_report_path(run_dir: Union[str, Path], split: str = "test") -> Path:
    return Path(run_dir) / "eval" / f"{split}.json"


def write_eval(report: dict, run_dir: Union[str, Path], split: str = "test") -> Path:
    """Write a report where scripts/compare.py looks for it: ``<run>/eval/<split>.json``."""

    return write_report(eval_report_path(run_dir, split), report)


# ----------------------------------------------------------------------------------------------
# Run directories: model, config, and what the report says about them


def run_config(run_dir: Union[str, Path]) -> Optional[dict]:
    """The training config a run directory holds (config.yaml), or None."""
    import yaml

    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        return None
    return yaml.safe_load(path.read_text(encoding="utf-8")) or {}


def _is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file() or (path / "adapter_config.json").is_file()


def run_model_dir(run_dir: Union[str, Path], checkpoint: Optional[str] = None) -> Path:
    """The run's ``checkpoint`` model (``best``, ``best-<metric>`` as ``eval.also_best`` keeps them,
    ``final``), or by default its best checkpoint, else its final one."""
    if checkpoint is not None:
        path = Path(run_dir) / checkpoint
        if not _is_model_dir(path):
            raise QeebmError(f"{run_dir} holds no {checkpoint}/ model")
        return path
    for name in ("best", "final"):
        candidate = Path(run_dir) / name
        if _is_model_dir(candidate):
            return candidate
    raise QeebmError(f"{run_dir} holds no best/ or final/ model: is it a finished qeebm run directory?")


def run_of_model(model_path: Union[str, Path]) -> Optional[Path]:
    """The run directory a ``<run>/best``, ``<run>/best-<metric>`` or ``<run>/final`` model belongs
    to, if it is one."""
    path = Path(model_path)
    if (path.name in ("best", "final") or path.name.startswith("best-")) and (path.parent / "config.yaml").is_file():
        return path.parent
    return None


def system_name(config: dict) -> str:
    """A run's default system name: its method (QE-EBM with its QE mode), shared by all its seeds."""
    method = str(config.get("method", "sft"))
    if method == "qe-ebm":
        return f"qe-ebm-{(config.get('qe') or {}).get('mode', 'static')}"
    return method


def _same_model(a: str, b: str) -> bool:
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    if pa.exists() and pb.exists():
        return pa.resolve() == pb.resolve()
    return a == b


def _term_metric(path: str, spec: MetricSpec) -> str:
    """The report metric a reward term is: chrF++ for ``chrf``, the metric whose model is ``path``,
    else "kiwi" (as ``infer_trained_on``: an unknown QE is taken for a CometKiwi-style estimator)."""

    if path == CHRF:
        return "chrf"
    return next((name for name, model in spec.qe_models().items() if _same_model(model, path)), "kiwi")


def infer_reward_terms(config: Optional[dict], spec: MetricSpec) -> Optional[list[dict]]:
    """The terms of a run's composite reward (``reward.terms``: name, path, weight) with the report
    metric each one is (``metric``); None for a run without terms and for a method without a reward."""
    if not config or config.get("method") not in QE_TRAINED_METHODS:
        return None
    terms = (config.get("reward") or {}).get("terms") or []
    if not terms:
        return None
    return [{"name": str(t.get("name")), "path": str(t.get("path")), "weight": float(t.get("weight", 1.0)),
             "metric": _term_metric(str(t.get("path")), spec)} for t in terms]


def infer_trained_on(config: Optional[dict], spec: MetricSpec) -> Optional[str]:
    """The metric a run was optimised against: the metric whose model is the run's qe.path, else
    "kiwi" for a QE-trained method (they all train against a CometKiwi-style estimator); with a
    composite reward, its first term's (``infer_reward_terms`` gives them all); None for SFT and for
    a model without a run."""
    if not config or config.get("method") not in QE_TRAINED_METHODS:
        return None
    terms = infer_reward_terms(config, spec)
    if terms:
        return terms[0]["metric"]
    qe_path = str((config.get("qe") or {}).get("path", ""))
    finetune = config.get("qe_finetune") or {}
    if config.get("method") == "qe-finetune" and finetune.get("selection") == "mbr":
        # Trained on MBR choices: optimised against its utility, a COMET model or chrF++ consensus.
        utility = str(finetune.get("utility", "chrf"))
        if utility == "chrf":
            return None
        return next((name for name, m in spec.qe_models().items() if _same_model(m, utility)), None)
    for name, model in spec.qe_models().items():
        if qe_path and _same_model(model, qe_path):
            return name
    return "kiwi"


def run_metric_spec(config: Optional[dict], spec: MetricSpec) -> MetricSpec:
    """``spec`` with the run's ``eval.bleu_tokenize`` (the tokenizer its validation BLEU used) where
    ``spec`` chooses none, so a run's test BLEU is tokenized as its validation BLEU was."""

    chosen = ((config or {}).get("eval") or {}).get("bleu_tokenize")
    if spec.bleu_tokenize is None and chosen:
        return dataclasses.replace(spec, bleu_tokenize=chosen)
    return spec


def translate_test(model: str, src_lang: str, tgt_lang: str, src: list[str], gen: GenerationConfig,
                    device: Optional[str], selection=None) -> tuple[list[str], dict, float, Optional[dict]]:
    """(hypotheses, decoding provenance, seconds, the selection's record or None) of a saved
    translator on the test sources, with ``selection`` (a ``qeebm.translation.qad.Selection``) choosing among
    its candidates if given. The translator is freed before returning, and before a selection's
    model is loaded: the QE models come next, one at a time."""

    decoding: dict = {}

    def load() -> Translator:
        translator = Translator.load(ModelConfig(name_or_path=model, src_lang=src_lang, tgt_lang=tgt_lang))
        translator.to(_torch_device(device))
        decoding.update(src_lang=translator.src_code, tgt_lang=translator.tgt_code)
        return translator

    start = time.perf_counter()
    record = None
    if selection is None:
        translator = load()
        hyps = decode_test(translator, src, gen)
        del translator
        gc.collect()
    else:
        hyps, record = decode_and_select(load, src, gen, selection, device)
        gen = selection.generation(gen)
    seconds = time.perf_counter() - start
    return hyps, decoding_info(gen) | decoding, seconds, record


def evaluate_run(run_dir: Union[str, Path], test=None, metrics: Optional[MetricSpec] = None, *,
                 split: str = "test", generation: Optional[GenerationConfig] = None,
                 system: Optional[str] = None, trained_on: Optional[str] = "auto",
                 heldout: Union[Sequence[str], str] = "auto", checkpoint: Optional[str] = None,
                 selection=None) -> tuple[dict, Path]:
    """Evaluate a training run's best (else final) model, or its ``checkpoint`` (e.g. ``best-chrf``),
    and write ``<run>/eval/<split>.json`` (with a ``selection``: ``<split>-<rule>.json``, system
    ``<system>+<rule>``). ``test`` defaults to the run's data.test; system, seed, config_id and
    trained_on come from the run's config.yaml unless given. Returns (report, path)."""

    config = run_config(run_dir)
    if config is None:
        raise QeebmError(f"{run_dir} has no config.yaml: is it a qeebm run directory?")
    spec = run_metric_spec(config, metrics or MetricSpec())
    model_dir = run_model_dir(run_dir, checkpoint)
    if test is None:
        test = CorpusConfig(**((config.get("data") or {}).get("test") or {}))
    src, ref, path = read_test(test)
    # An explicit trained_on overrides what the config says, its reward's terms included.
    reward_terms = infer_reward_terms(config, spec) if trained_on == "auto" else None
    trained_on = infer_trained_on(config, spec) if trained_on == "auto" else trained_on
    check_trained_on(trained_on, spec)
    check_qe_models(spec, spec.selected())
    check_selection_model(selection)
    model_cfg = config.get("model") or {}
    tgt_lang = model_cfg.get("tgt_lang", "khk_Cyrl")
    if "bleu" in spec.selected():
        bleu_tokenizer(tgt_lang, spec.bleu_tokenize)  # a missing tokenizer package fails before decoding
    hyps, decoding, decode_s, record = translate_test(
        str(model_dir), model_cfg.get("src_lang", "eng_Latn"), tgt_lang, src,
        generation or GenerationConfig(), spec.device, selection)
    report = evaluate_system(
        hyps, Corpus(src, ref, origin=[""] * len(src), name="test"), spec,
        system=system or selection_system(system_name(config), selection), seed=config.get("seed"),
        config_id=make_config_id(config), model=str(model_dir), decoding=decoding, trained_on=trained_on,
        heldout=heldout, data_path=path, selection=record, tgt_lang=tgt_lang, reward_terms=reward_terms)
    report["seconds"] = {"decode": round(decode_s, 3), **report["seconds"]}
    return report, write_eval(report, run_dir, selection_split(split, selection))
