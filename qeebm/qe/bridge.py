"""The vocabulary bridge: translator tokens -> the quality estimator's input embeddings.

The energy (``qeebm/qe/energy.py``) scores exactly the text the translator emitted, so the *values*
fed to the QE are always the QE tokenizer's own tokenisation of
``translator.tokenizer.decode(mt_ids, skip_special_tokens=True)``, looked up in the QE's embedding
matrix ``E_qe [V_qe, H]``. The bridge decides where the *gradient* of each QE input position goes.

Straight-through form, for QE position ``j`` of the mt segment (token ``q_j``)::

    e_j = E_qe[q_j] + sum_t w_jt * (z_t - sg(z_t)),      z_t = p_t @ B          (sg = detach)

* ``p_t [V_nmt]``: the translator's (relaxed) distribution at output step ``t``.
* ``B [V_nmt, H]``: the *bridge table*, one QE-space embedding per translator token, built on the fly
  from a sparse map ``translator id -> (QE ids, weights)`` and ``E_qe`` (so gradients reach ``E_qe``
  when the QE is trained). Row ``v``:

  - ``E_qe[u]`` when the translator piece ``v`` is also a QE piece ``u`` (same SentencePiece string:
    every piece for mBART-50 -> XLM-R/InfoXLM, many for NLLB -> XLM-R);
  - otherwise the mean of ``E_qe`` over the QE tokenisation of the piece's surface text (a word-inner
    piece keeps its word-inner form: a leading bare ``"▁"`` the QE adds is dropped);
  - zero for special tokens (language codes, ``<mask>``, ``</s>``, ...), which never reach the QE,
    and for byte-fallback pieces that decode to part of a multi-byte character.

* ``w_jt`` (character-coverage weights): the fraction of QE token ``j``'s characters that translator
  token ``t`` produced, ``|span_j ∩ span_t| / |span_j|``, from character offsets in the decoded text
  (translator side: incremental decoding; QE side: ``offset_mapping``), split evenly among translator
  tokens that only produce text together (a bare leading "▁" and the character after it, the bytes of
  one character). So ``sum_t w_jt = 1``: a QE position built from several translator pieces moves by
  the coverage-weighted mix of their bridged moves, and a translator piece split into several QE pieces
  moves each of them (weight 1 each).

Why this is exact and sensible: ``z - sg(z)`` is exactly zero in the forward pass, so ``e_j`` is
bit-for-bit ``E_qe[q_j]`` and the energy equals the QE score of the decoded text. In the backward pass
``dE/dp_t = B @ sum_j w_jt dE/de_j``. When both sides segment identically and every piece exists in
both vocabularies (mBART-50's canonical outputs), ``w`` is the identity alignment and ``B`` rows are
``E_qe`` rows, which is exactly the paper's straight-through estimator ``onehot(y) + p - sg(p)`` times
``E_qe``. That identity alignment is used directly (no offsets) whenever the emitted ids, mapped piece
by piece, equal the QE tokenizer's canonical tokenisation of the decoded text; any other output
(NLLB, or a non-canonical mBART segmentation such as ``"▁c" "at"`` for ``"▁cat"``) takes the
offset-aligned path.

Memory: the alignment is a list of ``(row, j, t, w)`` triples (linear in batch x length). Under the
straight-through relaxations the softmax is recomputed in the backward pass a few rows at a time.
``B`` (``[V_nmt, H]``) is built where it must be or is small: under the "softmax" relaxation, for a
QE whose embeddings train, and for a frozen QE whose table takes at most 64 MiB (the tiny world's);
built from a frozen ``E_qe`` it is cached. A frozen QE's larger table (1 GB for NLLB into
InfoXLM) is never built: the straight-through backward's ``g @ B^T`` goes through the sparse map
(``Bridge.times_table_t``). No ``[B, T, V_qe]`` and no ``[V_nmt, V_qe]`` tensor is ever built.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

SPIECE_UNDERLINE = "▁"
_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@dataclass
class Alignment:
    """Where each QE input position of the mt segment comes from, for one batch.

    qe_ids:    per row, the QE content ids of the mt segment (no ``<s>``/``</s>``), already truncated
               the way comet truncates a segment (``max_length = max_positions - 2`` with specials).
    texts:     per row, the decoded translation the QE scores.
    canonical: per row, True when the identity alignment was used (see the module docstring).
    rows, qe_pos, nmt_pos: ``[N]`` long; triple ``k`` says QE position ``qe_pos[k]`` (0-based inside
               the mt segment) of row ``rows[k]`` draws on translator step ``nmt_pos[k]`` (a column of
               ``mt_ids``) with weight ``weight[k]`` (``[N]`` float64).
    forward_ids: per row, the translator ids that were decoded (the emitted ones, or the Gumbel sample).
    """

    qe_ids: list[list[int]]
    texts: list[str]
    canonical: list[bool]
    rows: Tensor
    qe_pos: Tensor
    nmt_pos: Tensor
    weight: Tensor
    forward_ids: list[list[int]] = field(default_factory=list)

    def entries(self, length: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``rows, qe_pos, nmt_pos, weight`` of the triples whose QE position is below ``length``."""
        keep = self.qe_pos < length
        return self.rows[keep], self.qe_pos[keep], self.nmt_pos[keep], self.weight[keep]


