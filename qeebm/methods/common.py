"""What several training methods share: the labelled batch's cross-entropy, the reward a method
reads off a quality estimator and the checks that go with them, the initial translator kept as a
reference, and the teacher that translates a method's candidates. Nothing here belongs to one method."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from qeebm.config import Config, GenerationConfig
from qeebm.data.corpus import corpus_format
from qeebm.errors import QeebmError
from qeebm.guards import GuardResult, check
from qeebm.methods.base import Batch
from qeebm.methods.rl import penalised_rewards
from qeebm.qe.scoring import QEScorer
from qeebm.translation.qad import CHRF, ChrfScorer, generate_candidates
from qeebm.translation.translator import eval_mode


@dataclass
class CandidatesConfig:
    """The candidates a teacher writes for each source, shared by QE finetuning and preference
    optimisation: ``num_candidates`` of them, "beam" (the N best of a beam of max(``num_beams``, N))
    or "sample" (``temperature``, ``top_k``, ``top_p``, ``epsilon``), at most ``max_new_tokens``
    long; the teacher is refreshed with the translator every ``refresh_every`` steps (0: never)."""

    num_candidates: int = 8
    candidates: str = "beam"  # beam | sample
    num_beams: int = 1
    max_new_tokens: int = 50
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    epsilon: float = 0.0
    refresh_every: int = 0

log = logging.getLogger(__name__)


def upcast(t: torch.Tensor) -> torch.Tensor:
    """Half-precision logits (mixed precision) are unsafe for softmax and CE; double stays double."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def label_smoothed_ce(model: torch.nn.Module, batch: Batch, label_smoothing: float, upcast=torch.Tensor.float,
                      with_nll: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The labelled batch's label-smoothed cross-entropy, this micro-batch's contribution to the step's
    per-token mean, and (``with_nll``) the plain NLL the same way, without gradient (else None).
    ``upcast`` maps the logits to the dtype the loss is computed in."""
    # Explicit decoder inputs (Translator.decoder_inputs): mBART's shift from labels alone goes wrong
    # on a target holding a literal <pad>.
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                   decoder_input_ids=batch.decoder_input_ids).logits
    logits = upcast(logits).flatten(0, 1)
    labels = batch.labels.flatten()
    # Sum, then divide by the step's token count: micro-batches and processes then add up
    # to the full-batch per-token mean whatever the split.
    total = max(batch.global_tokens, 1)
    loss = F.cross_entropy(logits, labels, ignore_index=-100, label_smoothing=label_smoothing, reduction="sum") / total
    if not with_nll:
        return loss, None
    with torch.no_grad():
        nll = F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum") / total
    return loss, nll


# The scorers whose score reads the reference of every translation: a reference-based COMET, and
# sentence chrF++ (``qe.path: chrf``, the minimum-risk-training reward).
REFERENCE_KINDS = ("comet", "chrf")


def build_scorer(cfg: Config, device: torch.device):
    """A cached, no-grad scorer of ``qe.path`` on ``device``: a QE model (CometKiwi, COMET, XCOMET), or
    sentence chrF++ for the literal ``chrf`` (tests swap in a toy one here)."""

    if cfg.qe.path == CHRF:
        return ChrfScorer()
    from qeebm.qe.models import load_qe

    return QEScorer(load_qe(cfg.qe.path).to(device))


def reads_reference(scorer) -> bool:
    """Whether ``scorer.score`` needs the reference of every row (toys without a ``kind`` do not)."""
    return getattr(scorer, "kind", None) in REFERENCE_KINDS


def _same_path_key(path: str) -> str:
    # Two spellings of one local directory are one QE; a hub id or "chrf" is its own key.
    local = Path(path).expanduser()
    return str(local.resolve()) if local.exists() else path


class CompositeScorer:
    """``reward.terms`` as one scorer: each term's QE (``build_scorer``, so every kind qe.path takes)
    is loaded once however many terms name it; ``score_terms`` gives every term's scores of a batch,
    ``combine`` their weighted sum. A term that reads references gets the rows' ``ref``; the others
    never see it, as a single QE's reward."""

    def __init__(self, cfg: Config, device: torch.device):
        self.terms = list(cfg.reward.terms)
        self.scorers: dict[str, object] = {}
        self.paths: dict[str, str] = {}  # term name -> the key of its scorer
        for i, term in enumerate(self.terms):
            key = _same_path_key(term.path)
            if key not in self.scorers:
                try:
                    one = dataclasses.replace(cfg, qe=dataclasses.replace(cfg.qe, path=term.path))
                    self.scorers[key] = build_scorer(one, device)
                except QeebmError as err:
                    raise QeebmError(f"config key 'reward.terms[{i}].path' ({term.name}): {err}") from None
            self.paths[term.name] = key
        self.reference_terms = [t.name for t in self.terms if reads_reference(self.scorers[self.paths[t.name]])]

    def models(self) -> dict[str, torch.nn.Module]:
        """Each term's QE model by the path its term names (scorers without a model left out)."""
        out = {}
        for term in self.terms:
            model = getattr(self.scorers[self.paths[term.name]], "model", None)
            if model is not None:
                out.setdefault(term.path, model)
        return out

    def score_terms(self, src: list[str], mt: list[str], ref: list[str] | None = None) -> dict[str, list[float]]:
        by_key = {}
        for key, scorer in self.scorers.items():
            by_key[key] = scorer.score(src, mt, ref) if reads_reference(scorer) else scorer.score(src, mt)
        return {t.name: by_key[self.paths[t.name]] for t in self.terms}

    def combine(self, scores: dict[str, list[float]]) -> list[float]:
        """The weighted sum of the terms' scores, row by row."""
        rows = len(scores[self.terms[0].name])
        return [sum(t.weight * scores[t.name][i] for t in self.terms) for i in range(rows)]

    def score(self, src: list[str], mt: list[str], ref: list[str] | None = None) -> list[float]:
        return self.combine(self.score_terms(src, mt, ref))


