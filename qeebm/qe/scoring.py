"""Fast segment scoring with a COMET-family model, equal to `model.predict(..., gpus=0)`.

`predict` builds a Lightning Trainer on every call and batches by source length only. `QEScorer`
runs the same computation in a plain `torch.inference_mode` loop over length-sorted batches and
scores every distinct (src, mt[, ref]) once (the K samples of one source often repeat):

* CometKiwi: each distinct text is tokenised once, `<s> mt </s></s> src </s>` is assembled and
  truncated as comet's `concat_sequences` does, and the encoder runs on the real tokens only
  (`qeebm.qe.packed`; `model.forward` for encoders it does not cover);
* XCOMET and any other UnifiedMetric: comet's own `prepare_sample(stage="predict")` and
  `predict_step` (what Lightning calls inside predict: the three input combos, the error-span MQM
  term and the clipping are all comet's);
* reference-based COMET (RegressionMetric) encodes src, mt and ref independently, so each distinct
  sentence is encoded once (src and ref are shared by the K samples of a source) and the estimator
  runs on the gathered sentence embeddings.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path

import torch

from qeebm.errors import QeebmError
from qeebm.qe.models import qe_kind
from qeebm.qe.packed import packable, packed_scores

log = logging.getLogger(__name__)


def _to(batch, device):
    """comet's batches (tuples of dicts / BatchEncodings) onto the model's device, as Lightning does."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, Mapping):
        return {k: _to(v, device) for k, v in batch.items()}
    if isinstance(batch, tuple):
        return tuple(_to(v, device) for v in batch)
    return batch  # e.g. XCOMET's per-token offsets (lists), used on the CPU


def kiwi_row(tokenizer, mt: list[int], src: list[int], max_positions: int) -> list[int]:
    """CometKiwi's input `<s> mt </s></s> src </s>` from the two segments' content ids (no
    specials, no pads), cut as comet's XLM-R `concat_sequences` does. comet cuts to max_positions
    only when the content exceeds max_positions - 5; shorter content gives at most
    max_positions - 1 ids with the four specials, so an unconditional cut is the same rule."""
    return tokenizer.build_inputs_with_special_tokens(mt, src)[:max_positions]


