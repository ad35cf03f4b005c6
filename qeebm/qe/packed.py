"""A padding-free CometKiwi forward, for scoring (QEScorer) and for QE-EBM's energy (KiwiEnergy).

On a CPU, nearly all of a base-sized encoder's time is its linear layers, and a padded batch
pays for every pad position in each of them. Here the token-wise parts of each layer (the
projections, the feed-forward block, the layer norms) run on the real tokens of the batch packed
into one (tokens, hidden) matrix; only the attention product sees the padded (batch, length)
layout, and it is a few per cent of the work. The sentence score reads the first (<s>) position of
every layer, so the layer mix and the estimator run on those rows only. The packing is a gather
(index_select) and its inverse a scatter into zeros (index_copy), both differentiable, so the
energy's gradient reaches the straight-through embeddings through it.

The computation is the one `UnifiedMetric.forward` runs on an `XLMRobertaModel` (same modules,
called in the same order), so scores agree with comet's to float rounding. Encoders of any other
structure are not packable and take the padded path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _encoder(model):
    """The QE's XLM-R model, under a peft wrapper if QE-dynamic added LoRA adapters: its layers
    (adapters included) are the modules the packed forward calls."""
    enc = getattr(model.encoder, "model", None)
    base = getattr(enc, "get_base_model", None)
    return base() if callable(base) else enc


def packable(model) -> bool:
    """A CometKiwi on a plain (post-LayerNorm, absolute-position) XLM-R encoder, whose sentence
    embedding depends on the first position alone."""
    from transformers import XLMRobertaModel

    enc = _encoder(model)
    if type(enc) is not XLMRobertaModel:  # e.g. XLM-R XL (pre-LN)
        return False
    cfg = enc.config
    mix = model.layerwise_attention
    # a mix with layer_norm normalises over every position; a bad sent_layer is comet's to report
    sentence = (not mix.layer_norm) if mix is not None else isinstance(model.hparams.sent_layer, int)
    return (cfg.position_embedding_type == "absolute" and not cfg.is_decoder
            and not cfg.chunk_size_feed_forward and sentence)


def packed_scores(model, ids: torch.Tensor | None, mask: torch.Tensor, inputs_embeds: torch.Tensor | None = None,
                  position_ids: torch.Tensor | None = None, checkpoint: bool = False) -> torch.Tensor:
    """Sentence scores of a padded batch (bool mask, rows left-aligned) without computing anything
    on its pad positions: from token ``ids``, or from ``inputs_embeds`` ``[B, L, H]`` with the
    ``position_ids`` token ids would have given (the energy's straight-through embeddings, whose
    gradient flows through the packing). In train mode the modules' dropout applies as in comet's
    forward, attention dropout included, though with other random draws than the padded forward.
    ``checkpoint``: recompute each layer in the backward pass instead of keeping its activations."""
    enc = _encoder(model)
    batch, length = mask.shape
    heads = enc.config.num_attention_heads
    where = mask.reshape(-1).nonzero().squeeze(1)  # packed row -> flat padded position
    first = mask.sum(1).cumsum(0) - mask.sum(1)  # packed row of each segment's <s>

    def unpack(x: torch.Tensor) -> torch.Tensor:
        hidden = x.shape[-1]
        full = x.new_zeros(batch * length, hidden).index_copy(0, where, x)
        return full.view(batch, length, heads, hidden // heads).transpose(1, 2)

    attend = mask[:, None, None, :]

    def run_layer(layer, x: torch.Tensor) -> torch.Tensor:
        att = layer.attention.self
        p = att.dropout.p if att.training else 0.0
        ctx = F.scaled_dot_product_attention(unpack(att.query(x)), unpack(att.key(x)),
                                             unpack(att.value(x)), attn_mask=attend, dropout_p=p)
        ctx = ctx.transpose(1, 2).reshape(batch * length, -1).index_select(0, where)
        h = layer.attention.output(ctx, x)
        return layer.output(layer.intermediate(h), h)

    emb = enc.embeddings(input_ids=ids if inputs_embeds is None else None, inputs_embeds=inputs_embeds,
                         position_ids=position_ids)
    x = emb.reshape(batch * length, -1).index_select(0, where)
    firsts = [x[first]]
    for layer in enc.encoder.layer:
        if checkpoint and torch.is_grad_enabled():
            x = torch.utils.checkpoint.checkpoint(run_layer, layer, x, use_reentrant=False)
        else:
            x = run_layer(layer, x)
        firsts.append(x[first])

    if model.layerwise_attention is not None:
        sentemb = model.layerwise_attention([f[:, None] for f in firsts], mask[:, :1])[:, 0]
    else:
        sentemb = firsts[model.hparams.sent_layer]
    return model.estimator(sentemb).view(-1)