class Bridge(nn.Module):
    """Maps translator-side (relaxed) tokens into the QE's input-embedding space.

    Build it with ``Bridge(nmt_tokenizer, qe_tokenizer)``; ``vocab_size`` defaults to
    ``len(nmt_tokenizer)`` (pass the model's logit size if it is larger: extra rows map to nothing).
    Buffers: the sparse map in CSR layout over translator ids, ``map_offsets [V_nmt + 1]``,
    ``map_ids [nnz]`` (QE ids) and ``map_weights [nnz]``; ``direct [V_nmt]``, the QE id of a translator
    piece that is also a QE piece (-1 otherwise); ``special [V_nmt]``, ids that never reach the text
    (special tokens, and ids the tokenizer does not know). Building the map tokenises every translator
    piece once (a few seconds for a 256k vocabulary); build one bridge per run.
    """

    def __init__(self, nmt_tokenizer, qe_tokenizer, vocab_size: int | None = None):
        super().__init__()
        self.nmt_tokenizer = nmt_tokenizer
        self.qe_tokenizer = qe_tokenizer
        if not getattr(qe_tokenizer, "is_fast", False):
            raise ValueError("the QE tokenizer must be a fast tokenizer (offset mapping is needed)")
        n_tok = len(nmt_tokenizer)
        vocab_size = n_tok if vocab_size is None else int(vocab_size)
        if vocab_size < n_tok:
            raise ValueError(f"vocab_size {vocab_size} < len(nmt_tokenizer) {n_tok}")
        offsets, ids, weights, direct, special = _build_map(nmt_tokenizer, qe_tokenizer, vocab_size)
        self._set_map(offsets, ids, weights, direct, special)

    @classmethod
    def from_sparse_map(cls, map_offsets: Tensor, map_ids: Tensor, map_weights: Tensor,
                        special: Tensor | None = None) -> "Bridge":
        """A tokenizer-less bridge over a given CSR map (for tests and tools): it can build the table
        and shift embeddings along a given ``Alignment``, but not align text."""
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self.nmt_tokenizer = self.qe_tokenizer = None
        v = map_offsets.numel() - 1
        special = torch.zeros(v, dtype=torch.bool) if special is None else special
        self._set_map(map_offsets, map_ids, map_weights, torch.full((v,), -1, dtype=torch.long), special)
        return self

    def _set_map(self, offsets, ids, weights, direct, special) -> None:
        self.vocab_size = offsets.numel() - 1
        self.register_buffer("map_offsets", offsets.long(), persistent=False)
        self.register_buffer("map_ids", ids.long(), persistent=False)
        self.register_buffer("map_weights", weights.float(), persistent=False)
        self.register_buffer("direct", direct.long(), persistent=False)
        self.register_buffer("special", special.bool(), persistent=False)
        self._special_set = set(torch.nonzero(special).flatten().tolist())
        self._direct_list = direct.tolist()
        self._table_cache: tuple | None = None

    @property
    def shares_vocabulary(self) -> bool:
        """True when every non-special translator piece is also a QE piece (mBART-50 -> XLM-R)."""
        return bool(((self.direct >= 0) | self.special).all())

    # ------------------------------------------------------------------------------- tensors
    def table(self, qe_embeddings: Tensor) -> Tensor:
        """The bridge table ``B [V_nmt, H]`` from the QE embedding matrix ``[V_qe, H]``.

        Differentiable in ``qe_embeddings``; cached while it does not require grad (a frozen QE), keyed
        on its storage and version counter so an in-place update invalidates the cache.
        """
        key = (qe_embeddings.data_ptr(), qe_embeddings._version, qe_embeddings.dtype, qe_embeddings.device)
        needs_graph = qe_embeddings.requires_grad and torch.is_grad_enabled()
        if not needs_graph and self._table_cache is not None and self._table_cache[0] == key:
            return self._table_cache[1]
        # embedding_bag with per-sample weights is the sparse [V_nmt x V_qe] @ E_qe product without
        # ever materialising the dense map; empty bags (specials) come out as zero rows.
        table = F.embedding_bag(
            self.map_ids, qe_embeddings, self.map_offsets[:-1], mode="sum",
            per_sample_weights=self.map_weights.to(qe_embeddings.dtype),
        )
        if not needs_graph:
            table = table.detach()
            self._table_cache = (key, table)
        return table

    def times_table_t(self, grad: Tensor, qe_embeddings: Tensor) -> Tensor:
        """``grad @ B^T`` (``[c, H]`` -> ``[c, V_nmt]``) without ``B``: row v of ``B`` is
        ``sum_k w_vk E_qe[u_vk]``, so column v of the product is the same weighted sum over the
        columns of ``grad @ E_qe^T`` (``[c, V_qe]``), one embedding bag over its transpose. The result
        is made contiguous: the softmax Jacobian's three passes over a transposed ``[c, V_nmt]`` were
        3x slower than one copy and the passes."""
        per_qe = qe_embeddings @ grad.to(qe_embeddings.dtype).T  # [V_qe, c]
        return F.embedding_bag(self.map_ids, per_qe, self.map_offsets[:-1], mode="sum",
                               per_sample_weights=self.map_weights.to(per_qe.dtype)).T.contiguous()

    def content_mask(self, mt_ids: Tensor, mt_mask: Tensor) -> Tensor:
        """``[B, T]`` bool: steps whose token reaches the decoded text (masked in, not special)."""
        ids = mt_ids.clamp(0, self.vocab_size - 1)
        known = mt_ids < self.vocab_size
        return mt_mask.bool() & known & ~self.special.to(mt_ids.device)[ids]

    def shift(self, qe_embeddings: Tensor, logits: Tensor, forward_ids: Tensor, alignment: Alignment,
              length: int, relaxation: str = "st", *, content: Tensor, tau: float = 1.0) -> Tensor:
        """The per-position embedding shift ``[B, length, H]`` for the mt segment.

        logits:      ``[N, V_nmt]`` whose softmax is the relaxed distribution p (the translator's
                     logits, or Gumbel-perturbed logits over tau), one row per step where ``content``
                     (``[B, T]`` bool) is true, in row-major order; ``content`` must include every
                     step the alignment reads. The softmax is taken here, only for the steps the QE
                     sees, and under "st" / "gumbel-st" only in the backward pass, a few rows at a
                     time: no ``[B, T, V_nmt]`` tensor is kept for backward.
        forward_ids: ``[B, T]`` the translator tokens the forward pass scores.
        relaxation:  "st" / "gumbel-st": ``z - sg(z)`` (zero forward, identity backward);
                     "reinmax": zero forward, ReinMax's backward (``reinmax_jvp``, at temperature
                     ``tau``) in place of the identity;
                     "softmax": ``z - B[forward_ids]`` = (p - onehot) @ B, so on the identity path
                     ``E_qe[q_j] + shift_j = p_t @ E_qe``, the expected embedding.
        Position ``j`` of the result belongs to QE mt position ``j``; alignment entries at positions
        ``>= length`` are ignored.
        """
        bsz, steps = forward_ids.shape
        h = qe_embeddings.shape[1]
        if logits.dim() != 2 or content.shape != forward_ids.shape or int(content.sum()) != logits.shape[0]:
            raise ValueError(f"logits {tuple(logits.shape)} need one row per true step of a [B, T] content mask "
                             f"(content {tuple(content.shape)}, forward_ids {tuple(forward_ids.shape)})")
        if logits.shape[-1] != self.vocab_size:
            raise ValueError(f"logits have {logits.shape[-1]} classes, the bridge maps {self.vocab_size}")
        dev = logits.device
        rows, qe_pos, nmt_pos, weight = (t.to(dev) for t in alignment.entries(length))
        weight = weight.to(qe_embeddings.dtype)
        out = qe_embeddings.new_zeros(bsz, length, h)
        if rows.numel() == 0:
            # Nothing reaches the QE (empty outputs): keep the graph so backward() still runs.
            return out + 0.0 * logits.sum().to(out.dtype)
        # Only the translator steps the QE sees are multiplied, each once: [U, V_nmt] @ [V_nmt, H].
        steps_seen, which = torch.unique(rows * steps + nmt_pos, return_inverse=True)
        # a step's row among the content rows
        at = (content.to(dev).reshape(-1).long().cumsum(0) - 1).index_select(0, steps_seen)
        if relaxation == "softmax":
            table = self.table(qe_embeddings)  # [V_nmt, H]
            p = F.softmax(logits.index_select(0, at), dim=-1).to(qe_embeddings.dtype)
            d = p @ table - table[forward_ids.to(dev).reshape(-1).index_select(0, steps_seen)]
        elif relaxation in ("st", "gumbel-st", "reinmax"):
            # ReinMax's backward also reads the emitted token of each step it maps.
            tokens = (forward_ids.to(dev).reshape(-1).index_select(0, steps_seen)
                      if relaxation == "reinmax" else None)
            table_bytes = self.vocab_size * h * qe_embeddings.element_size()
            if (qe_embeddings.requires_grad and torch.is_grad_enabled()) or table_bytes <= _TABLE_MAX_BYTES:
                d = _zero_forward_product(logits, at, self.table(qe_embeddings), None, tokens, tau)
            else:
                # A frozen QE with a large table: the backward's g @ B^T is taken through the sparse
                # map, so the [V_nmt, H] table (1 GB for NLLB into InfoXLM) is never built nor kept.
                d = _zero_forward_product(logits, at, qe_embeddings.new_empty(0, h),
                                          lambda g: self.times_table_t(g, qe_embeddings), tokens, tau)
        else:
            raise ValueError(f"unknown relaxation {relaxation!r}")
        # Under autocast the product may come out in another dtype than the embeddings.
        return out.index_put((rows, qe_pos), (d[which] * weight[:, None]).to(out.dtype), accumulate=True)

    # ----------------------------------------------------------------------------- alignment
    def decode(self, mt_ids: Tensor, mt_mask: Tensor) -> list[str]:
        """``[B, T]`` translator ids and validity mask -> the B texts the QE sees (``Alignment.texts``):
        masked-in ids the tokenizer knows, decoded with special tokens skipped."""
        return self._decode_rows(mt_ids.detach().cpu().tolist(), mt_mask.detach().cpu().bool().tolist())

    def _decode_rows(self, ids_rows: list[list[int]], mask_rows: list[list[bool]]) -> list[str]:
        if self.nmt_tokenizer is None:
            raise RuntimeError("this bridge has no tokenizers (built with from_sparse_map)")
        n_known = len(self.nmt_tokenizer)
        return [self.nmt_tokenizer.decode([i for i, m in zip(ids, mask) if m and i < n_known], skip_special_tokens=True)
                for ids, mask in zip(ids_rows, mask_rows)]

    def align(self, mt_ids: Tensor, mt_mask: Tensor, max_length: int) -> Alignment:
        """Decode each row, tokenise it as comet does, and align QE positions to translator steps.

        mt_ids, mt_mask: ``[B, T]`` translator ids and validity mask (specials and masked-out steps
        never reach the text). ``max_length``: comet's per-segment ``max_length`` (``max_positions - 2``,
        counting ``<s>`` and ``</s>``).
        """
        ids_rows = mt_ids.detach().cpu().tolist()
        mask_rows = mt_mask.detach().cpu().bool().tolist()
        texts = self._decode_rows(ids_rows, mask_rows)
        n_known = len(self.nmt_tokenizer)
        steps, contents = [], []
        for ids, mask in zip(ids_rows, mask_rows):
            row = [(t, i) for t, (i, m) in enumerate(zip(ids, mask)) if m and i not in self._special_set and i < n_known]
            steps.append([t for t, _ in row])
            contents.append([i for _, i in row])
        enc = self.qe_tokenizer(texts, truncation=True, max_length=max_length, return_offsets_mapping=True)
        rows, qe_pos, nmt_pos, weight = [], [], [], []
        qe_ids_all, canonical_all = [], []
        pad = self.qe_tokenizer.pad_token_id
        for b, (text, step, content) in enumerate(zip(texts, steps, contents)):
            qe_ids = enc["input_ids"][b][1:-1]
            offsets = enc["offset_mapping"][b][1:-1]
            n = len(qe_ids)
            mapped = [self._direct_list[i] for i in content[:n]]
            canonical = mapped == qe_ids and (len(content) == n or n == max_length - 2)
            if canonical:
                pairs = [(j, step[j], 1.0) for j in range(n)]
            else:
                spans = _nmt_char_spans(self.nmt_tokenizer, content, text)
                pairs = [(j, step[k], w) for j, k, w in _coverage(spans, offsets, len(text))]
            if pad in qe_ids:
                # comet drops pad ids before concatenating (masked_select in concat_sequences), so a
                # literal "<pad>" in the text never reaches the QE; positions after it move up.
                new_pos, kept = [], 0
                for q in qe_ids:
                    new_pos.append(kept if q != pad else None)
                    kept += q != pad
                qe_ids = [q for q in qe_ids if q != pad]
                pairs = [(new_pos[j], t, w) for j, t, w in pairs if new_pos[j] is not None]
            for j, t, w in pairs:
                rows.append(b)
                qe_pos.append(j)
                nmt_pos.append(t)
                weight.append(w)
            qe_ids_all.append(qe_ids)
            canonical_all.append(canonical)
        return Alignment(
            qe_ids=qe_ids_all, texts=texts, canonical=canonical_all,
            rows=torch.tensor(rows, dtype=torch.long), qe_pos=torch.tensor(qe_pos, dtype=torch.long),
            nmt_pos=torch.tensor(nmt_pos, dtype=torch.long), weight=torch.tensor(weight, dtype=torch.float64),
            forward_ids=ids_rows,
        )


