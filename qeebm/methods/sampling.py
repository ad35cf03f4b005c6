"""K samples per source from the translator, shared by every method that samples (QE-EBM,
REINFORCE, PPO, GRPO): one place that generates, replicates the sources and keeps the emitted
tokens, and one that replays them for their log-probabilities."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qeebm.config import GenerationConfig, SamplingConfig
from qeebm.errors import QeebmError
from qeebm.methods.base import Batch
from qeebm.methods.rl import eos_mask, policy_logits, sequence_logprobs, token_entropy


def sampling_config(c: SamplingConfig) -> GenerationConfig:
    """Ancestral / top-k / nucleus sampling as a method's ``sampling`` section asks."""
    return GenerationConfig(num_beams=1, do_sample=True, max_new_tokens=c.max_new_tokens,
                            temperature=c.temperature, top_k=c.top_k, top_p=c.top_p, sampler=c.sampler)


@dataclass
class Samples:
    """K samples of each of N sources, B = N * K rows, the samples of one source adjacent.

    ``src``: B source texts; ``hyps``: B decoded samples (None when ``sample`` was told not to decode).
    ``input_ids``, ``attention_mask``: [B, S] the sources, each repeated K times.
    ``sequences``: [B, T+1] what ``generate_ids`` returned (``</s>``, language code, tokens..., pad).
    ``mask`` [B, T]: the policy's actions among the emitted tokens: up to and including the first
    ``</s>``, without the forced language code, and without a ``</s>`` the model's generation config
    forced at the length cap (mBART-50, M2M100: ``Translator.forced_eos_id``).
    ``temperature``, ``suppress``: what the sampler did to the logits (the divisor, and the token ids
    it never draws); ``rl.policy_logits(logits, temperature, suppress)`` gives the distribution the
    samples were drawn from, for log-probs that are the sampler's.
    """

    src: list[str]
    hyps: list[str] | None
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    sequences: torch.Tensor
    mask: torch.Tensor
    temperature: float = 1.0
    suppress: torch.Tensor | None = None

    @property
    def tokens(self) -> torch.Tensor:
        """[B, T] the emitted tokens (the teacher-forcing labels before masking)."""
        return self.sequences[:, 1:]

    @property
    def decoder_input_ids(self) -> torch.Tensor:
        """[B, T] replays the samples; explicit decoder inputs, since with labels alone mBART would
        rotate the last token to the front."""
        return self.sequences[:, :-1]


@torch.no_grad()
def sample(translator, src: list[str], k: int, gen: GenerationConfig, enc: dict | None = None,
           decode: bool = True) -> Samples:
    """``k`` samples of each of ``src``; ``enc`` (input_ids, attention_mask on the translator's
    device) saves re-tokenising sources that are already encoded; ``decode=False`` leaves ``hyps``
    None for callers that decode the tokens their own way."""
    if enc is None:
        enc = {key: v.to(translator.device) for key, v in translator.encode(src).items()}
    tok = translator.tokenizer
    # eos_token_id passed explicitly: a rollout must end at </s> (the reference PPO code had -1 here).
    sequences = translator.generate_ids(enc["input_ids"], enc["attention_mask"], gen, num_return_sequences=k,
                                        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)  # [B, T+1]
    mask = action_mask(translator, sequences, gen.max_new_tokens)
    return Samples(
        src=[s for s in src for _ in range(k)],
        hyps=translator.decode(sequences) if decode else None,
        input_ids=enc["input_ids"].repeat_interleave(k, dim=0),
        attention_mask=enc["attention_mask"].repeat_interleave(k, dim=0),
        sequences=sequences,
        mask=mask,
        temperature=gen.temperature,
        suppress=torch.tensor(translator.suppressed_ids, dtype=torch.long, device=sequences.device),
    )


def replay(module, s: Samples, rows: torch.Tensor | None = None, hidden_states: bool = False,
           entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None, object]:
    """Teacher-force the samples (``rows`` of them, or all) through ``module``: the log-probability
    [b, T] of each sampled token under the distribution it was drawn from (``rl.policy_logits``: the
    temperature, the suppressed tokens), 0 off the mask; the policy's token entropy [b, T]
    (detached) when ``entropy``, else None; and the model's output, whose
    ``decoder_hidden_states`` exist when ``hidden_states``. Gradients flow when the caller allows
    them; dropout is the caller's to switch off."""
    pick = (lambda t: t) if rows is None else (lambda t: t[rows])
    mask = pick(s.mask)
    out = module(input_ids=pick(s.input_ids), attention_mask=pick(s.attention_mask),
                 decoder_input_ids=pick(s.decoder_input_ids), output_hidden_states=hidden_states, use_cache=False)
    logits = policy_logits(out.logits, s.temperature, s.suppress)  # [b, T, V]
    logp, _ = sequence_logprobs(logits, pick(s.tokens), mask)  # [b, T]
    return logp, token_entropy(logits, mask) if entropy else None, out


def action_mask(translator, sequences: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """``[B, T]`` the policy's actions among ``sequences[:, 1:]`` (``Samples.mask``)."""
    tok = translator.tokenizer
    tokens = sequences[:, 1:]
    mask = eos_mask(tokens, tok.eos_token_id, tok.pad_token_id, n_forced=1)
    if translator.forced_eos_id is not None and tokens.shape[1] == max_new_tokens:
        # The last of max_new_tokens positions holds the forced </s> of every row that got there.
        mask[:, -1] &= tokens[:, -1] != translator.forced_eos_id
    return mask


def mono_sources(batch: Batch) -> list[str]:
    if not batch.mono:
        raise QeebmError("this method samples from the source-only pool, but the batch has none (data.mono)")
    return batch.mono
