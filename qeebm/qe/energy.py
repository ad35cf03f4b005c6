"""QE-EBM's energy: E(x, y) = -CometKiwi(x, y), differentiable in the translator's output distributions.

comet's own forward takes token ids only, so the energy replays it piece by piece (see
comet/models/multitask/unified_metric.py, ``UnifiedMetric.forward``):

1. tokenise src and mt as ``encoder.prepare_sample`` does (each segment truncated to
   ``max_length = max_positions - 2`` including ``<s>``/``</s>``);
2. concatenate as ``encoder.concat_sequences`` does: ``<s> mt </s></s> src </s>`` (mt first), then cut
   to ``max_positions`` (the cut can drop the source's tail and the final ``</s>``);
3. run the XLM-R model on ``inputs_embeds`` (the bridge adds the straight-through shift to the mt
   positions), with comet's attention mask and the position ids token ids would have produced; on a
   plain XLM-R encoder only the real tokens go through its layers (``qeebm.qe.packed``), with the
   same value and gradient as the padded batch to float rounding (in eval mode; in train mode the
   dropout draws differ);
4. mix all hidden states with the layer-wise attention (or take ``sent_layer``), take position 0,
   apply the estimator (its final activation included) and flatten: that is comet's score.

The value is exactly ``model.predict`` on the decoded translation (``relaxation="st"``); only the
backward pass differs from a plain lookup (see ``qeebm/qe/bridge.py``).

With a ``qeebm.translator.Translator``, as ``QeEbm.loss`` uses it::

    energy = load_energy(qe_path, translator, freeze=True)
    seqs = translator.generate_ids(input_ids, attention_mask, gen, k)       # [B*k, 1 + T]
    tf = translator.teacher_forcing(seqs)
    mt_ids, mt_mask = seqs[:, 1:], tf["labels"] != -100
    # Only the steps the energy reads are projected onto the vocabulary: [N, V_nmt] logits.
    with output_rows(translator.model, energy.bridge.content_mask(mt_ids, mt_mask)):
        logits = translator.model(input_ids=..., attention_mask=...,        # the sources, repeated k times
                                  decoder_input_ids=tf["decoder_input_ids"]).logits
    e = energy(src, mt_ids, mt_mask, logits)                                # [B*k]

(``[B*k, T, V_nmt]`` logits of every step are accepted too; the energy keeps their content rows.)
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qeebm.errors import QeebmError
from qeebm.qe.bridge import Alignment, Bridge
from qeebm.qe.models import load_qe, qe_kind
from qeebm.qe.packed import packable, packed_scores
from qeebm.qe.scoring import kiwi_row, pad_rows

RELAXATIONS = ("st", "softmax", "gumbel-st")


class KiwiEnergy(nn.Module):
    """Energy ``-score`` of a CometKiwi-style ``UnifiedMetric`` (input segments ``[mt, src]``).

    Args:
        comet_model: a loaded ``comet.models.UnifiedMetric`` (e.g. ``qeebm.qe.models.load_qe``).
        bridge: ``Bridge(translator.tokenizer, comet_model.encoder.tokenizer, vocab_size=V_nmt)``.
        freeze: QE-static (default): every QE parameter gets ``requires_grad=False`` and the QE stays in
            eval mode whatever ``.train()`` is called with (comet's layer-wise attention drops whole
            layers in train mode). With ``freeze=False`` the caller decides what trains; gradients
            reach exactly the QE parameters that require grad.
        gradient_checkpointing: recompute each encoder layer in the backward pass instead of keeping
            its activations (less memory, one more encoder forward of time). Needs an encoder the
            packed forward covers (``qeebm.qe.packed.packable``: CometKiwi on XLM-R / InfoXLM).

    On such an encoder the QE runs on the batch's real tokens only (``qeebm.qe.packed``), as
    QEScorer does; any other encoder takes comet's padded layout.
    """

    def __init__(self, comet_model, bridge: Bridge, freeze: bool = True, gradient_checkpointing: bool = False):
        super().__init__()
        segments = list(getattr(comet_model.hparams, "input_segments", []))
        if segments != ["mt", "src"]:
            raise ValueError(f"KiwiEnergy needs a reference-free UnifiedMetric with input_segments "
                             f"[mt, src]; got {segments}")
        self.qe = comet_model
        self.bridge = bridge
        self.frozen = freeze
        if gradient_checkpointing and not packable(comet_model):
            raise QeebmError("qe.gradient_checkpointing needs a CometKiwi on a plain XLM-R encoder (the packed "
                             f"forward); this QE's encoder is {type(comet_model.encoder.model).__name__}")
        self.checkpointing = gradient_checkpointing
        if freeze:
            self.qe.requires_grad_(False)
            self.qe.eval()
        self.last_alignment: Alignment | None = None

    def train(self, mode: bool = True):
        super().train(mode)
        if self.frozen:
            self.qe.eval()
        return self

    @property
    def tokenizer(self):
        return self.qe.encoder.tokenizer

    @property
    def max_positions(self) -> int:
        return self.qe.encoder.max_positions

    # ---------------------------------------------------------------------------- the energy
    def forward(self, src: list[str], mt_ids: Tensor, mt_mask: Tensor, logits: Tensor,
                relaxation: str = "st", tau: float = 1.0, generator: torch.Generator | None = None,
                alignment: Alignment | None = None) -> Tensor:
        """Energy ``[B]`` (= -QE score) of each translation.

        src:     B source strings.
        mt_ids:  ``[B, T]`` the tokens the translator actually emitted (translator vocabulary, padded);
                 ``mt_ids[b, t]`` was drawn from ``softmax(logits[b, t])``. Language codes, ``</s>``
                 and padding may appear: special tokens never reach the QE.
        mt_mask: ``[B, T]`` 1 for emitted steps, 0 for padding.
        logits:  ``[B, T, V_nmt]`` the translator's teacher-forced logits for those steps, or only
                 their content steps' rows ``[N, V_nmt]`` (row-major over
                 ``self.bridge.content_mask(mt_ids, mt_mask)``, which are the only steps the energy
                 reads: ``qeebm.translator.output_rows`` makes the translator compute just those).
        relaxation:
            "st" (default): the forward pass scores the one-hot of the emitted token (the exact QE
                score of the decoded text); the backward pass is the identity onto softmax(logits).
            "softmax": the forward pass scores the expected embedding: at QE position j,
                ``E_qe[q_j] + sum_t w_jt (p_t - onehot(y_t)) @ B``, which is ``p_t @ E_qe`` where the
                segmentations agree (mBART); smooth in the logits.
            "gumbel-st": straight-through Gumbel-softmax. At every content step (masked in, emitted
                token not special) the forward token is ``argmax_v(logits[t, v] + g[t, v])`` with
                ``g ~ Gumbel(0, 1)`` i.i.d., i.e. a fresh per-step sample from softmax(logits) given the
                emitted prefix (it may differ from ``mt_ids``; a sampled special token drops out of the
                text). The forward value is the exact QE score of the decoded resampled tokens; the
                backward pass is the identity onto ``softmax((logits + g) / tau)``. Non-content steps
                keep their emitted token.
        tau:     temperature of "gumbel-st" (ignored otherwise).
        generator: optional RNG for the Gumbel noise.
        alignment: ``self.align(mt_ids, mt_mask)`` when the caller already has it (saves decoding and
                 aligning again); not used by "gumbel-st", whose forward tokens are resampled.
        """
        if relaxation not in RELAXATIONS:
            raise ValueError(f"relaxation must be one of {RELAXATIONS}, got {relaxation!r}")
        content = self.bridge.content_mask(mt_ids, mt_mask)
        rows_ok = logits.shape[:2] == mt_ids.shape if logits.dim() == 3 else logits.shape[0] == int(content.sum())
        if mt_ids.shape != mt_mask.shape or logits.dim() not in (2, 3) or not rows_ok:
            raise ValueError(f"shape mismatch: mt_ids {tuple(mt_ids.shape)}, mt_mask {tuple(mt_mask.shape)}, "
                             f"logits {tuple(logits.shape)} (3-D per step, or 2-D with one row per content step: "
                             f"{int(content.sum())})")
        if len(src) != mt_ids.shape[0]:
            raise ValueError(f"{len(src)} sources for {mt_ids.shape[0]} translations")
        if logits.dim() == 3:
            logits = logits[content.to(logits.device)]  # [N, V]: one code path for both layouts
        relaxed, forward_ids = self._relax(logits, mt_ids, content, relaxation, tau, generator)
        if alignment is None or relaxation == "gumbel-st":
            alignment = self.align(forward_ids, mt_mask)
        self.last_alignment = alignment
        return -self._score(src, alignment, relaxed=relaxed, forward_ids=forward_ids, relaxation=relaxation,
                            steps_read=content)

    @torch.no_grad()
    def score_ids(self, src: list[str], mt_ids: Tensor, mt_mask: Tensor, alignment: Alignment | None = None) -> Tensor:
        """QE scores ``[B]`` (not energies) of the decoded translations, without gradients; equal to
        comet's ``predict`` on ``translator.tokenizer.decode(mt_ids, skip_special_tokens=True)``.
        ``alignment``: ``self.align(mt_ids, mt_mask)`` if the caller already has it."""
        if alignment is None:
            alignment = self.align(mt_ids, mt_mask)
        return self._score(src, alignment)

    def texts(self, mt_ids: Tensor, mt_mask: Tensor) -> list[str]:
        """The texts the QE reads for ``[B, T]`` translator ids and their mask (no alignment built)."""
        return self.bridge.decode(mt_ids, mt_mask)

    def align(self, mt_ids: Tensor, mt_mask: Tensor) -> Alignment:
        """The bridge's alignment of these translations with comet's per-segment truncation (their
        decoded text is ``.texts``)."""
        return self.bridge.align(mt_ids, mt_mask, self.max_positions - 2)

    # ------------------------------------------------------------------------------ internals
    def _relax(self, logits, mt_ids, content, relaxation, tau, generator):
        """The content steps' logits ``[N, V]`` whose softmax is the relaxed distribution (the bridge
        takes the softmax, only where the QE reads it), and the tokens ``[B, T]`` the forward pass
        scores."""
        if relaxation == "gumbel-st":
            # -log(Exp(1)) ~ Gumbel(0, 1); an exact 0 draw (one in 2^24 in float32, so a few per
            # batch at a 256k vocabulary) would give an infinite logit and a NaN softmax.
            exp = torch.empty_like(logits).exponential_(generator=generator)
            gumbel = -exp.clamp_min(torch.finfo(exp.dtype).tiny).log()
            perturbed = logits + gumbel
            forward_ids = mt_ids.masked_scatter(content.to(mt_ids.device), perturbed.detach().argmax(-1).to(mt_ids.device))
            return perturbed / tau, forward_ids
        return logits, mt_ids

    def _score(self, src: list[str], alignment: Alignment, relaxed: Tensor | None = None,
               forward_ids: Tensor | None = None, relaxation: str = "st", steps_read: Tensor | None = None) -> Tensor:
        tok = self.tokenizer
        max_positions = self.max_positions
        encoder = self.qe.encoder.model
        weight = encoder.embeddings.word_embeddings.weight  # [V_qe, H]
        device = weight.device

        # comet: encoder.prepare_sample(src), then concat_sequences drops <s>/</s> and padding. The K
        # samples of a source share it, so each distinct source is tokenised once.
        pad = tok.pad_token_id
        unique = list(dict.fromkeys(src))
        src_ids = tok(unique, truncation=True, max_length=max_positions - 2)["input_ids"]
        # a literal "<pad>" in the text is dropped, as comet does
        content = {s: [i for i in ids if i != pad][1:-1] for s, ids in zip(unique, src_ids)}
        seqs = [kiwi_row(tok, mt, content[s], max_positions) for mt, s in zip(alignment.qe_ids, src)]
        ids, mask = pad_rows(seqs, pad, device)
        # The position ids XLM-R derives from token ids (pads keep padding_idx); with inputs_embeds it
        # would number the pads too.
        pad_idx = encoder.embeddings.padding_idx
        position_ids = (torch.cumsum(mask.long(), dim=1) * mask.long() + pad_idx).long()

        embeds = F.embedding(ids, weight)  # [B, L, H]
        if relaxed is not None:
            # mt content starts right after <s>; build_inputs_with_special_tokens puts it there.
            # The longest mt segment always fits: it is at most max_positions - 4 tokens long.
            mt_len = max(1, max(len(m) for m in alignment.qe_ids))
            shift = self.bridge.shift(weight, relaxed, forward_ids, alignment, mt_len, relaxation, content=steps_read)
            embeds = embeds + F.pad(shift, (0, 0, 1, ids.shape[1] - 1 - mt_len))

        if packable(self.qe):
            return packed_scores(self.qe, None, mask, inputs_embeds=embeds, position_ids=position_ids,
                                 checkpoint=self.checkpointing)
        out = encoder(inputs_embeds=embeds, attention_mask=mask, position_ids=position_ids,
                      output_hidden_states=True, return_dict=True)
        all_layers = out.hidden_states
        # As UnifiedMetric.forward: layer-wise mix when configured, else one layer; CLS position.
        if self.qe.layerwise_attention:
            embeddings = self.qe.layerwise_attention(all_layers, mask)
        else:
            layer = self.qe.hparams.sent_layer
            if not (isinstance(layer, int) and 0 <= layer < self.qe.encoder.num_layers):
                raise ValueError(f"invalid sent_layer {layer!r}")
            embeddings = all_layers[layer]
        return self.qe.estimator(embeddings[:, 0, :]).view(-1)


def load_energy(path: str, translator, freeze: bool, gradient_checkpointing: bool = False) -> KiwiEnergy:
    """KiwiEnergy over the CometKiwi at ``path`` (a directory or hub id) and a bridge from
    ``translator``'s vocabulary; a missing directory or a reference-based model is a one-line error."""
    looks_local = path.startswith((".", "/", "~")) or path.count("/") != 1
    if looks_local and not Path(path).expanduser().exists():
        raise QeebmError(f"qe.path: no QE model at '{path}' (build the tiny world with `qeebm tinyworld build "
                         "data/tinyworld`, or point qe.path at a CometKiwi directory or hub id)")
    # comet builds randomly initialised modules before loading the weights: keep the run's RNG untouched.
    with torch.random.fork_rng(devices=[]):
        comet = load_qe(path)
    if qe_kind(comet) != "kiwi":
        raise QeebmError(f"qe.path '{path}' is a {qe_kind(comet)} model; QE-EBM needs a reference-free CometKiwi")
    vocab_size = translator.model.config.vocab_size
    return KiwiEnergy(comet, Bridge(translator.tokenizer, comet.encoder.tokenizer, vocab_size=vocab_size), freeze=freeze,
                      gradient_checkpointing=gradient_checkpointing)