def pad_rows(rows: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-aligned id rows padded into one batch, with a bool mask built like comet's
    concat_sequences, so the numbers match comet's bit for bit."""
    lengths = torch.tensor([len(r) for r in rows])
    width = int(lengths.max())
    ids = torch.tensor([r + [pad_id] * (width - len(r)) for r in rows])
    mask = torch.arange(width)[None, :] < lengths[:, None]
    return ids.to(device), mask.to(device)


class _EvalMode:
    """Eval mode for the duration of a call, then every submodule's own mode back (a QE that is
    being trained must not be left in eval mode, nor a frozen one in train mode)."""

    def __init__(self, model):
        self.model = model

    def __enter__(self):
        self.modes = [(m, m.training) for m in self.model.modules()]
        self.model.eval()

    def __exit__(self, *exc):
        for m, mode in self.modes:
            m.training = mode


class QEScorer:
    """Batched, no-grad scores for lists of (src, mt[, ref]), cached per distinct input.

    The cache assumes the model's weights do not change; call `clear_cache()` after training it.

    Batches hold at most `batch_size` segments and, where inputs are token ids (CometKiwi, and
    each sentence of reference-based COMET), at most `max_tokens` padded tokens (segments x the
    longest): on a CPU, a base-sized encoder is fastest at 1-2k tokens a batch
    (`scripts/bench.py --what scoring`).
    """

    def __init__(self, model, batch_size: int = 64, cache: bool = True, cache_size: int = 1_000_000,
                 max_tokens: int = 2048):
        if batch_size < 1 or max_tokens < 1:
            raise QeebmError(f"QE batch_size and max_tokens must be positive, got {batch_size} "
                             f"and {max_tokens}")
        self.model = model
        self.kind = qe_kind(model)
        self.batch_size = batch_size
        self.max_tokens = max_tokens
        self.use_cache = cache
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple, float] = OrderedDict()
        self.hits = 0  # inputs answered without a forward pass (cache or a duplicate in the call)
        self.misses = 0  # inputs that were scored

    def clear_cache(self) -> None:
        self._cache.clear()

    def _key(self, s: str, m: str, r: str | None) -> tuple:
        # CometKiwi never reads the reference: keying on it would only lose hits.
        return (s, m) if self.kind == "kiwi" else (s, m, r)

    def score(self, src: list[str], mt: list[str], ref: list[str] | None = None) -> list[float]:
        if len(src) != len(mt) or (ref is not None and len(ref) != len(mt)):
            raise QeebmError(f"QE inputs differ in length: src {len(src)}, mt {len(mt)}, "
                             f"ref {len(ref) if ref is not None else '-'}")
        if self.kind == "comet" and ref is None:
            raise QeebmError("this QE model (reference-based COMET) needs references")
        refs = ref if ref is not None else [None] * len(mt)
        keys = [self._key(s, m, r) for s, m, r in zip(src, mt, refs)]

        todo: dict[tuple, tuple] = {}
        for key, s, m, r in zip(keys, src, mt, refs):
            if key not in self._cache and key not in todo:
                todo[key] = (s, m, r)
        self.misses += len(todo)
        self.hits += len(keys) - len(todo)

        fresh = self._score_new(list(todo.values())) if todo else []
        found = dict(zip(todo.keys(), fresh))
        out = []
        for key in keys:
            if key in found:
                out.append(found[key])
            else:
                self._cache.move_to_end(key)
                out.append(self._cache[key])
        if self.use_cache:
            self._cache.update(found)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return out

    # ---------------------------------------------------------------------------------- internals
    def _batches(self, items: list, length, max_tokens: int | None = None) -> list[list[int]]:
        """Indices sorted by length, cut into batches of at most batch_size items and (if given)
        max_tokens padded tokens; an item longer than max_tokens goes alone."""
        order = sorted(range(len(items)), key=lambda i: length(items[i]))
        batches: list[list[int]] = []
        for i in order:
            # sorted ascending, so item i is the longest of the batch it joins
            if batches and len(batches[-1]) < self.batch_size and \
                    (max_tokens is None or (len(batches[-1]) + 1) * length(items[i]) <= max_tokens):
                batches[-1].append(i)
            else:
                batches.append([i])
        return batches

    @torch.inference_mode()
    def _score_new(self, items: list[tuple]) -> list[float]:
        with _EvalMode(self.model):
            if self.kind == "comet":
                return self._score_regression(items)
            if self._plain_kiwi():
                return self._score_kiwi(items)
            return self._score_unified(items)

    def _plain_kiwi(self) -> bool:
        enc = self.model.encoder
        return (self.kind == "kiwi" and not self.model.word_level and enc.size_separator == 2
                and not enc.uses_token_type_ids)

    def _token_ids(self, texts: list[str]) -> dict[str, list[int]]:
        """Each distinct text tokenised once, as comet's encoder.prepare_sample does it (with
        <s> ... </s>, truncated to max_positions - 2), as plain lists."""
        enc = self.model.encoder
        unique = list(dict.fromkeys(texts))
        ids = enc.tokenizer(unique, truncation=True, max_length=enc.max_positions - 2)["input_ids"]
        return dict(zip(unique, ids))

    def _padded(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        return pad_rows(rows, self.model.encoder.tokenizer.pad_token_id, self.model.device)

    def _score_kiwi(self, items: list[tuple]) -> list[float]:
        """CometKiwi without comet's per-batch tokenisation: every distinct text is tokenised
        once (K samples share a source), then each `<s> mt </s></s> src </s>` is assembled and
        truncated exactly as comet's XLM-R `concat_sequences` does."""
        enc = self.model.encoder
        pad = enc.tokenizer.pad_token_id
        table = self._token_ids([t for s, m, _ in items for t in (s, m)])
        # comet strips pad ids (and the <s> </s> of each segment) before concatenating
        content = {t: [i for i in ids[1:-1] if i != pad] for t, ids in table.items()}
        rows = [kiwi_row(enc.tokenizer, content[m], content[s], enc.max_positions) for s, m, _ in items]
        pack = packable(self.model)
        scores = [0.0] * len(items)
        for idx in self._batches(rows, len, self.max_tokens):
            ids, mask = self._padded([rows[i] for i in idx])
            if pack:
                out = packed_scores(self.model, ids, mask)
            else:
                out = self.model.forward(input_ids=ids, attention_mask=mask).score
            for i, v in zip(idx, out.float().tolist()):
                scores[i] = v
        return scores

    def _score_unified(self, items: list[tuple]) -> list[float]:
        """Any UnifiedMetric (XCOMET's word tags and three input combos included): comet's own
        prepare_sample and predict_step, which is what Lightning runs inside predict()."""
        model, device = self.model, self.model.device
        scores = [0.0] * len(items)
        for idx in self._batches(items, lambda t: len(t[0]) + len(t[1]) + len(t[2] or "")):
            samples = []
            for i in idx:
                s, m, r = items[i]
                samples.append({"src": s, "mt": m} if r is None else {"src": s, "mt": m, "ref": r})
            batch = _to(model.prepare_sample(samples, stage="predict"), device)
            pred = model.predict_step(batch)
            for i, v in zip(idx, pred["scores"].float().tolist()):
                scores[i] = v
        return scores

    def _score_regression(self, items: list[tuple]) -> list[float]:
        """Reference-based COMET: src, mt and ref are encoded independently, so each distinct
        sentence is encoded once and the estimator runs on the gathered sentence embeddings."""
        model, device = self.model, self.model.device
        table = self._token_ids([t for item in items for t in item])
        texts = list(table)
        row = {t: i for i, t in enumerate(texts)}
        emb = None
        for idx in self._batches(texts, lambda t: len(table[t]), self.max_tokens):
            ids, mask = self._padded([table[texts[i]] for i in idx])
            e = model.get_sentence_embedding(ids, mask.long())
            if emb is None:
                emb = torch.empty(len(texts), e.shape[-1], dtype=e.dtype, device=device)
            emb[torch.tensor(idx, device=device)] = e
        scores = []
        for start in range(0, len(items), self.batch_size):
            chunk = items[start:start + self.batch_size]
            s, m, r = (emb[torch.tensor([row[t[j]] for t in chunk], device=device)] for j in range(3))
            scores += model.estimate(s, m, r).score.float().tolist()
        return scores


# ----------------------------------------------------------------------------- files (qeebm score)
def read_segments(path: str | Path) -> tuple[list[str], list[str], list[str] | None]:
    """src/mt[/ref] from a JSONL file (keys src, mt, optional ref) or a TSV file (columns
    src, mt[, ref], with an optional header line naming them)."""
    path = Path(path)
    if not path.is_file():
        raise QeebmError(f"no such file: {path}")
    lines = path.read_text(encoding="utf-8").splitlines()
    rows: list[dict] = []
    if path.suffix == ".jsonl" or (lines and lines[0].lstrip().startswith("{")):
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise QeebmError(f"{path}:{n}: not JSON ({err.msg})") from None
            if not isinstance(row, dict) or not isinstance(row.get("src"), str) or \
                    not isinstance(row.get("mt"), str):
                raise QeebmError(f"{path}:{n}: needs string fields 'src' and 'mt'")
            rows.append(row)
    else:
        columns = ["src", "mt", "ref"]
        first = 1
        if lines and set(lines[0].split("\t")) <= {"src", "mt", "ref"} and "mt" in lines[0].split("\t"):
            columns, first = lines[0].split("\t"), 2
            lines = lines[1:]
        for n, line in enumerate(lines, first):
            if not line:
                continue
            cells = line.split("\t")
            if len(cells) not in (2, 3) or (first == 2 and len(cells) != len(columns)):
                raise QeebmError(f"{path}:{n}: expected {len(columns) if first == 2 else '2 or 3'} "
                                 f"tab-separated columns (src, mt[, ref]), got {len(cells)}")
            rows.append(dict(zip(columns, cells)))
    if not rows:
        raise QeebmError(f"{path}: no segments")
    has_ref = ["ref" in r for r in rows]
    if any(has_ref) and not all(has_ref):
        raise QeebmError(f"{path}: 'ref' is present on some lines only")
    src = [r["src"] for r in rows]
    mt = [r["mt"] for r in rows]
    ref = [str(r["ref"]) for r in rows] if all(has_ref) else None
    return src, mt, ref


def score_file(model_path: str, in_path: str | Path, out_path: str | Path, batch_size: int = 64) -> float:
    """Score a TSV/JSONL file with a QE model; write one score per line; return the system mean."""
    from qeebm.qe.models import load_qe

    src, mt, ref = read_segments(in_path)
    scorer = QEScorer(load_qe(model_path), batch_size=batch_size)
    if scorer.kind == "kiwi" and ref is not None:
        log.info("%s: references ignored (reference-free QE)", in_path)
    scores = scorer.score(src, mt, ref)
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    Path(out_path).write_text("".join(f"{s:.6f}\n" for s in scores), encoding="utf-8")
    mean = sum(scores) / len(scores)
    log.info("scored %d segments with %s: system score %.4f (%d duplicates scored once)",
             len(scores), model_path, mean, scorer.hits)
    return mean