def check_reference_pool(cfg: Config, names: list[str]) -> None:
    """Terms that read references need a pool with a reference column; a plain-text pool is refused
    here, naming them, before the loop reads it."""

    mono = cfg.data.mono
    if names and mono.path and corpus_format(mono, "mono") == "text" and not mono.tgt_path:
        raise QeebmError(f"config key 'reward.terms': {', '.join(names)} read(s) the reference of every pool sentence, "
                         f"but data.mono.path {mono.path} is plain text: give a TSV with columns "
                         f"'{mono.src_column}' and '{mono.tgt_column}', a JSONL with those keys, or data.mono.tgt_path")


def mono_references(batch: Batch, k: int = 1) -> list[str] | None:
    """The references of the batch's source-only sentences, each repeated ``k`` times (the rows of
    its samples), or None when the pool has none."""
    if batch.mono_ref is None:
        return None
    return [r for r in batch.mono_ref for _ in range(k)]


def check_static_qe(cfg: Config) -> None:
    """A method that scores with a fixed QE refuses ``qe.mode: dynamic``."""
    if cfg.qe.mode != "static":
        raise QeebmError(f"method '{cfg.method}' rewards samples with a fixed QE: qe.mode must be 'static', "
                         f"got {cfg.qe.mode!r}")


class QEReward:
    """What a reward-driven method's reward is made of: the score of (src, mt[, ref]) and the largest
    penalty of the guards it trips. ``rl.penalised_rewards`` combines the two once the whole step is
    known. The score is the QE at ``qe.path`` or, with ``reward.terms``, their weighted sum
    (``CompositeScorer``), whose terms the method logs through ``step_means``. A reference-based
    scorer (a COMET, ``chrf``) reads the reference of every row (``needs_reference``: the pool must
    have them; ``reads_pool``: the method's rows come from it)."""

    def __init__(self, cfg: Config, translator, use_guards: bool, reads_pool: bool = True):
        self.path, self.device = cfg.qe.path, translator.device
        self.composite = CompositeScorer(cfg, translator.device) if cfg.reward.terms else None
        if self.composite is not None:
            self.scorer = self.composite
            self.needs_reference = bool(self.composite.reference_terms)
            self.reader = f"reward.terms {', '.join(self.composite.reference_terms)}"
            if reads_pool:
                check_reference_pool(cfg, self.composite.reference_terms)
        else:
            self.scorer = build_scorer(cfg, translator.device)
            self.needs_reference = reads_reference(self.scorer)
            self.reader = f"qe.path {self.path}"
        self.guards = cfg.guards if use_guards else None
        self.src_lang, self.tgt_lang = cfg.model.src_lang, cfg.model.tgt_lang
        self.count_tokens = translator.num_tokens

    def frozen_qes(self) -> dict[str, torch.nn.Module]:
        """The reward's QEs (``Method.frozen_qes``); none for a scorer without a model (tests' toys)."""
        if self.composite is not None:
            return self.composite.models()
        model = getattr(self.scorer, "model", None)
        return {self.path: model} if model is not None else {}

    def __call__(self, src: list[str], hyps: list[str], refs: list[str] | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, GuardResult | None, dict[str, torch.Tensor]]:
        """Returns (score [B], guard penalty [B], guard result or None, each term's score [B] by name:
        empty without ``reward.terms``), float32 on the CPU. ``refs`` is read only by a
        reference-based scorer."""
        refs = list(refs) if refs is not None and self.needs_reference else None
        terms: dict[str, torch.Tensor] = {}
        if self.composite is not None:
            parts = self.composite.score_terms(list(src), list(hyps), refs)
            score = self.composite.combine(parts)
            terms = {name: torch.tensor(v, dtype=torch.float32) for name, v in parts.items()}
        elif self.needs_reference:
            score = self.scorer.score(list(src), list(hyps), refs)
        else:
            score = self.scorer.score(list(src), list(hyps))
        score = torch.tensor(score, dtype=torch.float32)
        if self.guards is None:
            return score, torch.zeros_like(score), None, terms
        guarded = check(list(src), list(hyps), self.guards, tgt_lang=self.tgt_lang, src_lang=self.src_lang,
                        count_tokens=self.count_tokens)
        return score, torch.tensor(guarded.penalty, dtype=torch.float32), guarded, terms

    def step_means(self, terms: list[dict[str, torch.Tensor]], gather) -> dict[str, float]:
        """``reward/<name>``: each term's mean over every row the step scored (``terms``: what each
        of this process's calls returned; ``gather`` concatenates over processes). Empty without
        ``reward.terms``."""
        if self.composite is None:
            return {}
        names = [t.name for t in self.composite.terms]
        local = torch.zeros(len(names) + 1, dtype=torch.float64)
        for part in terms:
            local += torch.tensor([*(float(part[n].double().sum()) for n in names), part[names[0]].numel()],
                                  dtype=torch.float64)
        total = gather(local.to(self.device)).view(-1, len(names) + 1).sum(0).tolist()
        return {f"reward/{n}": total[i] / max(total[-1], 1.0) for i, n in enumerate(names)}


