"""The vocabulary bridge: its sparse map, its character alignment and its memory use."""

from __future__ import annotations

import io
import weakref

import pytest
import sentencepiece as spm
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from transformers import AutoTokenizer, NllbTokenizer

from qeebm.qe.bridge import Alignment, Bridge, _coverage, _nmt_char_spans
from qeebm.qe.energy import KiwiEnergy

from support.energy import corpus, energy_world, load_kiwi
from support.qe import predict

TOL = 1e-5


@pytest.fixture(scope="module")
def toks():
    return {kind: AutoTokenizer.from_pretrained(str(path)) for kind, path in energy_world().tokenizers.items()}


@pytest.fixture(scope="module")
def kiwi():
    return load_kiwi()


def rows_to_batch(rows, pad=1):
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, : len(row)] = torch.tensor(row)
        mask[b, : len(row)] = 1
    return ids, mask


# ------------------------------------------------------------------------------------------ the map
def test_shared_vocabulary_map_is_the_identity(toks):
    mbart, xlmr = toks["mbart"], toks["xlmr"]
    bridge = Bridge(mbart, xlmr)
    assert bridge.shares_vocabulary
    codes = mbart.convert_tokens_to_ids(mbart.additional_special_tokens)
    specials = set(codes) | {mbart.mask_token_id, 0, 1, 2, 3}
    pieces = [i for i in range(len(mbart)) if i not in specials]
    assert bridge.direct[pieces].tolist() == pieces  # mBART id == XLM-R id for every piece
    assert bridge.special[sorted(specials)].all() and not bridge.special[pieces].any()
    emb = torch.randn(len(xlmr), 8)
    table = bridge.table(emb)
    assert torch.equal(table[pieces], emb[pieces])
    assert not table[sorted(specials)].any()  # language codes and <mask> never reach the QE


def test_different_vocabulary_map(toks):
    nllb, xlmr = toks["nllb"], toks["xlmr"]
    bridge = Bridge(nllb, xlmr, vocab_size=len(nllb) + 3)
    assert not bridge.shares_vocabulary
    qe_vocab = xlmr.get_vocab()
    emb = torch.randn(len(xlmr), 8, dtype=torch.float64)
    table = bridge.table(emb)
    assert table.shape == (len(nllb) + 3, 8)
    assert bridge.special[-3:].all() and not table[-3:].any()  # padded logit rows map to nothing
    n_direct = n_mean = 0
    for i, piece in enumerate(nllb.convert_ids_to_tokens(list(range(len(nllb))))):
        if bridge.special[i]:
            assert not table[i].any()
            continue
        lo, hi = bridge.map_offsets[i].item(), bridge.map_offsets[i + 1].item()
        qids = bridge.map_ids[lo:hi].tolist()
        assert qids, piece
        assert torch.allclose(table[i], emb[qids].mean(0))
        if piece in qe_vocab:
            n_direct += 1
            assert qids == [qe_vocab[piece]]
        else:
            n_mean += 1
            assert bridge.direct[i] == -1
            if not piece.startswith("▁"):
                # A word-inner piece does not pick up the word-start marker the QE adds to any text.
                assert xlmr.convert_ids_to_tokens(qids[0]) != "▁"
    assert n_direct > 50 and n_mean > 50


def test_table_is_cached_while_frozen_and_differentiable_when_trained(toks):
    bridge = Bridge(toks["nllb"], toks["xlmr"])
    emb = torch.randn(len(toks["xlmr"]), 4)
    assert bridge.table(emb) is bridge.table(emb)
    emb.mul_(2.0)  # an in-place update invalidates the cache
    assert torch.allclose(bridge.table(emb), bridge.table(emb.clone()))
    trained = emb.clone().requires_grad_(True)
    table = bridge.table(trained)
    assert table.requires_grad
    table.sum().backward()
    assert trained.grad.abs().sum() > 0


