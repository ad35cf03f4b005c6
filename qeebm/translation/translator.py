"""The translator: an NLLB-200 (M2M100) or mBART-50 model with its tokenizer and language codes.

Both families share the layout that matters here: the decoder starts from ``</s>`` (id 2), the first
generated token is the target-language code, and sources are ``[src_code] X </s>``. The target code is
forced on every generate() call rather than trusted to the checkpoint's generation defaults, which
have produced wrong-language output for these models.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from qeebm.config import BottleneckConfig, GenerationConfig, LoraConfig, ModelConfig
from qeebm.errors import QeebmError, first_line
from qeebm.utils import hub
from qeebm.utils.integrity import check_model_dir, seal_model_dir
from qeebm.utils.langcodes import to_model_code

log = logging.getLogger(__name__)

FAMILY_OF_MODEL_TYPE = {"m2m_100": "nllb", "mbart": "mbart"}
DROPOUT_KEYS = ("dropout", "attention_dropout", "activation_dropout")
ADAPTER_CONFIG = "adapter_config.json"
# A saved bottleneck translator: the frozen base's files, and the adapter in adapters' own layout in
# this subdirectory (its adapter_config.json is adapters', not peft's).
BOTTLENECK_DIR = "bottleneck"
BOTTLENECK_NAME = "bottleneck"  # the adapter's name inside the model
# The families whose model adapters 1.3 integrates: MBart, not M2M100.
BOTTLENECK_FAMILIES = ("mbart",)


def _looks_local(name: str) -> bool:
    """Whether ``name`` can only be meant as a local path. Hub ids are ``name`` or ``org/name``, so one
    slash alone does not decide it; a first component that exists here does (``runs/sft``)."""
    if name.startswith((".", "~", os.sep)) or os.path.isabs(name):
        return True
    if os.altsep and os.altsep in name:
        return True
    parts = name.split(os.sep)
    return len(parts) > 2 or (len(parts) == 2 and os.path.isdir(parts[0]))


def _local_dir(name: str) -> Path | None:
    """The local directory ``name`` names, None for a hub id; an error for a missing local path."""
    path = Path(name).expanduser()
    if path.is_dir():
        return path.resolve()
    if path.exists():
        raise QeebmError(f"translator path '{name}' is a file; expected a model directory")
    if _looks_local(name):
        raise QeebmError(f"translator directory '{name}' does not exist")
    return None


def _hub_error(name: str, err: Exception) -> QeebmError:
    if hub.hub_cause(err) is not None:
        # The hub answered (a gated or missing repository) or the way there failed: say which.
        return QeebmError(f"cannot load translator '{name}': {hub.reason(err, name)}")
    detail = first_line(err)
    return QeebmError(
        f"cannot load translator '{name}': there is no local directory of that name and no model hub "
        f"is reachable (offline or not cached); pass a local model directory ({detail})"
    )


def _from_pretrained(loader, name: str, local: Path | None, what: str, **kwargs):
    try:
        return loader.from_pretrained(str(local) if local is not None else name, **kwargs)
    except OSError as err:
        if local is None:
            raise _hub_error(name, err) from None
        raise QeebmError(f"cannot load {what} from '{local}': {first_line(err)}") from None
    except (ValueError, TypeError) as err:
        # transformers reports a directory without the needed files this way too (e.g. no vocab file).
        raise QeebmError(f"cannot load {what} from '{name}': {first_line(err)}") from None
    except Exception as err:  # noqa: BLE001 - safetensors and tokenizers raise their own types for a damaged file
        if local is None:
            raise
        raise QeebmError(f"cannot load {what} from '{local}': {type(err).__name__}: {first_line(err)}") from None


def _load_weights(name: str, local: Path | None, config, dropout: float | None):
    """Model weights with the dropout override applied at construction (the layers copy their dropout
    rates from the config when built, so changing the config afterwards does nothing).
    Returns (model, the checkpoint's own dropout values)."""
    from transformers import AutoModelForSeq2SeqLM

    original = {k: getattr(config, k) for k in DROPOUT_KEYS if hasattr(config, k)}
    if dropout is not None:
        for key in original:
            setattr(config, key, dropout)
    model = _from_pretrained(AutoModelForSeq2SeqLM, name, local, "model", config=config)
    return model, original


def weight_files(name: str) -> tuple[Path, list[str]]:
    """Where model ``name``'s weights are read from (a hub id: its snapshot in the local Hugging Face
    cache) and the weight files there that transformers loads: its safetensors files when there are
    any (it prefers them), else its PyTorch ones."""

    root = _local_dir(name) or hub.cached(name)
    if root is None:
        raise QeebmError(f"cannot find the weights of translator '{name}': no local directory of that name, "
                         "and it is not in the local Hugging Face cache")
    for pattern in ("model*.safetensors", "pytorch_model*.bin"):
        names = sorted(p.name for p in root.glob(pattern) if p.is_file())
        if names:
            return root, names
    raise QeebmError(f"{root}: holds no model weights (model*.safetensors or pytorch_model*.bin)")


def _has_tokenizer(path: Path) -> bool:
    return (path / "tokenizer_config.json").is_file() or (path / "tokenizer.json").is_file()


def _peft_config(lora: LoraConfig):
    import peft

    return peft.LoraConfig(
        task_type=peft.TaskType.SEQ_2_SEQ_LM,
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
    )


def _adapters_package():
    try:
        import adapters
    except ImportError:
        raise QeebmError("bottleneck adapters (model.bottleneck) need the adapters package (AdapterHub): "
                         "pip install 'qeebm[adapters]'") from None
    return adapters


def _add_bottleneck(model, bottleneck: BottleneckConfig, saved: Path | None):
    """``model`` with a bottleneck adapter, the only part that trains: the one saved in ``saved``
    (``save_adapter``'s layout) or a fresh one of ``bottleneck``'s kind, drawn from torch's RNG. The
    model keeps its train/eval mode."""
    adapters = _adapters_package()
    was_training = model.training
    adapters.init(model)
    if saved is not None:
        model.load_adapter(str(saved), load_as=BOTTLENECK_NAME, with_head=False, use_safetensors=True)
    else:
        config = adapters.AdapterConfig.load(bottleneck.kind, reduction_factor=bottleneck.reduction_factor)
        model.add_adapter(BOTTLENECK_NAME, config=config)
    # Activating the first adapter warns that none is active (adapters checks before it sets it):
    # untrue once it returns.
    quiet = logging.getLogger("adapters.model_mixin")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        model.train_adapter(BOTTLENECK_NAME)  # freezes everything else and activates the adapter
    finally:
        quiet.setLevel(level)
    # train_adapter puts only the inner model in train mode.
    model.train(was_training)
    return model


def _is_bottleneck(model) -> bool:
    config = getattr(model, "adapters_config", None)  # set by adapters.init
    return config is not None and BOTTLENECK_NAME in config.adapters


def _is_peft(model) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a dependency
        return False
    return isinstance(model, PeftModel)


@contextlib.contextmanager
def eval_mode(module: torch.nn.Module, enabled: bool = True):
    """``module`` in eval mode (dropout off) inside the block when ``enabled``; its previous mode
    (``module.train(was_training)``) is restored on the way out in any case."""
    was_training = module.training
    if enabled:
        module.eval()
    try:
        yield module
    finally:
        module.train(was_training)


@contextlib.contextmanager
def output_rows(model: torch.nn.Module, keep: torch.Tensor):
    """Inside the block ``model``'s output layer projects only the decoder positions where ``keep``
    (``[B, T]`` bool, the decoder input's shape) is true, so ``.logits`` is ``[N, V]`` in row-major
    order of ``keep``: the same rows as the full ``[B, T, V]`` logits at ``keep``, without the
    vocabulary-sized rows of padding and of steps nobody reads (3/4 of a tiny QE-EBM replay).

    ``model``: the translator's model (peft-wrapped or not); calls may still go through a DDP or
    accelerate wrapper around it, since only its output layer's input is cut. Don't pass labels:
    the model's own loss would expect the full layout."""
    head = model.get_output_embeddings()

    def pick(module, args):
        hidden = args[0]
        return (hidden[keep.to(hidden.device)],) + tuple(args[1:])

    handle = head.register_forward_pre_hook(pick)
    try:
        yield
    finally:
        handle.remove()


class _SuppressAfterCode:
    """A logits processor that removes ``ids`` from every step after the forced target code.
    transformers' own ``suppress_tokens`` acts at every step, and after the forced-BOS processor, so
    it would also remove the code at the step where it is the only allowed token. Passed as a custom
    processor it runs after transformers' own processors and before any temperature, which leaves a
    removed token removed: for plain and temperature sampling the result is ``rl.policy_logits``'s
    distribution exactly."""

    def __init__(self, ids: list[int]):
        self.ids = torch.tensor(ids, dtype=torch.long)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[1] < 2 or not self.ids.numel():  # the next token is the forced code
            return scores
        return scores.index_fill(-1, self.ids.to(scores.device), float("-inf"))


class _Nucleus:
    """Nucleus (top-p) filtering with transformers' rule (``TopPLogitsWarper``: keep, most probable
    first, every token whose higher-ranked tokens hold less than ``p``), found among the ``CAP`` most
    probable entries with one top-k instead of sorting the whole vocabulary at every step: that sort
    was the largest part of a REINFORCE rollout at a 3,000-piece vocabulary, and grows with 256k. A
    row whose ``CAP`` best entries hold less than ``p`` is sorted in full.

    Rows that have emitted ``eos_id`` (after the decoder's start token) are left unfiltered: generate
    replaces their next token by ``<pad>`` whatever is drawn, and ``_Draw`` takes one uniform per row
    whatever the probabilities, so no other row's sample changes. Late in a rollout most rows are
    finished and flat, and they were most of the full sorts."""

    CAP = 256

    def __init__(self, p: float, eos_id: int | None = None):
        self.p = p
        self.eos_id = eos_id

    def __call__(self, input_ids: torch.Tensor | None, scores: torch.Tensor) -> torch.Tensor:
        live = None if input_ids is None or self.eos_id is None else (input_ids[:, 1:] != self.eos_id).all(-1)
        if live is None or bool(live.all()):
            return self._filter(scores)
        out = scores.clone()
        out[live] = self._filter(scores[live])
        return out

    def _filter(self, scores: torch.Tensor) -> torch.Tensor:
        top, idx = scores.topk(min(self.CAP, scores.shape[-1]), dim=-1)  # [B, k], most probable first
        probs = (top - scores.logsumexp(-1, keepdim=True)).exp()
        keep = probs.cumsum(-1) - probs < self.p
        keep[:, 0] = True
        out = torch.full_like(scores, float("-inf")).scatter(-1, idx, top.masked_fill(~keep, float("-inf")))
        short = probs.sum(-1) < self.p
        if short.any():
            out[short] = _top_p_sorted(scores[short], self.p)
        return out


# Tokens a block of the two-level inverse-CDF search: one float64 sum a block, then one short
# cumulative sum inside the block the uniform falls in.
_DRAW_BLOCK = 64


def inverse_cdf(probs: torch.Tensor) -> torch.Tensor:
    """One token a row of ``probs`` (``[B, V]``, each row summing to about 1), ``[B, 1]`` long, by
    inverse transform sampling: one uniform in [0, 1) a row from torch's generator, scaled to the
    row's total, and the first token whose cumulative probability exceeds it.

    The cumulative probabilities are float64 but never made whole: the row's blocks of
    ``_DRAW_BLOCK`` tokens are summed (float64), the uniform picks a block from their running sum, and
    only that block's tokens are summed one by one. A whole-row float64 ``cumsum`` was most of the
    draw's time (a fresh 2 MB tensor a token in the tiny world); this is the same search up to float64
    rounding. A token of probability zero is never drawn: its cumulative sum equals its predecessor's,
    a block without mass is never picked, and the uniform is kept strictly below the total (a
    product that rounds up to it would otherwise run past the last token with mass)."""
    b, v = probs.shape
    full, tail = divmod(v, _DRAW_BLOCK)
    mass = probs[:, : full * _DRAW_BLOCK].unflatten(-1, (full, _DRAW_BLOCK)).sum(-1, dtype=torch.float64)
    if tail:
        mass = torch.cat([mass, probs[:, full * _DRAW_BLOCK :].sum(-1, keepdim=True, dtype=torch.float64)], -1)
    upto = mass.cumsum(-1)  # [B, blocks]: the mass up to the end of each block
    total = upto[:, -1:]
    u = torch.rand(b, 1, dtype=torch.float64, device=probs.device) * total
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))
    block = torch.searchsorted(upto, u, right=True)  # [B, 1]
    cols = block * _DRAW_BLOCK + torch.arange(_DRAW_BLOCK, device=probs.device)
    local = probs.gather(-1, cols.clamp(max=v - 1)).double().masked_fill_(cols >= v, 0.0)
    before = upto.gather(-1, (block - 1).clamp(min=0)).masked_fill_(block == 0, 0.0)
    at = torch.searchsorted(before + local.cumsum(-1), u, right=True)
    # The block's sum and its running sum may round apart: never step past its last token with mass.
    last = _DRAW_BLOCK - 1 - (local.flip(-1) > 0).int().argmax(-1, keepdim=True)
    return block * _DRAW_BLOCK + torch.minimum(at, last)


