"""What a planned run will write to disk, computed before it runs: the recipes' ``--dry-run`` prints it.

A run keeps its translator whole in ``best/``, one ``best-<metric>/`` per ``eval.also_best`` and
``final/`` (LoRA merged; a bottleneck translator as its base plus the adapter), and its newest
``output.keep_last`` checkpoints, each the part that trains (the whole translator under full
fine-tuning, the adapters otherwise), AdamW's two moments of it and the method's own state.
Parameters are counted on PyTorch's meta device, so nothing is downloaded or allocated: from the
model's own ``config.json`` when it is a local directory or in the Hugging Face cache, else from the
architecture of the hub translators the recipes name (``HUB_ARCHITECTURES``). Values are counted at 4
bytes (fp32: mixed precision keeps fp32 weights and moments); file headers and the tokenizer (some
MB) are left out.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

from qeebm.config import Config, ModelConfig

BYTES_PER_VALUE = 4
# The config.json fields that set the parameter count of the recipes' hub translators.
HUB_ARCHITECTURES = {
    "facebook/mbart-large-50": ("mbart", dict(
        vocab_size=250054, d_model=1024, encoder_layers=12, decoder_layers=12, encoder_ffn_dim=4096,
        decoder_ffn_dim=4096, encoder_attention_heads=16, decoder_attention_heads=16,
        max_position_embeddings=1024)),
    "facebook/nllb-200-distilled-600M": ("m2m_100", dict(
        vocab_size=256206, d_model=1024, encoder_layers=12, decoder_layers=12, encoder_ffn_dim=4096,
        decoder_ffn_dim=4096, encoder_attention_heads=16, decoder_attention_heads=16,
        max_position_embeddings=1024, scale_embedding=True)),
}
# Methods whose state holds a copy of the trained parameters (the teacher they refresh).
TEACHER_METHODS = ("qe-finetune", "dpo", "cpo")


@dataclass(frozen=True)
class Counts:
    saved: int  # values in a saved translator directory
    trained: int  # values that train (and are checkpointed with their AdamW moments)


@dataclass(frozen=True)
class RunDisk:
    model_dirs: int  # how many whole translators the run keeps
    model_bytes: int  # all of them
    checkpoints: int  # how many are kept at once
    checkpoint_bytes: int  # each
    note: str = ""  # what is not counted

    @property
    def total(self) -> int:
        return self.model_bytes + self.checkpoints * self.checkpoint_bytes


def _config(name: str):
    from transformers import AutoConfig

    from qeebm.translation.translator import _local_dir

    local = _local_dir(name)
    if local is not None:
        return AutoConfig.from_pretrained(str(local))
    if name in HUB_ARCHITECTURES:
        model_type, fields = HUB_ARCHITECTURES[name]
        return AutoConfig.for_model(model_type, **fields)
    try:  # the cache only: a dry run downloads nothing
        return AutoConfig.from_pretrained(name, local_files_only=True)
    except (OSError, ValueError):
        return None


def translator_counts(cfg: ModelConfig) -> Optional[Counts]:
    """The values a translator of ``cfg`` saves and trains, or None when its architecture is not
    known offline. Counted once per setting in a process (the recipes' plans share their models)."""
    key = repr(cfg)
    if key not in _COUNTED:
        _COUNTED[key] = _count(cfg)
    return _COUNTED[key]


_COUNTED: dict[str, Optional[Counts]] = {}


def _count(cfg: ModelConfig) -> Optional[Counts]:
    import torch
    from transformers import AutoModelForSeq2SeqLM

    from qeebm.translation.translator import _add_bottleneck, _peft_config

    config = _config(cfg.name_or_path)
    if config is None:
        return None
    with torch.device("meta"):
        model = AutoModelForSeq2SeqLM.from_config(config)
        kept = model.state_dict().keys()
        saved = sum(p.numel() for p in model.parameters())
        saved += sum(b.numel() for name, b in model.named_buffers() if name in kept)
        trained = saved
        if cfg.lora.enabled:
            import peft

            model = peft.get_peft_model(model, _peft_config(cfg.lora))
            trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
        elif cfg.bottleneck.enabled:
            quiet = logging.getLogger("adapters")
            level = quiet.level
            quiet.setLevel(logging.ERROR)
            try:
                model = _add_bottleneck(model, cfg.bottleneck, None)
            finally:
                quiet.setLevel(level)
            trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
            saved += trained  # the base and, beside it, the adapter
    return Counts(saved, trained)


def run_disk(cfg: Config, counts: Counts) -> RunDisk:
    """The disk one run of ``cfg`` keeps, given its translator's ``counts``."""
    dirs = 2 + len(cfg.eval.also_best)  # best/, best-<metric>/..., final/
    trained = counts.trained
    if not cfg.model.lora.enabled and not cfg.model.bottleneck.enabled:
        trained = counts.saved  # model.pt is the whole state dict
    values = trained * 3  # the weights that train and AdamW's two moments
    if cfg.method in TEACHER_METHODS:
        values += counts.trained
    note = ""
    if cfg.method == "qe-ebm" and cfg.qe.mode == "dynamic":
        note = "plus the trained QE parts and their moments in each checkpoint"
    elif cfg.method == "ppo":
        note = "plus the value head"
    if cfg.output.keep_last < 1:
        note = "; ".join(filter(None, [note, "output.keep_last < 1 keeps every checkpoint: one such per save"]))
    return RunDisk(dirs, dirs * counts.saved * BYTES_PER_VALUE, max(cfg.output.keep_last, 1),
                   values * BYTES_PER_VALUE, note)


def size(n: int) -> str:
    """Bytes in the unit a reader takes in at once (decimal, as disks are sold)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}" if n < 100 * scale else f"{n / scale:.0f} {unit}"
    return f"{n} B"