# --------------------------------------------------------------------------------- helpers
# A frozen QE's bridge table is built (and cached) for the straight-through backward when it is at
# most this large: g @ B^T is then one dense product with a contiguous result. Through the sparse
# map it is a product with E_qe, a bag over its transpose and a transposed result, which made the
# tiny world's energy backward about 3x slower; a 256k-row table of width 1024 (1 GB) keeps that path.
_TABLE_MAX_BYTES = 64 << 20
# Rows of [rows, V_nmt] the straight-through backward handles at once: 2^20 entries (4 MiB in fp32),
# which glibc serves again from its heap (a fresh large block costs a page fault per 4 KiB: that
# was most of the tiny world's energy backward), but at least 64 rows, so that the products with
# NLLB's 256k-row table stay wide enough to run near the matmul rate (64 MiB a chunk there).
_CHUNK_ENTRIES = 1 << 20
_CHUNK_MIN_ROWS = 64


def softmax_jvp(p: Tensor, v: Tensor) -> Tensor:
    """``J(p) v`` with ``J(p) = diag(p) - p p^T``, the softmax's Jacobian, row by row (``[c, V]``)."""
    return (v - (p * v).sum(-1, keepdim=True)).mul_(p)


def reinmax_jvp(p: Tensor, p_tau: Tensor, tokens: Tensor, v: Tensor) -> Tensor:
    """ReinMax's backward (Liu et al., NeurIPS 2023, Algorithm 2) for rows ``[c, V]``: the gradient
    with respect to the logits of a one-hot sample ``D = onehot(tokens)`` drawn from ``p = softmax(logits)``,
    given ``v = dE/dD``: ``2 J(pi_1) v - J(p) v / 2`` with ``pi_1 = (p_tau + D) / 2`` and ``p_tau =
    softmax(logits / tau)``. Straight-through's is ``J(p_tau) v``; ReinMax adds the second-order
    (Heun) term at the same cost, and is exact when E is quadratic in D."""
    return softmax_jvp(_midpoint(p_tau, tokens), v.mul(2.0)).sub_(softmax_jvp(p, v.mul(0.5)))