# ------------------------------------------------------------------------------------ the alignment
def test_coverage_weights_hand_worked():
    # Translator "▁c" + "at" vs QE "▁cat" in "cat": 1 and 2 of the QE token's 3 characters.
    assert list(_coverage([(0, 1, 1), (1, 3, 1)], [(0, 3)], 3)) == [(0, 0, 1 / 3), (0, 1, 2 / 3)]
    # Translator "▁cats" vs QE "▁cat" + "s": the translator piece moves both QE positions fully.
    assert list(_coverage([(0, 4, 1)], [(0, 3), (3, 4)], 4)) == [(0, 0, 1.0), (1, 0, 1.0)]
    # "a b" with translator "▁a" "▁b" vs QE "▁a" (0,1) and "▁b" (1,3): the space goes with "b".
    assert list(_coverage([(0, 1, 1), (1, 3, 1)], [(0, 1), (1, 3)], 3)) == [(0, 0, 1.0), (1, 1, 1.0)]
    # A group of two translator tokens sharing one character splits it evenly; XLM-R's zero-width
    # or first-character bare "▁" takes the character it precedes.
    assert list(_coverage([(0, 1, 2), (0, 1, 2), (1, 2, 1)], [(0, 0), (0, 2)], 2)) == [
        (0, 0, 0.5), (0, 1, 0.5), (1, 0, 0.25), (1, 1, 0.25), (1, 2, 0.5)]
    assert list(_coverage([], [(0, 0)], 0)) == []


class ByteTokenizer:
    """Decodes ids as UTF-8 bytes, the way a byte-fallback SentencePiece decoder does."""

    def batch_decode(self, rows, skip_special_tokens=True):
        return [bytes(r).decode("utf-8", errors="replace") for r in rows]


def test_char_spans_group_the_bytes_of_one_character():
    ids = list("aΩb".encode())  # a, 0xCE, 0xA9, b
    spans = _nmt_char_spans(ByteTokenizer(), ids, "aΩb")
    assert spans == [(0, 1, 1), (1, 2, 2), (1, 2, 2), (2, 3, 1)]


def test_char_spans_partition_the_decoded_text(toks):
    nllb = toks["nllb"]
    for text in ["муур нохой харж 2025 (том).", "the the the cat , , ,", "big: хот? 3.14 - 42%"]:
        ids = nllb(text, add_special_tokens=False)["input_ids"]
        assert nllb.unk_token_id not in ids
        decoded = nllb.decode(ids, skip_special_tokens=True)
        spans = _nmt_char_spans(nllb, ids, decoded)
        assert spans[0][0] == 0 and spans[-1][1] == len(decoded)
        assert all(a[1] == b[0] or a == b for a, b in zip(spans, spans[1:]))
        # A piece that produces text on its own spans exactly that text ("▁" is a space, dropped at
        # the very start by the decoder).
        for (s, e, group), piece in zip(spans, nllb.convert_ids_to_tokens(ids)):
            if group == 1:
                surface = piece.replace("▁", " ")
                assert decoded[s:e] == (surface[1:] if s == 0 and surface.startswith(" ") else surface)


# ------------------------------------------------------------------------ exactness, via the energy
def test_non_canonical_mbart_segmentation_scores_the_text(kiwi, toks):
    mbart, xlmr = toks["mbart"], toks["xlmr"]
    text, src = "the cat 12.", "the cat sees 12 dogs"
    lang = mbart.convert_tokens_to_ids("mn_MN")
    canonical = mbart(text, add_special_tokens=False)["input_ids"]
    # Character by character, "▁" on its own: a segmentation the QE tokenizer would never produce.
    chars = []
    for word in text.split(" "):
        chars += ["▁"] + list(word)
    spelled = mbart.convert_tokens_to_ids(chars)
    assert mbart.unk_token_id not in spelled and len(spelled) > len(canonical)
    ids, mask = rows_to_batch([[lang] + canonical + [2], [lang] + spelled + [2]])
    assert mbart.batch_decode(ids, skip_special_tokens=True) == [text, text]
    energy = KiwiEnergy(kiwi, Bridge(mbart, xlmr))
    logits = torch.randn(*ids.shape, len(mbart), requires_grad=True)
    e = energy([src, src], ids, mask, logits)
    assert energy.last_alignment.canonical == [True, False]
    want = predict(kiwi, [src], [text])[0]
    assert abs(-e[0].item() - want) < TOL and abs(-e[1].item() - want) < TOL
    e.sum().backward()
    # Every emitted piece of the spelled-out row gets a gradient; the language code and </s> none.
    grads = logits.grad[1].abs().sum(-1)
    n = len(spelled)
    assert (grads[1 : 1 + n] > 0).all() and grads[0] == 0 and grads[1 + n] == 0