def step_rewards(scores: list[torch.Tensor], penalties: list[torch.Tensor], unit: str, gather
                 ) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Each micro-batch's rewards (``rl.penalised_rewards`` of its QE ``scores`` and guard
    ``penalties``, tensors of any shape) with the statistics of the whole step, so they do not depend
    on how the step was split: ``gather(t)`` concatenates a 1-d tensor over processes. Returns them
    and the step's scores (1-d, every process's)."""
    step_scores = gather(torch.cat([s.flatten() for s in scores]))
    step_penalty = gather(torch.cat([p.flatten() for p in penalties]))
    return [penalised_rewards(s, p, unit, step_scores, step_penalty) for s, p in zip(scores, penalties)], step_scores


class InitialPolicy:
    """The translator as the method found it, for forward passes without gradient (a reference
    policy, a teacher that is never refreshed), always without dropout.

    With a fresh LoRA adapter (every ``lora_B`` still 0, so the adapter adds nothing yet) it is the
    same network with the adapter disabled (peft): no second copy in memory. Otherwise (full
    fine-tuning, an adapter loaded to be trained further, or a bottleneck adapter, which changes the
    network from its first draw) it is a frozen copy. The loop builds the method before it restores a
    checkpoint, so either way this is the run's starting point, also on resume."""

    def __init__(self, translator):
        self.translator = translator
        self.copy = None
        if not (translator.is_lora and _fresh_adapter(translator.model)):
            self.copy = copy.deepcopy(translator.model).eval().requires_grad_(False)

    @contextlib.contextmanager
    def __call__(self):
        if self.copy is not None:
            yield self.copy
            return
        with eval_mode(self.translator.model) as model, model.disable_adapter():
            yield model