class _Draw:
    """The last sampling processor: draws each row's next token from the softmax of the processed
    scores with ``inverse_cdf`` and leaves only that token finite, so greedy search emits it. The
    distribution is the one transformers' sampling draws from; the draws differ: torch.multinomial
    draws one exponential per vocabulary entry and row (the Gumbel-max trick), which on a CPU was half
    of a tiny-world rollout and grows with a 256k vocabulary. generate's ``output_scores`` are then
    these one-token rows; sampler "multinomial" keeps the distribution."""

    def __call__(self, input_ids: torch.Tensor | None, scores: torch.Tensor) -> torch.Tensor:
        token = inverse_cdf(scores.softmax(-1))
        return torch.full_like(scores, float("-inf")).scatter_(-1, token, 0.0)


def _top_p_sorted(scores: torch.Tensor, p: float) -> torch.Tensor:
    """``TopPLogitsWarper(p)`` (min_tokens_to_keep 1) by the same arithmetic on the same ascending
    order, sorted by numpy on CPU: its argsort of a 3,000-entry row is about 3.5x faster than
    torch.sort's here. Tied scores may be ordered differently, which changes nothing but which of
    two equal tokens is cut at the boundary."""
    if scores.device.type == "cpu" and scores.dtype in (torch.float32, torch.float64):
        import numpy as np

        order = torch.from_numpy(np.argsort(scores.numpy(), axis=-1))
    else:
        order = scores.argsort(dim=-1)
    cumulative = scores.gather(-1, order).softmax(dim=-1).cumsum(dim=-1)
    remove = cumulative <= 1 - p
    remove[:, -1] = False
    return scores.masked_fill(remove.scatter(-1, order, remove), float("-inf"))