def test_offset_path_reproduces_the_identity_path_on_canonical_output(kiwi, toks):
    """The character alignment is a generalisation: on a canonical mBART output it must give the very
    gradient of the identity path (the paper's straight-through estimator)."""
    mbart, xlmr = toks["mbart"], toks["xlmr"]
    texts = ["муур нохой харж 2025 (том).", "the cat sees 12 dogs, today!"]
    srcs = ["a", "b c"]
    lang = mbart.convert_tokens_to_ids("mn_MN")
    ids, mask = rows_to_batch([[lang] + mbart(t, add_special_tokens=False)["input_ids"] + [2] for t in texts])
    base = torch.randn(*ids.shape, len(mbart))
    grads = []
    for force_offsets in (False, True):
        bridge = Bridge(mbart, xlmr)
        if force_offsets:
            bridge._direct_list = [-1] * bridge.vocab_size
        energy = KiwiEnergy(kiwi, bridge)
        logits = base.clone().requires_grad_(True)
        energy(srcs, ids, mask, logits).sum().backward()
        assert energy.last_alignment.canonical == [not force_offsets] * 2
        grads.append(logits.grad)
    assert torch.allclose(grads[0], grads[1], atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("family", ["mbart", "nllb"])
def test_random_token_soup(kiwi, toks, family):
    """Arbitrary emitted ids (specials in the middle included) with a tokenizer that also cleans up
    spaces on decoding: exact value, and every QE position's weights sum to one."""
    nmt = AutoTokenizer.from_pretrained(str(energy_world().tokenizers[family]), clean_up_tokenization_spaces=True)
    g = torch.Generator().manual_seed(3)
    v = len(nmt)
    n_pieces = min(nmt.convert_tokens_to_ids(nmt.additional_special_tokens))
    rows = []
    for b in range(6):
        n = int(torch.randint(0, 25, (1,), generator=g))
        ids = torch.where(torch.rand(n, generator=g) < 0.85, torch.randint(4, n_pieces, (n,), generator=g),
                          torch.randint(0, v, (n,), generator=g))
        rows.append([n_pieces] + ids.tolist() + [2])
    ids, mask = rows_to_batch(rows)
    energy = KiwiEnergy(kiwi, Bridge(nmt, toks["xlmr"]))
    logits = torch.randn(*ids.shape, v, requires_grad=True)
    srcs = ["the cat sees 12 dogs"] * len(rows)
    e = energy(srcs, ids, mask, logits)
    al = energy.last_alignment
    assert al.texts == nmt.batch_decode(ids, skip_special_tokens=True)
    want = predict(kiwi, srcs, al.texts)
    assert torch.allclose(-e.double(), torch.tensor(want, dtype=torch.float64), atol=TOL, rtol=0)
    assert not all(al.canonical)
    for b, qe_ids in enumerate(al.qe_ids):
        sums = torch.zeros(len(qe_ids), dtype=torch.float64)
        sel = al.rows == b
        sums.index_add_(0, al.qe_pos[sel], al.weight[sel])
        assert torch.allclose(sums, torch.ones_like(sums)), (b, al.texts[b])
    e.sum().backward()
    assert torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0


def test_unknown_and_byte_fallback_pieces(kiwi, toks, tmp_path):
    """A translator tokenizer whose SentencePiece model falls back to bytes (transformers prints such
    pieces literally) and emits <unk>: the energy is still the score of exactly the decoded text."""
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus(200, seed=3)), model_writer=buf, model_type="unigram",
        vocab_size=500, hard_vocab_limit=False, character_coverage=1.0, byte_fallback=True,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, num_threads=1, minloglevel=2)
    (tmp_path / "bf.model").write_bytes(buf.getvalue())
    nmt = NllbTokenizer(vocab_file=str(tmp_path / "bf.model"), src_lang="eng_Latn", tgt_lang="khk_Cyrl",
                        legacy_behaviour=False)
    lang = nmt.convert_tokens_to_ids("khk_Cyrl")
    row = nmt("муур Ω 12 €!", add_special_tokens=False)["input_ids"]
    assert any(p.startswith("<0x") for p in nmt.convert_ids_to_tokens(row))
    row = row[:2] + [nmt.unk_token_id] + row[2:]
    ids, mask = rows_to_batch([[lang] + row + [2], [lang, 2]])
    energy = KiwiEnergy(kiwi, Bridge(nmt, toks["xlmr"]))
    logits = torch.randn(*ids.shape, len(nmt), requires_grad=True)
    e = energy(["the cat", "a"], ids, mask, logits)
    texts = nmt.batch_decode(ids, skip_special_tokens=True)
    want = predict(kiwi, ["the cat", "a"], texts)
    assert torch.allclose(-e.double(), torch.tensor(want, dtype=torch.float64), atol=TOL, rtol=0)
    e.sum().backward()
    grads = logits.grad[0].abs().sum(-1)
    unk_step = 1 + 2
    assert grads[unk_step] == 0  # <unk> is skipped by decode: it never reaches the QE
    assert (grads[1 : 1 + len(row)] > 0).sum() == len(row) - 1


