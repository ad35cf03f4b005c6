"""Fast segment scoring with a COMET-family model, equal to `model.predict(..., gpus=0)`.

`predict` builds a Lightning Trainer on every call (seconds of overhead) and batches by source
length only. `QEScorer` runs the same comet pieces (`prepare_sample(stage="predict")`, then
`predict_step`, which is what Lightning calls) in a plain `torch.inference_mode` loop over batches
sorted by total text length, and scores every distinct (src, mt[, ref]) once: the K samples of one
source often repeat. For reference-based COMET (RegressionMetric) each distinct sentence is encoded
once and the estimator is run on the gathered embeddings, because src and ref are shared by all K
samples of a source and COMET encodes the three segments independently.
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
    """

    def __init__(self, model, batch_size: int = 64, cache: bool = True, cache_size: int = 1_000_000):
        self.model = model
        self.kind = qe_kind(model)
        self.batch_size = batch_size
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
    def _batches(self, items: list, length) -> list[list[int]]:
        order = sorted(range(len(items)), key=lambda i: length(items[i]))
        return [order[i:i + self.batch_size] for i in range(0, len(order), self.batch_size)]

    @torch.inference_mode()
    def _score_new(self, items: list[tuple]) -> list[float]:
        with _EvalMode(self.model):
            if self.kind == "comet":
                return self._score_regression(items)
            return self._score_unified(items)

    def _score_unified(self, items: list[tuple]) -> list[float]:
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
        model, device = self.model, self.model.device
        texts = list(dict.fromkeys(t for item in items for t in item))
        row = {t: i for i, t in enumerate(texts)}
        emb = None
        for idx in self._batches(texts, len):
            enc = _to(model.encoder.prepare_sample([texts[i] for i in idx]), device)
            e = model.get_sentence_embedding(enc["input_ids"], enc["attention_mask"])
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