@dataclass
class Translator:
    model: torch.nn.Module  # the (possibly peft-wrapped) seq2seq model, never the DDP wrapper
    tokenizer: object  # NllbTokenizerFast or MBart50TokenizerFast
    family: str  # "nllb" | "mbart"
    src_code: str  # model-specific code, e.g. eng_Latn or en_XX
    tgt_code: str  # e.g. khk_Cyrl or mn_MN
    tgt_lang_id: int  # token id of tgt_code: forced as the first generated token
    # The checkpoint's own dropout rates, written back by save() when load() overrode them.
    checkpoint_dropout: dict = field(default_factory=dict, repr=False)
    # The model the weights were loaded from (hub id or directory): for a LoRA translator the frozen
    # base, which its training checkpoints leave out (an adapter directory's base, not the adapter).
    base_name_or_path: str = ""

    @classmethod
    def load(cls, cfg: ModelConfig) -> "Translator":
        """AutoModelForSeq2SeqLM + AutoTokenizer from a hub id or local dir; family from model_type;
        languages mapped from NLLB codes; optional dropout override, and LoRA (peft) or bottleneck
        adapters (adapters).

        A directory holding a peft adapter (adapter_config.json, as ``save(merge_lora=False)`` writes)
        loads its base model and the adapter, trainable; one holding a bottleneck adapter
        (``bottleneck/``, as ``save`` writes for one) loads its base and that adapter, trainable, with
        ``model.bottleneck`` on or off. A local directory's files are checked first
        (``integrity.check_model_dir``): a damaged one is a one-line error naming the file."""
        from transformers import AutoConfig, AutoTokenizer

        name = cfg.name_or_path
        local = _local_dir(name)
        if local is not None:
            check_model_dir(local)  # a damaged file is named before anything is read from the directory
        adapter = local is not None and (local / ADAPTER_CONFIG).is_file()
        if adapter:
            base_name = json.loads((local / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
            if not base_name:
                raise QeebmError(f"adapter '{local}' does not name its base model (base_model_name_or_path)")
            base_local = _local_dir(base_name)
            if base_local is not None:
                check_model_dir(base_local)
        else:
            base_name, base_local = name, local
        saved_bottleneck = local / BOTTLENECK_DIR if local is not None else None
        if saved_bottleneck is not None and not (saved_bottleneck / ADAPTER_CONFIG).is_file():
            saved_bottleneck = None
        bottleneck = cfg.bottleneck.enabled or saved_bottleneck is not None
        if bottleneck and adapter:
            raise QeebmError(f"translator '{name}' is a LoRA adapter; model.bottleneck cannot go on it")
        if bottleneck and cfg.lora.enabled:
            raise QeebmError(
                f"translator '{name}' has a bottleneck adapter, which trains on; set model.lora.enabled=false"
                if saved_bottleneck is not None else
                "model.lora and model.bottleneck are both enabled; choose one kind of adapter")
        # Everything cheap is checked before the weights are read: a mistyped language code should not
        # cost a multi-GB load.
        config = _from_pretrained(AutoConfig, base_name, base_local, "model config")
        family = FAMILY_OF_MODEL_TYPE.get(config.model_type)
        if family is None:
            raise QeebmError(
                f"translator '{name}' is a '{config.model_type}' model; "
                "only NLLB-200 (m2m_100) and mBART-50 (mbart) are supported"
            )
        if bottleneck:
            if family not in BOTTLENECK_FAMILIES:
                raise QeebmError(f"translator '{name}' is a '{config.model_type}' model: the adapters package has "
                                 "bottleneck adapters for mBART only (model.bottleneck); use model.lora")
            _adapters_package()
        src_code = to_model_code(cfg.src_lang, family)
        tgt_code = to_model_code(cfg.tgt_lang, family)
        if adapter and _has_tokenizer(local):
            tokenizer = _from_pretrained(AutoTokenizer, str(local), local, "tokenizer")
        else:
            tokenizer = _from_pretrained(AutoTokenizer, base_name, base_local, "tokenizer")
        vocab = tokenizer.get_vocab()
        for key, code in (("model.src_lang", src_code), ("model.tgt_lang", tgt_code)):
            if code not in vocab:
                raise QeebmError(
                    f"{key}: the tokenizer of '{name}' ({type(tokenizer).__name__}) has no language code '{code}'"
                )
        tokenizer.src_lang = src_code
        tokenizer.tgt_lang = tgt_code

        model, original_dropout = _load_weights(base_name, base_local, config, cfg.dropout)
        if cfg.gradient_checkpointing and not bottleneck:
            # transformers recomputes only in train mode; generation (eval mode) keeps its cache.
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if bottleneck:
            if saved_bottleneck is not None and cfg.bottleneck.enabled:
                log.info("continuing the bottleneck adapter in %s (its own kind and reduction factor apply)",
                         saved_bottleneck)
            model = _add_bottleneck(model, cfg.bottleneck, saved_bottleneck)
            if cfg.gradient_checkpointing:
                # After adapters.init: its override recomputes inside the adapters' forward context.
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        elif adapter:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, str(local), is_trainable=True)
            if cfg.lora.enabled:
                log.info("continuing the LoRA adapter in %s (its own r/alpha/targets apply)", local)
        elif cfg.lora.enabled:
            from peft import get_peft_model

            model = get_peft_model(model, _peft_config(cfg.lora))
        out = cls(
            model=model,
            tokenizer=tokenizer,
            family=family,
            src_code=src_code,
            tgt_code=tgt_code,
            tgt_lang_id=vocab[tgt_code],
            checkpoint_dropout=original_dropout,
            base_name_or_path=base_name,
        )
        trainable, total = out.parameter_counts()
        log.info(
            "translator %s (%s, %s -> %s): %d parameters, %d trainable",
            name, family, src_code, tgt_code, total, trainable,
        )
        return out

    # ------------------------------------------------------------------------------------------
    # Parameters and device

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def to(self, device) -> "Translator":
        self.model.to(device)
        return self

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """The parameters the optimiser should update (only the adapters with LoRA or a bottleneck)."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def parameter_counts(self) -> tuple[int, int]:
        """(trainable, total) parameter counts; tied embeddings are counted once."""
        params = list(self.model.parameters())
        return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)

    @property
    def is_lora(self) -> bool:
        return _is_peft(self.model)

    @property
    def is_bottleneck(self) -> bool:
        return _is_bottleneck(self.model)

    @property
    def adapters_only(self) -> bool:
        """Whether only adapters train (LoRA or a bottleneck) over a frozen base."""
        return self.is_lora or self.is_bottleneck

    # ------------------------------------------------------------------------------------------
    # Tokenisation

    def encode(self, src: list[str], tgt: list[str] | None = None) -> dict[str, torch.Tensor]:
        """Tokenise sources (and targets as labels, padding = -100) with src/tgt language codes.
        Returns input_ids [B, S], attention_mask [B, S] and, with tgt, labels [B, T].

        Sequences longer than the model's ``model_max_length`` are truncated (the language code and
        ``</s>`` are kept); filter long pairs beforehand with ``num_tokens``. Tensors are on the CPU."""
        tok = self.tokenizer
        enc = tok(list(src), padding=True, truncation=True, return_tensors="pt")
        out = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
        if tgt is not None:
            if len(tgt) != len(src):
                raise ValueError(f"{len(src)} sources but {len(tgt)} targets")
            # Masking by the attention mask rather than by pad id: a text can contain the literal "<pad>".
            lab = tok(text_target=list(tgt), padding=True, truncation=True, return_tensors="pt")
            out["labels"] = lab["input_ids"].masked_fill(lab["attention_mask"] == 0, -100)
            out["decoder_input_ids"] = self.decoder_inputs(out["labels"])
        return out

    def decoder_inputs(self, labels: torch.Tensor) -> torch.Tensor:
        """Teacher-forcing decoder inputs [B, T] for ``labels`` [B, T] (padding -100): the decoder
        start token, then the labels shifted right, padding as ``<pad>``. Built here rather than by
        the model from the labels: mBART's own shift finds a row's end by counting non-pad tokens,
        so a target holding a literal ``<pad>`` would start its decoder from the wrong token."""
        config = self.model.config
        start = config.decoder_start_token_id if config.decoder_start_token_id is not None else self.tokenizer.eos_token_id
        shifted = torch.full_like(labels, start)
        shifted[:, 1:] = labels[:, :-1]
        return shifted.masked_fill(shifted == -100, self.tokenizer.pad_token_id)

    def num_tokens(self, texts: list[str], side: str) -> list[int]:
        """Token counts as the model sees them (side: "src" | "tgt"), for length filters.

        Counts include the language code and ``</s>`` and are never truncated (``verbose=False``: a
        text longer than the model takes is what the count is for, not a mistake to warn about)."""
        if side == "src":
            ids = self.tokenizer(list(texts), verbose=False)["input_ids"]
        elif side == "tgt":
            ids = self.tokenizer(text_target=list(texts), verbose=False)["input_ids"]
        else:
            raise ValueError(f"side must be 'src' or 'tgt', got {side!r}")
        return [len(x) for x in ids]

    def decode(self, ids: torch.Tensor | list[list[int]]) -> list[str]:
        """Text of generated ids (special tokens, language codes included, removed)."""
        return self.tokenizer.batch_decode(ids, skip_special_tokens=True)

    # ------------------------------------------------------------------------------------------
    # Generation

    @functools.cached_property
    def suppressed_ids(self) -> list[int]:
        """Token ids sampling never emits after the forced target code: every special token
        (``<pad>``, ``<unk>``, ``<mask>``, the language codes) but ``</s>``. A ``<pad>`` drawn
        mid-sequence would end the text for the decoder but not for the replayed log-probs."""
        vocab_size = self.model.config.vocab_size
        eos = self.tokenizer.eos_token_id
        return sorted(i for i in set(self.tokenizer.all_special_ids) if i != eos and 0 <= i < vocab_size)

    @property
    def forced_eos_id(self) -> int | None:
        """The ``</s>`` the checkpoint's generation config forces at the length cap (mBART-50, M2M100),
        or None: a token forced there is no choice of the policy."""
        generation_config = getattr(self.model, "generation_config", None)
        return getattr(generation_config, "forced_eos_token_id", None)

    def generation_kwargs(self, gen: GenerationConfig, num_return_sequences: int = 1) -> dict:
        """Keyword arguments for ``model.generate``; the target language code is always forced, and
        sampling never draws a special token other than ``</s>`` (``suppressed_ids``)."""
        kwargs = dict(
            max_new_tokens=gen.max_new_tokens,
            num_beams=gen.num_beams,
            do_sample=gen.do_sample,
            num_return_sequences=num_return_sequences,
            forced_bos_token_id=self.tgt_lang_id,
        )
        if gen.do_sample:
            from transformers import LogitsProcessorList

            processors = [_SuppressAfterCode(self.suppressed_ids)]
            if gen.sampler == "inverse-cdf" and gen.num_beams == 1:
                # transformers' warpers in its own order (temperature, top-k, top-p, epsilon), then the
                # draw; greedy search emits the one token left.
                from transformers import EpsilonLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper

                if gen.temperature != 1.0:
                    processors.append(TemperatureLogitsWarper(gen.temperature))
                if gen.top_k:
                    processors.append(TopKLogitsWarper(gen.top_k))
                if gen.top_p < 1.0:
                    processors.append(_Nucleus(gen.top_p, self.tokenizer.eos_token_id))
                if gen.epsilon:
                    processors.append(EpsilonLogitsWarper(gen.epsilon))
                kwargs.update(do_sample=False, logits_processor=LogitsProcessorList([*processors, _Draw()]))
            else:
                # transformers' sampling as it is ("multinomial", or beam sampling). Passed even at their
                # neutral values: a checkpoint's own defaults (top_k=50 in transformers) would otherwise
                # apply, and top_k=0 here means plain ancestral sampling.
                kwargs.update(temperature=gen.temperature, top_k=gen.top_k, top_p=gen.top_p,
                              epsilon_cutoff=gen.epsilon, logits_processor=LogitsProcessorList(processors))
        return kwargs

    @torch.no_grad()
    def generate_ids(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        gen: GenerationConfig,
        num_return_sequences: int = 1,
        **overrides,
    ) -> torch.Tensor:
        """One batch of generation, exactly the tokens emitted: [B * num_return_sequences, T].

        Row layout (rows of one source are adjacent): ``</s>`` (decoder start), ``tgt_lang_id``, the
        tokens, ``</s>`` unless ``max_new_tokens`` was reached, then ``<pad>`` up to T. Use
        ``teacher_forcing`` to re-score these rows. ``gen.batch_size`` is ignored here; ``overrides``
        go to ``model.generate`` last. The model runs in eval mode and its mode is restored."""
        kwargs = self.generation_kwargs(gen, num_return_sequences) | overrides
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        with eval_mode(self.model):
            n = kwargs["num_return_sequences"]
            if n > 1 and any(isinstance(p, _Draw) for p in kwargs.get("logits_processor", ())):
                # Greedy search returns one row per input: encode each source once and repeat its
                # rows, as transformers' sampling does itself.
                from transformers.modeling_outputs import BaseModelOutput

                encoded = self.model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)
                kwargs.update(num_return_sequences=1, encoder_outputs=BaseModelOutput(
                    last_hidden_state=encoded.last_hidden_state.repeat_interleave(n, 0)))
                input_ids, attention_mask = input_ids.repeat_interleave(n, 0), attention_mask.repeat_interleave(n, 0)
            return self.model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)

    @torch.no_grad()
    def generate(self, src: list[str], gen: GenerationConfig, num_return_sequences: int = 1) -> list[str]:
        """Translate in batches of gen.batch_size, forcing tgt_lang_id as first token at generate() time.
        Returns len(src) * num_return_sequences strings, those of one source adjacent."""
        out: list[str] = []
        step = max(1, gen.batch_size)
        for start in range(0, len(src), step):
            enc = self.encode(src[start : start + step])
            ids = self.generate_ids(enc["input_ids"], enc["attention_mask"], gen, num_return_sequences)
            out.extend(self.decode(ids))
        return out

    def teacher_forcing(self, sequences: torch.Tensor) -> dict[str, torch.Tensor]:
        """decoder_input_ids and labels that replay ``generate_ids`` rows under teacher forcing.

        Pass both to the model: with labels alone, mBART builds its decoder inputs by rotating the last
        non-pad token to the front, which is wrong for a row cut off by max_new_tokens. Labels are -100
        after the first ``</s>``; a row without one keeps all its tokens."""
        decoder_input_ids = sequences[:, :-1]
        labels = sequences[:, 1:].clone()
        eos = labels == self.tokenizer.eos_token_id
        # Positions strictly after the first </s>: the running count of </s> before them is > 0.
        after_eos = (eos.cumsum(dim=1) - eos.long()) > 0
        labels[after_eos] = -100
        return {"decoder_input_ids": decoder_input_ids, "labels": labels}

    # ------------------------------------------------------------------------------------------
    # Saving

    def save(self, out_dir: str | Path, merge_lora: bool = True) -> None:
        """save_pretrained model (LoRA merged unless merge_lora=False) + tokenizer, loadable by
        transformers.pipeline("translation", model=out_dir, src_lang=..., tgt_lang=...).

        With merge_lora=False a LoRA translator writes only its adapter (adapter_config.json names the
        base model), which ``Translator.load`` reloads. A bottleneck translator writes its frozen base
        and, in ``bottleneck/``, its adapter (adapters' ``save_adapter`` layout): ``Translator.load``
        reloads both, while transformers alone would load the base without the adapter (see
        docs/training.md for loading it with the adapters package). A dropout override is not saved:
        the written config keeps the checkpoint's own dropout rates. ``digests.json`` records every
        file's size and sha256 (qeebm.utils.integrity), checked by ``Translator.load``."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        if self.is_lora and merge_lora:
            # merge_and_unload rewrites the modules in place, so it works on a copy and training goes on.
            to_save = copy.deepcopy(self.model).merge_and_unload()
        else:
            to_save = self.model
        config = to_save.config if not _is_peft(to_save) else to_save.get_base_model().config
        original = self.checkpoint_dropout
        current = {k: getattr(config, k) for k in original}
        for key, value in original.items():
            setattr(config, key, value)
        try:
            if self.is_bottleneck:
                _save_bottleneck(to_save, out)
            else:
                to_save.save_pretrained(str(out))
        finally:
            for key, value in current.items():
                setattr(config, key, value)
        self.tokenizer.save_pretrained(str(out))
        seal_model_dir(out)  # Translator.load checks the files against it


def _save_bottleneck(model, out: Path) -> None:
    """A bottleneck translator's frozen base into ``out`` and its adapter into ``out/bottleneck``.
    A bottleneck is not linear, so nothing can be merged. transformers' own save_pretrained writes the
    base: adapters' override would record the adapter in config.json, and adapters.init would then
    rebuild it, freshly drawn, before the saved one is loaded."""
    from transformers import PreTrainedModel

    base = {k: v for k, v in model.state_dict().items() if BOTTLENECK_NAME not in k.split(".")}
    PreTrainedModel.save_pretrained(model, str(out), state_dict=base)
    # with_head=False: adapters would otherwise add a copy of the output layer (the whole vocabulary).
    model.save_adapter(str(out / BOTTLENECK_DIR), BOTTLENECK_NAME, with_head=False, use_safetensors=True)


def translate_file(
    model_path: str,
    src_lang: str,
    tgt_lang: str,
    in_path: str | Path,
    out_path: str | Path,
    gen: GenerationConfig,
    selection=None,
) -> int:
    """``qeebm translate``: one translation per input line (empty lines stay empty); returns the count.
    With ``selection`` (a ``qeebm.translation.qad.Selection``) each line's translation is the one it chooses
    among the candidates."""
    in_path, out_path = Path(in_path), Path(out_path)
    if not in_path.is_file():
        raise QeebmError(f"input file not found: {in_path}")
    try:
        lines = in_path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise QeebmError(f"{in_path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    device = "cuda" if torch.cuda.is_available() else "cpu"

    def load() -> Translator:
        return Translator.load(ModelConfig(name_or_path=model_path, src_lang=src_lang, tgt_lang=tgt_lang)).to(device)

    todo = [i for i, line in enumerate(lines) if line.strip()]
    src = [lines[i].strip() for i in todo]
    if selection is None:
        hyps = load().generate(src, gen)
    else:
        from qeebm.translation.qad import check_selection_model, decode_and_select

        check_selection_model(selection)
        hyps, _ = decode_and_select(load, src, gen, selection, torch.device(device))
    out_lines = [""] * len(lines)
    for i, hyp in zip(todo, hyps):
        # One line per input line, whatever the model emits.
        out_lines[i] = " ".join(hyp.split())
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text("".join(line + "\n" for line in out_lines), encoding="utf-8")
    log.info(
        "translated %d lines (%d empty kept empty) from %s to %s -> %s",
        len(todo), len(lines) - len(todo), src_lang, tgt_lang, out_path,
    )
    return len(todo)