# ------------------------------------------------------------------------------------------- memory
class LiveMemory(TorchDispatchMode):
    """Peak bytes of storages created inside the mode and still alive, and the largest tensor made."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = self.largest = 0
        self.seen: set[int] = set()

    def _forget(self, key, nbytes):
        self.seen.discard(key)
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
                storage = t.untyped_storage()
                key = storage._cdata
                if key not in self.seen:
                    self.seen.add(key)
                    self.live += storage.nbytes()
                    weakref.finalize(storage, self._forget, key, storage.nbytes())
        self.peak = max(self.peak, self.live)
        return out


def test_memory_is_linear_in_batch_times_length(monkeypatch):
    import qeebm.qe.bridge

    v_nmt, v_qe, h, t_len = 50_000, 60_000, 16, 12
    # The backward takes 8 rows at a time (at the real vocabulary the default chunk is 65 rows, far
    # fewer than a batch's steps); its per-chunk [V_qe, rows] product is bounded by the chunk.
    monkeypatch.setattr(qeebm.qe.bridge, "_CHUNK_ENTRIES", 8 * v_nmt)
    monkeypatch.setattr(qeebm.qe.bridge, "_CHUNK_MIN_ROWS", 1)
    g = torch.Generator().manual_seed(0)
    # Each translator token maps to one to three QE tokens (a synthetic NLLB -> XLM-R map).
    counts = torch.randint(1, 4, (v_nmt,), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
    qids = torch.randint(0, v_qe, (int(counts.sum()),), generator=g)
    bridge = Bridge.from_sparse_map(offsets, qids, torch.repeat_interleave(1.0 / counts, counts))
    emb = torch.randn(v_qe, h, generator=g)

    def run(bsz):
        # Every step feeds two QE positions, and every second pair of steps shares one position.
        rows, qe_pos, nmt_pos = [], [], []
        for b in range(bsz):
            for t in range(t_len):
                for j in (2 * t, 2 * t + 1):
                    rows.append(b), qe_pos.append(j), nmt_pos.append(t)
                if t % 2:
                    rows.append(b), qe_pos.append(2 * t - 1), nmt_pos.append(t)
        n = len(rows)
        al = Alignment(qe_ids=[], texts=[], canonical=[], rows=torch.tensor(rows), qe_pos=torch.tensor(qe_pos),
                       nmt_pos=torch.tensor(nmt_pos), weight=torch.full((n,), 0.5, dtype=torch.float64))
        logits = torch.randn(bsz, t_len, v_nmt, generator=g, requires_grad=True)
        ids = torch.randint(0, v_nmt, (bsz, t_len), generator=g)
        weights = torch.randn(bsz, 2 * t_len, h, generator=g)
        with LiveMemory() as mem:
            shift = bridge.shift(emb, logits.view(-1, v_nmt), ids, al, 2 * t_len, "st",
                                 content=torch.ones_like(ids, dtype=torch.bool))
            (shift * weights).sum().backward()
        assert logits.grad.abs().sum() > 0
        return mem

    small, large = run(4), run(8)
    for mem, bsz in ((small, 4), (large, 8)):
        # Nothing of size batch x length x V_qe; the biggest tensor is the gradient of the [B, T, V_nmt]
        # logits, which the translator's own logits already cost.
        assert mem.largest < bsz * t_len * v_qe
        assert mem.largest <= bsz * t_len * v_nmt
    assert large.peak <= 2.0 * small.peak
    assert large.peak > 1.5 * small.peak  # the measurement does see the batch-sized tensors


@pytest.mark.parametrize("table_max_bytes", [0, 1 << 26])  # through the sparse map; the cached table
def test_frozen_table_product_equals_the_table(monkeypatch, table_max_bytes):
    """With a frozen QE the straight-through backward multiplies by ``B^T`` through the sparse map
    when the table would be large, and by the cached table when it is small: the gradient of the
    explicit product either way (float64, 1e-12), and a large table is never built."""
    import qeebm.qe.bridge

    monkeypatch.setattr(qeebm.qe.bridge, "_TABLE_MAX_BYTES", table_max_bytes)
    g = torch.Generator().manual_seed(1)
    v_nmt, v_qe, h, bsz, t_len = 13, 9, 5, 3, 4
    counts = torch.randint(0, 3, (v_nmt,), generator=g)  # empty bags: rows of B that are zero
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
    qids = torch.randint(0, v_qe, (int(counts.sum()),), generator=g)
    weights = torch.rand(int(counts.sum()), generator=g)
    bridge = Bridge.from_sparse_map(offsets, qids, weights)
    emb = torch.randn(v_qe, h, generator=g, dtype=torch.float64)
    rows, qe_pos, nmt_pos = zip(*[(b, j, t) for b in range(bsz) for t in range(t_len) for j in (t, t + 1)])
    al = Alignment(qe_ids=[], texts=[], canonical=[], rows=torch.tensor(rows), qe_pos=torch.tensor(qe_pos),
                   nmt_pos=torch.tensor(nmt_pos), weight=torch.full((len(rows),), 0.5, dtype=torch.float64))
    logits = torch.randn(bsz, t_len, v_nmt, generator=g, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, v_nmt, (bsz, t_len), generator=g)
    upstream = torch.randn(bsz, t_len + 1, h, generator=g, dtype=torch.float64)

    (bridge.shift(emb, logits.view(-1, v_nmt), ids, al, t_len + 1, "st", content=torch.ones_like(ids, dtype=torch.bool))
     * upstream).sum().backward()
    got, logits.grad = logits.grad, None
    assert (bridge._table_cache is None) == (table_max_bytes == 0)
    table = bridge.table(emb)
    z = torch.softmax(logits, -1).reshape(bsz * t_len, v_nmt) @ table
    d = (z - z.detach()).view(bsz, t_len, h)
    want_shift = torch.zeros(bsz, t_len + 1, h, dtype=torch.float64).index_put(
        (al.rows, al.qe_pos), d[al.rows, al.nmt_pos] * 0.5, accumulate=True)
    (want_shift * upstream).sum().backward()
    assert torch.allclose(got, logits.grad, rtol=0, atol=1e-12)
    assert got.abs().sum() > 0


@pytest.mark.parametrize("chunk_entries", [1 << 24, 22])  # one chunk; two rows a chunk, the last one short
def test_zero_forward_product_has_the_straight_through_gradients(monkeypatch, chunk_entries):
    """The backward-only product equals autograd on ``z - z.detach()`` with ``z = softmax(logits) @ B``,
    for the logits and for a table that requires grad (QE-dynamic trains the embeddings), with
    repeated rows, whether the backward takes the rows at once or a few at a time."""
    import qeebm.qe.bridge
    from qeebm.qe.bridge import _zero_forward_product

    monkeypatch.setattr(qeebm.qe.bridge, "_CHUNK_ENTRIES", chunk_entries)
    monkeypatch.setattr(qeebm.qe.bridge, "_CHUNK_MIN_ROWS", 1)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 11, generator=g, dtype=torch.float64).requires_grad_(True)
    table = torch.randn(11, 4, generator=g, dtype=torch.float64).requires_grad_(True)
    steps = torch.tensor([0, 2, 3, 5, 1])
    which = torch.tensor([0, 1, 1, 2, 0, 4, 3])  # one step feeding several QE positions
    upstream = torch.randn(7, 4, generator=g, dtype=torch.float64)

    z = torch.softmax(logits, -1).index_select(0, steps) @ table
    ((z - z.detach())[which] * upstream).sum().backward()
    want = logits.grad.clone(), table.grad.clone()
    logits.grad = table.grad = None
    d = _zero_forward_product(logits, steps, table, None)
    assert not d.any()
    (d[which] * upstream).sum().backward()
    assert torch.allclose(logits.grad, want[0], rtol=0, atol=1e-12)
    assert torch.allclose(table.grad, want[1], rtol=0, atol=1e-12)
    assert want[0][4].abs().sum() == 0  # a row the QE does not see gets no gradient
    assert want[0].abs().sum() > 0 and want[1].abs().sum() > 0