def _fresh_adapter(model: torch.nn.Module) -> bool:
    b = [p for name, p in model.named_parameters() if "lora_B" in name]
    return bool(b) and all(not p.detach().any() for p in b)


class Teacher:
    """The translator that writes a method's candidates (QE finetuning, preference optimisation).

    ``refresh_every`` 0: the initial model throughout (``InitialPolicy``; pass the method's own
    ``initial`` to share it), which makes the candidates offline data. Otherwise a frozen copy that
    becomes the translator as it is after ``step - 1`` updates at every step with (step - 1) a
    multiple of ``refresh_every``; until the first refresh it is the initial model.

    Exact resume: the copy differs from the initial model only in the parameters being trained, so
    ``state_dict`` holds those (after a refresh) and the step of the latest refresh."""

    def __init__(self, translator, refresh_every: int, initial: InitialPolicy | None = None, name: str = "teacher"):
        self.translator, self.refresh_every, self.name = translator, refresh_every, name
        self.model = None  # the refreshed copy; None: the initial model
        self.initial = None
        if refresh_every > 0:
            self.model = copy.deepcopy(translator.model).eval().requires_grad_(False)
            self._copy = dataclasses.replace(translator, model=self.model)
        else:
            self.initial = initial if initial is not None else InitialPolicy(translator)
        self.trained = [n for n, p in translator.model.named_parameters() if p.requires_grad]
        self.refreshed_at = 0  # the step after which the copy was refreshed; 0: the initial model

    def refresh_due(self, step: int) -> bool:
        r = self.refresh_every
        return r > 0 and step > 1 and (step - 1) % r == 0

    def before_step(self, step: int) -> bool:
        """The copy becomes the translator as it is after ``step - 1`` updates, when due; returns
        whether it did."""
        if not self.refresh_due(step):
            return False
        current = dict(self.translator.model.named_parameters())
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                if name in current:
                    p.copy_(current[name])
        self.refreshed_at = step - 1
        log.info("%s: teacher refreshed with the translator after step %d", self.name, step - 1)
        return True

    @contextlib.contextmanager
    def __call__(self):
        """The teacher's module, without dropout."""
        if self.model is not None:
            yield self.model
            return
        with self.initial() as model:
            yield model

    @torch.no_grad()
    def candidates(self, src: list[str], gen: GenerationConfig, n: int) -> list[list[str]]:
        """``n`` translations of each of ``src`` (``qad.generate_candidates``)."""
        if self.model is not None:
            return generate_candidates(self._copy, src, gen, n)
        with self.initial() as model:
            return generate_candidates(dataclasses.replace(self.translator, model=model), src, gen, n)

    def state_dict(self) -> dict:
        teacher = {}
        if self.refreshed_at:
            params = dict(self.model.named_parameters())
            teacher = {n: params[n].detach().cpu().clone() for n in self.trained}
        return {"refreshed_at": self.refreshed_at, "teacher": teacher}

    def load_state_dict(self, state: dict) -> None:
        self.refreshed_at = int(state["refreshed_at"])
        if state["teacher"]:
            params = dict(self.model.named_parameters())
            with torch.no_grad():
                for name, value in state["teacher"].items():
                    params[name].copy_(value)