def _midpoint(p_tau: Tensor, tokens: Tensor) -> Tensor:
    """ReinMax's pi_1 = (p_tau + onehot(tokens)) / 2, rows ``[c, V]``."""
    pi_1 = p_tau.mul(0.5)
    return pi_1.scatter_add_(-1, tokens.view(-1, 1), pi_1.new_full((tokens.numel(), 1), 0.5))


class _ZeroForwardProduct(torch.autograd.Function):
    """``(p - sg(p)) @ B`` with ``p = softmax(logits)``, for the rows ``steps`` of ``logits``: zero in
    value, the product's gradient in backward. The straight-through shift needs the
    ``[U, V_nmt] @ [V_nmt, H]`` product only in the backward pass; autograd on ``z - z.detach()``
    would compute it in the forward pass too, for nothing. Only ``logits`` (alive anyway: the
    translator made them), the row indices and the table are kept; the backward recomputes the
    softmax a chunk of rows at a time and applies its Jacobian there, so neither the
    ``[B, T, V_nmt]`` softmax nor a ``[U, V_nmt]`` gradient of it ever exists whole.

    ``times_table_t``: None to use ``table`` (``[V_nmt, H]``, possibly requiring grad), or a function
    ``g -> g @ B^T`` for a frozen table that is not materialised (``table`` is then an empty
    ``[0, H]`` tensor giving the output's dtype, device and width).

    ``tokens``: None for straight-through's backward (``J(p) dp``), or each row's emitted token
    (``[U]``) for ReinMax's (``reinmax_jvp`` at temperature ``tau``); the table's gradient is then that
    of ``(2 pi_1 - p / 2 - sg(.)) @ B``, as the logits'."""

    @staticmethod
    def forward(ctx, logits: Tensor, steps: Tensor, table: Tensor, times_table_t, tokens: Tensor | None = None,
                tau: float = 1.0) -> Tensor:
        ctx.save_for_backward(logits, steps, table, tokens)
        ctx.times_table_t = times_table_t if times_table_t is not None else (lambda g: g @ table.T)
        ctx.tau = tau
        return table.new_zeros(steps.shape[0], table.shape[1])

    @staticmethod
    def backward(ctx, grad: Tensor):
        logits, steps, table, tokens = ctx.saved_tensors
        grad_logits = logits.new_zeros(logits.shape) if ctx.needs_input_grad[0] else None
        grad_table = torch.zeros_like(table) if ctx.needs_input_grad[2] else None
        rows = max(_CHUNK_MIN_ROWS, _CHUNK_ENTRIES // logits.shape[-1])
        for start in range(0, steps.numel(), rows):
            chunk, g = steps[start:start + rows], grad[start:start + rows]
            rows_logits = logits.index_select(0, chunk)
            p = F.softmax(rows_logits, dim=-1)  # [c, V_nmt]
            if tokens is not None:
                at = tokens[start:start + rows]
                p_tau = p if ctx.tau == 1.0 else F.softmax(rows_logits / ctx.tau, dim=-1)
            if grad_logits is not None:
                dp = ctx.times_table_t(g).to(p.dtype)  # dE/dD = g @ B^T
                grad_logits.index_copy_(0, chunk, softmax_jvp(p, dp) if tokens is None else
                                        reinmax_jvp(p, p_tau, at, dp))
            if grad_table is not None:
                if tokens is None:
                    weights = p
                else:
                    weights = _midpoint(p_tau, at).mul_(2.0).sub_(p, alpha=0.5)
                grad_table.addmm_(weights.to(table.dtype).T, g)
        return grad_logits, None, grad_table, None, None, None


_zero_forward_product = _ZeroForwardProduct.apply


def _special_ids(tokenizer) -> set[int]:
    ids = set(tokenizer.all_special_ids)
    # Language codes and <mask> are registered as special added tokens; decode(skip_special_tokens)
    # skips exactly the added tokens flagged special, so take those too.
    for i, tok in getattr(tokenizer, "added_tokens_decoder", {}).items():
        if getattr(tok, "special", False):
            ids.add(int(i))
    return ids


def _build_map(nmt_tok, qe_tok, vocab_size: int):
    """CSR map translator id -> QE ids with weights (see the module docstring for the rule)."""
    nmt_special = _special_ids(nmt_tok)
    qe_special = _special_ids(qe_tok) - {qe_tok.unk_token_id}
    qe_vocab = qe_tok.get_vocab()
    n_known = len(nmt_tok)
    pieces = nmt_tok.convert_ids_to_tokens(list(range(n_known)))
    direct = [-1] * vocab_size
    special = [True] * vocab_size
    per_id: list[list[int]] = [[] for _ in range(vocab_size)]
    to_tokenise: list[tuple[int, str, bool]] = []  # (id, surface text, word-inner)
    for i, piece in enumerate(pieces):
        if i in nmt_special or piece is None:
            continue
        special[i] = False
        u = qe_vocab.get(piece)
        if u is not None and u not in qe_special:
            direct[i] = u
            per_id[i] = [u]
            continue
        byte = _BYTE_PIECE.match(piece)
        if byte is not None and nmt_tok.convert_tokens_to_string([piece]) != piece:
            # A byte-fallback piece the tokenizer decodes as a byte (transformers' NLLB/mBART
            # tokenizers print such pieces literally, and then the literal text is the surface).
            value = int(byte.group(1), 16)
            if value >= 0x80:
                continue  # part of a multi-byte character: no embedding of its own
            piece = chr(value)
        word_inner = not piece.startswith(SPIECE_UNDERLINE)
        to_tokenise.append((i, piece.replace(SPIECE_UNDERLINE, " "), word_inner))
    if to_tokenise:
        enc = qe_tok([s for _, s, _ in to_tokenise], add_special_tokens=False)["input_ids"]
        for (i, _, word_inner), qids in zip(to_tokenise, enc):
            qids = [q for q in qids if q not in qe_special]
            if word_inner and qids:
                # The QE's Metaspace pre-tokeniser prefixes every text with "▁"; a word-inner piece
                # should use the word-inner form where the QE has one.
                first = qe_tok.convert_ids_to_tokens(qids[0])
                if first == SPIECE_UNDERLINE and len(qids) > 1:
                    qids = qids[1:]
                elif first.startswith(SPIECE_UNDERLINE) and first[1:] in qe_vocab:
                    qids = [qe_vocab[first[1:]]] + qids[1:]
            per_id[i] = qids
    offsets = [0]
    ids: list[int] = []
    weights: list[float] = []
    for qids in per_id:
        ids.extend(qids)
        weights.extend([1.0 / len(qids)] * len(qids) if qids else [])
        offsets.append(len(ids))
    return (torch.tensor(offsets, dtype=torch.long), torch.tensor(ids, dtype=torch.long),
            torch.tensor(weights, dtype=torch.float32), torch.tensor(direct, dtype=torch.long),
            torch.tensor(special, dtype=torch.bool))


def _nmt_char_spans(tokenizer, content: list[int], text: str) -> list[tuple[int, int, int]]:
    """``(start, end, group size)`` in ``text`` of each content token, by incremental decoding.

    A token's span ends where the decoded prefix through it first becomes a longer prefix of the final
    text. Tokens whose prefix is not (yet) a prefix of the text, or adds nothing (a bare "▁" at the
    start, half of a multi-byte character, a clean-up that rewrites the previous space), form one group
    with the token that completes them and share its span. Spans are contiguous and cover ``text`` up
    to the last token.
    """
    if not content:
        return []
    prefixes = tokenizer.batch_decode([content[:k] for k in range(1, len(content) + 1)],
                                      skip_special_tokens=True)
    spans: list[tuple[int, int, int]] = [(0, 0, 1)] * len(content)
    start, pending = 0, []
    for k, prefix in enumerate(prefixes):
        pending.append(k)
        if len(prefix) > start and text.startswith(prefix):
            for i in pending:
                spans[i] = (start, len(prefix), len(pending))
            start, pending = len(prefix), []
    for i in pending:
        spans[i] = (start, len(text), len(pending))
    return spans


def _coverage(spans: list[tuple[int, int, int]], qe_offsets, text_len: int):
    """Yield ``(j, k, w)``: QE position j draws on content token k with weight w, the fraction of j's
    characters that k produced (split evenly inside a group of tokens sharing one span), so the weights
    of each QE position sum to 1. A zero-width QE token takes the character it precedes."""
    ends = [e for _, e, _ in spans]
    for j, (a, b) in enumerate(qe_offsets):
        if b <= a:
            if text_len == 0:
                continue
            a = min(a, text_len - 1)
            b = a + 1
        width = b - a
        k = bisect.bisect_right(ends, a)
        while k < len(spans) and spans[k][0] < b:
            s, e, group = spans[k]
            overlap = min(b, e) - max(a, s)
            if overlap > 0:
                yield j, k, overlap / (width * group)
            k += 1
