"""QE-EBM's energy: E(x, y) = -QE(x, y[, ref]), differentiable in the translator's output distributions.

comet's own forward takes token ids only, so each energy replays it piece by piece with the
translation's token embeddings shifted by the bridge (``qeebm/qe/bridge.py``):

* ``KiwiEnergy``, a reference-free CometKiwi (``UnifiedMetric`` with input segments [mt, src]; see
  comet/models/multitask/unified_metric.py): src and mt tokenised as ``encoder.prepare_sample`` does
  (each segment truncated to ``max_length = max_positions - 2`` including ``<s>``/``</s>``),
  concatenated as ``encoder.concat_sequences`` does, ``<s> mt </s></s> src </s>`` (mt first), cut to
  ``max_positions``; the XLM-R model on ``inputs_embeds`` with comet's attention mask and the
  position ids token ids would have produced; the layer-wise mix (or ``sent_layer``) at position 0
  and the estimator;
* ``UnifiedEnergy``, a ``UnifiedMetric`` that also reads the reference (XCOMET's input): the same
  replay on comet's three inputs ``<s> mt </s></s> src </s>``, ``<s> mt </s></s> ref </s>`` and
  ``<s> mt </s></s> src </s></s> ref </s>``, combined as ``predict_step`` combines them (their mean;
  XCOMET: the weighted, clipped regression scores plus the weighted MQM score of the decoded error
  spans, which has no gradient and is taken from comet's own decoding of the text);
* ``CometEnergy``, a reference-based ``RegressionMetric`` (wmt22-comet-da's architecture): src, mt
  and ref encoded separately and pooled (``get_sentence_embedding``), the feature vector
  [mt, ref, mt*ref, |mt-ref|, mt*src, |mt-src|] into the estimator. Only the mt encoding carries
  a gradient; the source's and reference's embeddings are constants of the step.

The mt segment starts right after ``<s>`` in every one of these inputs, so one bridge shift serves
them all. On a plain XLM-R encoder only the real tokens go through its layers (``qeebm.qe.packed``),
with the same value and gradient as the padded batch to float rounding (in eval mode).

The value is exactly ``model.predict`` on the decoded translation (``relaxation="st"``); only the
backward pass differs from a plain lookup. A reference-based energy reads the reference of every
row (``ref=``); a reference-free one ignores it.

With a ``qeebm.translation.translator.Translator`` and the energy of ``load_energy``, as ``QeEbm.loss`` uses it::

    energy = load_energy(qe_path, translator, freeze=True)
    seqs = translator.generate_ids(input_ids, attention_mask, gen, k)       # [B*k, 1 + T]
    tf = translator.teacher_forcing(seqs)
    mt_ids, mt_mask = seqs[:, 1:], tf["labels"] != -100
    # Only the steps the energy reads are projected onto the vocabulary: [N, V_nmt] logits.
    with output_rows(translator.model, energy.bridge.content_mask(mt_ids, mt_mask)):
        logits = translator.model(input_ids=..., attention_mask=...,        # the sources, repeated k times
                                  decoder_input_ids=tf["decoder_input_ids"]).logits
    e = energy(src, mt_ids, mt_mask, logits, ref=refs)                      # [B*k]; refs: reference-based only

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
from qeebm.qe.scoring import _EvalMode, _to, kiwi_row, pad_rows

RELAXATIONS = ("st", "softmax", "gumbel-st", "reinmax")


class Energy(nn.Module):
    """What every energy shares: the relaxation, the bridge, the alignment, freezing. A subclass
    says how comet's inputs are assembled around the (shifted) mt segment and scored (``_score``).

    Args:
        comet_model: a loaded comet model (``qeebm.qe.models.load_qe``) of the subclass's kind.
        bridge: ``Bridge(translator.tokenizer, comet_model.encoder.tokenizer, vocab_size=V_nmt)``.
        freeze: QE-static (default): every QE parameter gets ``requires_grad=False`` and the QE stays in
            eval mode whatever ``.train()`` is called with (comet's layer-wise attention drops whole
            layers in train mode). With ``freeze=False`` the caller decides what trains; gradients
            reach exactly the QE parameters that require grad.
        gradient_checkpointing: recompute each encoder layer in the backward pass instead of keeping
            its activations (less memory, one more encoder forward of time). Needs an encoder the
            packed forward covers (``qeebm.qe.packed.packable``: XLM-R / InfoXLM).
    """

    #: whether ``forward`` and ``score_ids`` need the rows' references
    needs_reference = False

    def __init__(self, comet_model, bridge: Bridge, freeze: bool = True, gradient_checkpointing: bool = False):
        super().__init__()
        self.qe = comet_model
        self.bridge = bridge
        self.frozen = freeze
        if gradient_checkpointing and not packable(comet_model):
            raise QeebmError("qe.gradient_checkpointing needs a QE on a plain XLM-R encoder (the packed "
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
                alignment: Alignment | None = None, ref: list[str] | None = None) -> Tensor:
        """Energy ``[B]`` (= -QE score) of each translation.

        src:     B source strings.
        mt_ids:  ``[B, T]`` the tokens the translator actually emitted (translator vocabulary, padded);
                 ``mt_ids[b, t]`` was drawn from ``softmax(logits[b, t])``. Language codes, ``</s>``
                 and padding may appear: special tokens never reach the QE.
        mt_mask: ``[B, T]`` 1 for emitted steps, 0 for padding.
        logits:  ``[B, T, V_nmt]`` the translator's teacher-forced logits for those steps, or only
                 their content steps' rows ``[N, V_nmt]`` (row-major over
                 ``self.bridge.content_mask(mt_ids, mt_mask)``, which are the only steps the energy
                 reads: ``qeebm.translation.translator.output_rows`` makes the translator compute just those).
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
            "reinmax": straight-through's forward pass; the backward pass is ReinMax's second-order
                estimate (``qeebm.qe.bridge.reinmax_jvp``, Liu et al. 2023) instead of the identity.
        tau:     temperature of "gumbel-st" and "reinmax" (ignored otherwise).
        generator: optional RNG for the Gumbel noise.
        alignment: ``self.align(mt_ids, mt_mask)`` when the caller already has it (saves decoding and
                 aligning again); not used by "gumbel-st", whose forward tokens are resampled.
        ref:     B reference strings: required by a reference-based energy, ignored otherwise.
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
        ref = self._check_reference(ref, len(src))
        if logits.dim() == 3:
            logits = logits[content.to(logits.device)]  # [N, V]: one code path for both layouts
        relaxed, forward_ids = self._relax(logits, mt_ids, content, relaxation, tau, generator)
        if alignment is None or relaxation == "gumbel-st":
            alignment = self.align(forward_ids, mt_mask)
        self.last_alignment = alignment
        shift = self._shift(alignment, relaxed, forward_ids, relaxation, content, tau)
        return -self._score(src, ref, alignment, shift)

    def token_gradients(self, src: list[str], mt_ids: Tensor, mt_mask: Tensor, alignment: Alignment | None = None,
                        ref: list[str] | None = None) -> tuple[Tensor, Tensor]:
        """The QE's exact scores ``[B]`` and their gradients ``[B, T, H]`` with respect to each
        translator step's bridged embedding ``z_t = B[y_t]`` (zero at steps the QE does not read):
        ``dQ/d onehot(y_t)[v] = B[v] . grad[b, t]``. One QE forward and a backward to its inputs;
        nothing of the translator is involved, so it runs inside a rollout's ``no_grad`` too."""
        if alignment is None:
            alignment = self.align(mt_ids, mt_mask)
        ref = self._check_reference(ref, len(src))
        weight = self._word_embeddings().weight
        length = max(1, max(len(m) for m in alignment.qe_ids))
        with torch.enable_grad():
            shift = weight.new_zeros(len(src), length, weight.shape[1], requires_grad=True)
            scores = self._score(src, ref, alignment, shift)
            (per_position,) = torch.autograd.grad(scores.sum(), shift)  # [B, L_mt, H]
        rows, qe_pos, nmt_pos, w = (t.to(weight.device) for t in alignment.entries(length))
        # QE position j moves by sum_t w_jt (z_t - sg z_t): step t's gradient is sum_j w_jt dQ/de_j.
        grads = weight.new_zeros(*mt_ids.shape, weight.shape[1])
        grads.index_put_((rows, nmt_pos), per_position[rows, qe_pos] * w.to(grads.dtype)[:, None], accumulate=True)
        return scores.detach(), grads

    @torch.no_grad()
    def score_ids(self, src: list[str], mt_ids: Tensor, mt_mask: Tensor, alignment: Alignment | None = None,
                  ref: list[str] | None = None) -> Tensor:
        """QE scores ``[B]`` (not energies) of the decoded translations, without gradients; equal to
        comet's ``predict`` on ``translator.tokenizer.decode(mt_ids, skip_special_tokens=True)``.
        ``alignment``: ``self.align(mt_ids, mt_mask)`` if the caller already has it."""
        if alignment is None:
            alignment = self.align(mt_ids, mt_mask)
        return self._score(src, self._check_reference(ref, len(src)), alignment, None)

    def bridge_table(self) -> Tensor:
        """The bridge table ``B`` ``[V_nmt, H]``: each translator token's QE-side embedding."""
        return self.bridge.table(self._word_embeddings().weight)

    def texts(self, mt_ids: Tensor, mt_mask: Tensor) -> list[str]:
        """The texts the QE reads for ``[B, T]`` translator ids and their mask (no alignment built)."""
        return self.bridge.decode(mt_ids, mt_mask)

    def align(self, mt_ids: Tensor, mt_mask: Tensor) -> Alignment:
        """The bridge's alignment of these translations with comet's per-segment truncation (their
        decoded text is ``.texts``)."""
        return self.bridge.align(mt_ids, mt_mask, self.max_positions - 2)

    # ------------------------------------------------------------------------------ internals
    def _check_reference(self, ref: list[str] | None, n: int) -> list[str] | None:
        if not self.needs_reference:
            return None
        if ref is None:
            raise QeebmError(f"{type(self).__name__} is reference-based: it needs the reference of every row")
        if len(ref) != n:
            raise ValueError(f"{len(ref)} references for {n} translations")
        return list(ref)

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

    def _shift(self, alignment: Alignment, relaxed: Tensor, forward_ids: Tensor, relaxation: str,
               content: Tensor, tau: float = 1.0) -> Tensor:
        """``[B, L_mt, H]`` the straight-through (or relaxed) shift of the mt segment's embeddings,
        ``L_mt`` its longest row. The longest mt segment always fits every input: it is at most
        ``max_positions - 4`` tokens long."""
        mt_len = max(1, max(len(m) for m in alignment.qe_ids))
        weight = self._word_embeddings().weight
        return self.bridge.shift(weight, relaxed, forward_ids, alignment, mt_len, relaxation, content=content,
                                 tau=tau)

    def _word_embeddings(self) -> nn.Embedding:
        return self.qe.encoder.model.embeddings.word_embeddings

    def _content_ids(self, texts: list[str]) -> dict[str, list[int]]:
        """Each distinct text tokenised once as comet's ``encoder.prepare_sample`` does (truncated to
        ``max_positions - 2`` with its specials), without ``<s>``/``</s>`` or pads (a literal
        "<pad>" in the text is dropped, as comet's ``concat_sequences`` drops it)."""
        tok, pad = self.tokenizer, self.tokenizer.pad_token_id
        unique = list(dict.fromkeys(texts))
        ids = tok(unique, truncation=True, max_length=self.max_positions - 2)["input_ids"]
        return {t: [i for i in row if i != pad][1:-1] for t, row in zip(unique, ids)}

    def _embed(self, rows: list[list[int]], shift: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Padded ``rows`` (mt content right after ``<s>``) as ``inputs_embeds`` with the mt shift
        added: (ids, bool mask, embeddings ``[B, L, H]``, the position ids token ids would give)."""
        emb = self._word_embeddings()
        ids, mask = pad_rows(rows, self.tokenizer.pad_token_id, emb.weight.device)
        # The position ids XLM-R derives from token ids (pads keep padding_idx); with inputs_embeds it
        # would number the pads too.
        position_ids = (torch.cumsum(mask.long(), dim=1) * mask.long() + emb.padding_idx).long()
        embeds = F.embedding(ids, emb.weight)  # [B, L, H]
        if shift is not None:
            embeds = embeds + F.pad(shift, (0, 0, 1, ids.shape[1] - 1 - shift.shape[1]))
        return ids, mask, embeds, position_ids

    def _unified_scores(self, rows: list[list[int]], shift: Tensor | None) -> Tensor:
        """``UnifiedMetric.forward``'s sentence score ``[B]`` of assembled input rows."""
        ids, mask, embeds, position_ids = self._embed(rows, shift)
        if packable(self.qe):
            return packed_scores(self.qe, None, mask, inputs_embeds=embeds, position_ids=position_ids,
                                 checkpoint=self.checkpointing)
        out = self.qe.encoder.model(inputs_embeds=embeds, attention_mask=mask, position_ids=position_ids,
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

    def _score(self, src: list[str], ref: list[str] | None, alignment: Alignment, shift: Tensor | None) -> Tensor:
        raise NotImplementedError


class KiwiEnergy(Energy):
    """Energy ``-score`` of a CometKiwi-style ``UnifiedMetric`` (input segments ``[mt, src]``)."""

    def __init__(self, comet_model, bridge: Bridge, freeze: bool = True, gradient_checkpointing: bool = False):
        segments = list(getattr(comet_model.hparams, "input_segments", []))
        if segments != ["mt", "src"]:
            raise ValueError(f"KiwiEnergy needs a reference-free UnifiedMetric with input_segments "
                             f"[mt, src]; got {segments}")
        super().__init__(comet_model, bridge, freeze, gradient_checkpointing)

    def _score(self, src, ref, alignment, shift):
        content = self._content_ids(src)  # the K samples of a source share it
        rows = [kiwi_row(self.tokenizer, mt, content[s], self.max_positions) for mt, s in zip(alignment.qe_ids, src)]
        return self._unified_scores(rows, shift)


class UnifiedEnergy(Energy):
    """Energy ``-score`` of a ``UnifiedMetric`` that reads the source and the reference (XCOMET's
    input segments ``[mt, src, ref]``): comet's three inputs, combined as its ``predict_step`` does."""

    needs_reference = True

    def __init__(self, comet_model, bridge: Bridge, freeze: bool = True, gradient_checkpointing: bool = False):
        segments = list(getattr(comet_model.hparams, "input_segments", []))
        if segments != ["mt", "src", "ref"]:
            raise ValueError(f"UnifiedEnergy needs a UnifiedMetric with input_segments [mt, src, ref]; got {segments}")
        super().__init__(comet_model, bridge, freeze, gradient_checkpointing)

    def _score(self, src, ref, alignment, shift):
        from comet.models import XCOMETMetric

        tok, cut = self.tokenizer, self.max_positions
        content = self._content_ids(src + ref)
        mts = alignment.qe_ids
        # comet's concat_sequences: each extra segment is appended to the previous row's content,
        # and the row cut to max_positions (a no-op when it fits, as for kiwi_row).
        with_src = [kiwi_row(tok, m, content[s], cut) for m, s in zip(mts, src)]
        with_ref = [kiwi_row(tok, m, content[r], cut) for m, r in zip(mts, ref)]
        full = [tok.build_inputs_with_special_tokens(
                    tok.build_inputs_with_special_tokens(m, content[s])[1:-1], content[r])[:cut]
                for m, s, r in zip(mts, src, ref)]
        scores = [self._unified_scores(rows, shift) for rows in (with_src, with_ref, full)]  # 3 x [B]
        if not isinstance(self.qe, XCOMETMetric):
            return torch.stack(scores).mean(0)
        # XCOMET: clipped regression scores weighted, plus the weighted MQM score of the decoded error
        # spans: a step function of the text, so a constant here, read off comet's own decoding.
        w = self.qe.score_weights
        regression = sum(torch.where(s > 1.0, torch.ones_like(s), s) * wi for s, wi in zip(scores, w[:3]))
        return regression + self._mqm(src, alignment.texts, ref).to(regression) * w[3]

    @torch.no_grad()
    def _mqm(self, src: list[str], mt: list[str], ref: list[str]) -> Tensor:
        """XCOMET's MQM score of the error spans comet decodes for the texts ([B], in [0, 1])."""

        samples = [{"src": s, "mt": m, "ref": r} for s, m, r in zip(src, mt, ref)]
        with _EvalMode(self.qe):
            batch = _to(self.qe.prepare_sample(samples, stage="predict"), self.qe.device)
            return self.qe.predict_step(batch).metadata["mqm_scores"].float()


class CometEnergy(Energy):
    """Energy ``-score`` of a reference-based COMET (``RegressionMetric``, wmt22-comet-da's
    architecture). Source and reference are encoded once per distinct sentence, without gradient."""

    needs_reference = True

    def __init__(self, comet_model, bridge: Bridge, freeze: bool = True, gradient_checkpointing: bool = False):
        if not freeze:
            raise QeebmError("a reference-based COMET energy is frozen: only a reference-free QE is trained "
                             "alongside (qe.mode=dynamic)")
        super().__init__(comet_model, bridge, freeze, gradient_checkpointing)

    def _score(self, src, ref, alignment, shift):
        tok = self.tokenizer
        content = self._content_ids(src + ref)
        with torch.no_grad():
            unique = list(content)
            emb = self._sentence_embeddings([tok.build_inputs_with_special_tokens(content[t]) for t in unique], None)
            at = {t: i for i, t in enumerate(unique)}
            src_emb = emb[torch.tensor([at[s] for s in src], device=emb.device)]
            ref_emb = emb[torch.tensor([at[r] for r in ref], device=emb.device)]
        mt_emb = self._sentence_embeddings([tok.build_inputs_with_special_tokens(m) for m in alignment.qe_ids], shift)
        return self.qe.estimate(src_emb, mt_emb, ref_emb).score.view(-1)

    def _sentence_embeddings(self, rows: list[list[int]], shift: Tensor | None) -> Tensor:
        """``get_sentence_embedding`` of each row ``[B, H]``: the encoder on ``inputs_embeds``, the
        layer-wise mix (or ``layer``), then comet's pooling."""
        from comet.models.pooling_utils import average_pooling, max_pooling

        ids, mask, embeds, position_ids = self._embed(rows, shift)
        qe, hp = self.qe, self.qe.hparams
        out = qe.encoder.model(inputs_embeds=embeds, attention_mask=mask, position_ids=position_ids,
                               output_hidden_states=True, return_dict=True)
        if qe.layerwise_attention:
            embeddings = qe.layerwise_attention(out.hidden_states, mask)
        elif 0 <= hp.layer < qe.encoder.num_layers:
            embeddings = out.hidden_states[hp.layer]
        else:
            raise ValueError(f"invalid COMET layer {hp.layer!r}")
        pad = self.tokenizer.pad_token_id
        if hp.pool == "avg":
            return average_pooling(ids, embeddings, mask, pad, self.tokenizer.sep_token_id, qe.use_context)
        if hp.pool == "max":
            return max_pooling(ids, embeddings, pad)
        if hp.pool == "cls":
            return embeddings[:, 0, :]
        if hp.pool == "default":
            return out.hidden_states[-1][:, 0, :]  # XLMREncoder's "sentemb"
        raise ValueError(f"invalid COMET pooling {hp.pool!r}")


ENERGIES = {"kiwi": KiwiEnergy, "xcomet": UnifiedEnergy, "comet": CometEnergy}


def load_energy(path: str, translator, freeze: bool, gradient_checkpointing: bool = False) -> Energy:
    """The energy of the QE at ``path`` (a directory or hub id: a CometKiwi, a reference-based COMET
    or an XCOMET) with a bridge from ``translator``'s vocabulary; a missing directory is a one-line
    error."""
    looks_local = path.startswith((".", "/", "~")) or path.count("/") != 1
    if looks_local and not Path(path).expanduser().exists():
        raise QeebmError(f"qe.path: no QE model at '{path}' (build the tiny world with `qeebm tinyworld build "
                         "data/tinyworld`, or point qe.path at a CometKiwi, COMET or XCOMET directory or hub id)")
    # comet builds randomly initialised modules before loading the weights: keep the run's RNG untouched.
    with torch.random.fork_rng(devices=[]):
        comet = load_qe(path)
    kind = qe_kind(comet)
    if not freeze and kind != "kiwi":
        raise QeebmError(f"qe.path '{path}' is a reference-based {kind} model; qe.mode=dynamic trains a "
                         "reference-free CometKiwi")
    vocab_size = translator.model.config.vocab_size
    return ENERGIES[kind](comet, Bridge(translator.tokenizer, comet.encoder.tokenizer, vocab_size=vocab_size),
                          freeze=freeze, gradient_checkpointing=gradient_checkpointing)
