"""Digests of the directories qeebm writes, checked before anything is loaded from them.

Checkpoints and model directories are written atomically (a temporary directory, then a rename),
so a damaged file does not come from qeebm's own writes but from what happens to files afterwards:
a copy between machines cut short, a full or failing disk, a sync tool, a hand edit. A load alone
does not notice all of it: a flipped bit in a tensor's bytes loads without a word. So every written
directory carries a record of the size and sha256 of each of its files, and the record carries the
sha256 of its own content (``seal``). A checkpoint keeps it in its ``state.json`` (beside the
loop's counters), a model directory (``best/``, ``final/``) in ``digests.json``.

``check`` raises ``Damaged`` naming the first file that differs and how (missing, empty, truncated,
changed). A model directory without a record (a hub download, one written by other tools or by a
qeebm from before the records) gets the checks its formats allow (``check_model_dir``).
"""

from __future__ import annotations

import hashlib
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable

from qeebm.errors import QeebmError, first_line

log = logging.getLogger(__name__)

DIGESTS = "digests.json"  # a model directory's record
_KEYS = ("files", "sha256")  # what ``seal`` adds to a record
_CHUNK = 1 << 20


class Damaged(QeebmError):
    """A file that is not what was written: ``path`` and ``cause`` (one line)."""

    def __init__(self, path: Path, cause: str):
        super().__init__(f"{path}: damaged: {cause}")
        self.path, self.cause = Path(path), cause

    def __reduce__(self):
        # Raised in a worker process, it travels back pickled: rebuilt from its own arguments.
        return type(self), (self.path, self.cause)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _digests(root: Path, names: list[str]) -> list[str]:
    # hashlib releases the GIL on large updates: the files of a checkpoint hash side by side.
    if len(names) < 2:
        return [sha256_file(root / n) for n in names]
    with ThreadPoolExecutor(max_workers=min(len(names), 8)) as pool:
        return list(pool.map(lambda n: sha256_file(root / n), names))


def _own_digest(record: dict) -> str:
    """sha256 of the record's content without its own digest, in one canonical JSON form (so the
    record's layout on disk does not matter, only its values)."""
    body = {k: v for k, v in record.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


def seal(record: dict, root: Path, names: Iterable[str]) -> dict:
    """``record`` plus the size and sha256 of each of ``names`` (paths relative to ``root``) under
    ``files``, and the sha256 of all that under ``sha256``."""
    root, names = Path(root), sorted(names)
    out = {**record, "files": {n: {"bytes": (root / n).stat().st_size, "sha256": d}
                               for n, d in zip(names, _digests(root, names))}}
    out["sha256"] = _own_digest(out)
    return out


def unsealed(record: dict) -> dict:
    """``record`` without what ``seal`` added."""
    return {k: v for k, v in record.items() if k not in _KEYS}


def read_json(path: Path):
    """The JSON value in ``path``; ``Damaged`` when it is missing, empty or not JSON."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise Damaged(path, "missing") from None
    if not data:
        raise Damaged(path, "empty (0 bytes)")
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise Damaged(path, f"not valid JSON ({first_line(err)})") from None


def read_record(path: Path) -> dict:
    """A JSON object from ``path``; ``Damaged`` when it is missing, empty or not a JSON object."""
    record = read_json(path)
    if not isinstance(record, dict):
        raise Damaged(path, f"not a JSON object (a {type(record).__name__})")
    return record


def check(record: dict, root: Path, where: Path) -> bool:
    """Check the files under ``root`` against ``record`` (read from the file ``where``): raise
    ``Damaged`` naming the first that differs. False when the record holds no digests at all (it
    was written before qeebm recorded them): nothing could be checked."""
    root, where = Path(root), Path(where)
    if not any(k in record for k in _KEYS):
        return False
    if record.get("sha256") != _own_digest(record):
        raise Damaged(where, "its content does not match its own sha256 (changed after it was written)")
    files = record.get("files")
    if not (isinstance(files, dict) and all(isinstance(v, dict) and isinstance(v.get("bytes"), int)
                                            and isinstance(v.get("sha256"), str) for v in files.values())):
        raise Damaged(where, "its 'files' entry is not a map of file name to bytes and sha256")
    # Sizes first: a truncated file is named without reading the others.
    for name, want in sorted(files.items()):
        path = root / name
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise Damaged(path, f"missing (listed in {where.name})") from None
        if size != want["bytes"]:
            if size == 0:
                raise Damaged(path, f"empty (0 of {want['bytes']} bytes)")
            if size < want["bytes"]:
                raise Damaged(path, f"truncated ({size} of {want['bytes']} bytes)")
            raise Damaged(path, f"longer than written ({size} bytes, {want['bytes']} written)")
    names = sorted(files)
    for name, got in zip(names, _digests(root, names)):
        if got != files[name]["sha256"]:
            raise Damaged(root / name, f"changed (same size, but its sha256 is not the one in {where.name})")
    return True


# ----------------------------------------------------------------------------------------------
# Model directories


def seal_model_dir(root: Path) -> None:
    """Write ``digests.json``: the size and sha256 of every other file under ``root``."""
    root = Path(root)
    names = [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and p.name != DIGESTS]
    (root / DIGESTS).write_text(json.dumps(seal({}, root, names), indent=1), encoding="utf-8")


def check_model_dir(root: Path) -> None:
    """Raise ``Damaged`` naming a file of the model directory ``root`` that is not what was written.

    With ``digests.json`` every file is checked against it. Without, what the formats allow: every
    JSON file parses, and every safetensors file is as long as its header says (a cut copy is found;
    a changed byte among the tensors is not)."""
    root = Path(root)
    record_path = root / DIGESTS
    if record_path.is_file():
        try:
            check(read_record(record_path), root, record_path)
        except Damaged as err:
            # Unlike a checkpoint, a model directory is sometimes edited on purpose (its config.json).
            raise Damaged(err.path, f"{err.cause}; after a deliberate edit, delete {record_path}") from None
        return
    log.debug("%s has no %s: its JSON and safetensors files are checked for completeness only", root, DIGESTS)
    for path in sorted(root.iterdir()):
        if path.suffix == ".json" and path.is_file():
            read_json(path)
        elif path.suffix == ".safetensors" and path.is_file():
            check_safetensors(path)


def check_safetensors(path: Path) -> None:
    """A safetensors file is an 8-byte little-endian header length, the JSON header, then the
    tensors' bytes, whose extent the header gives (``data_offsets``): the file must end there."""
    size = path.stat().st_size
    if size == 0:
        raise Damaged(path, "empty (0 bytes)")
    with open(path, "rb") as f:
        head = f.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else None
        if length is None or 8 + length > size:
            raise Damaged(path, f"truncated ({size} bytes: shorter than its own header)")
        try:
            header = json.loads(f.read(length).decode("utf-8"))
            end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        except (UnicodeDecodeError, ValueError, TypeError, KeyError, IndexError, AttributeError) as err:
            raise Damaged(path, f"its header is not valid safetensors JSON ({first_line(err)})") from None
    want = 8 + length + end
    if size < want:
        raise Damaged(path, f"truncated ({size} of {want} bytes)")
    if size > want:
        raise Damaged(path, f"longer than its header says ({size} bytes, {want} expected)")
