"""Loading and saving COMET-family quality estimators (CometKiwi, COMET, XCOMET).

On-disk format (comet's own, so `comet.load_from_checkpoint` and `comet-score` read it)::

    <dir>/hparams.yaml              class_identifier + the model's hyperparameters
    <dir>/checkpoints/model.ckpt    {"state_dict", "hyper_parameters", "pytorch-lightning_version"}
    <dir>/encoder/                  the encoder's config.json + tokenizer files (no weights)

Why `encoder/` and an absolute path: comet's loader always builds the encoder skeleton with
`XLMRobertaTokenizerFast/Config.from_pretrained(hparams["pretrained_model"])`, taking
`pretrained_model` from the checkpoint's hyper_parameters (hparams.yaml is only read for the class
unless reload_hparams=True, which `comet-score` never passes). A hub id there means a network
lookup; a relative path would resolve against the caller's working directory. So `save_qe` writes
the absolute path of `<dir>/encoder` into both the checkpoint and hparams.yaml: comet's own loader
and the CLI then work offline from any directory. If the directory is moved, that stored path goes
stale; `load_qe` therefore never trusts it and points the encoder at `<dir>/encoder` itself
(Lightning lets keyword arguments override saved hyperparameters).
"""

from __future__ import annotations

import hashlib
import io
import logging
import shutil
import struct
import zipfile
import zlib
from pathlib import Path

import torch
import yaml

from qeebm.errors import QeebmError
from qeebm.utils import hub

log = logging.getLogger(__name__)

ENCODER_SUBDIR = "encoder"
CHECKPOINT = Path("checkpoints") / "model.ckpt"

# The encoder each public COMET checkpoint names in its hparams (pretrained_model): needed to name
# the files in the offline error before hparams.yaml can be read.
KNOWN_ENCODERS = {
    "Unbabel/wmt22-cometkiwi-da": "microsoft/infoxlm-large",
    "Unbabel/wmt23-cometkiwi-da-xl": "facebook/xlm-roberta-xl",
    "Unbabel/wmt23-cometkiwi-da-xxl": "facebook/xlm-roberta-xxl",
    "Unbabel/wmt22-comet-da": "xlm-roberta-large",
    "Unbabel/XCOMET-XL": "facebook/xlm-roberta-xl",
    "Unbabel/XCOMET-XXL": "facebook/xlm-roberta-xxl",
}
# Only what from_pretrained needs for the tokenizer and the config: never the encoder's weights,
# which the COMET checkpoint already holds (comet loads with load_pretrained_weights=False).
ENCODER_FILES = ["config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "sentencepiece.bpe.model"]


def _class_identifiers() -> dict[type, str]:
    from comet.models import str2model

    return {cls: name for name, cls in str2model.items()}


def qe_kind(model) -> str:
    """"kiwi" (reference-free UnifiedMetric), "comet" (reference-based RegressionMetric) or
    "xcomet" (XCOMETMetric, or a UnifiedMetric that also reads the reference)."""
    from comet.models import ReferencelessRegression, RegressionMetric, UnifiedMetric, XCOMETMetric

    if isinstance(model, XCOMETMetric):
        return "xcomet"
    if isinstance(model, UnifiedMetric):
        return "xcomet" if "ref" in model.hparams.input_segments else "kiwi"
    if isinstance(model, RegressionMetric) and not isinstance(model, ReferencelessRegression):
        return "comet"
    raise QeebmError(f"unsupported QE model class {type(model).__name__}: expected a CometKiwi-style "
                     "UnifiedMetric, a reference-based RegressionMetric or XCOMET")


# ----------------------------------------------------------------------------------------- loading
def _missing_files_error(repo_id: str, encoder: str | None, why: str) -> QeebmError:
    enc = encoder or KNOWN_ENCODERS.get(repo_id, "<its pretrained_model in hparams.yaml>")
    return QeebmError(
        f"cannot load QE model '{repo_id}': {why}. Needed: {repo_id} (hparams.yaml, "
        f"checkpoints/model.ckpt) and the encoder config + tokenizer of {enc} "
        f"({', '.join(ENCODER_FILES)}; no weights). Fetch them where the hub is reachable (gated "
        "models need an accepted license and `hf auth login`) into the HF cache, or pass a "
        "local directory in comet's format (hparams.yaml + checkpoints/model.ckpt [+ encoder/])")


def _cached_or_downloaded(repo_id: str, required: str, allow_patterns=None) -> Path | None:
    """The repo's snapshot holding ``required``: from the local cache, else from the hub; None when
    it is not cached and offline mode is on. What keeps the hub from providing it is raised as a
    QeebmError with its cause (a gated model's names the licence page and the login)."""
    from huggingface_hub import snapshot_download

    snap = hub.cached(repo_id, allow_patterns=allow_patterns)
    if snap is not None and (snap / required).is_file():
        return snap
    if hub.offline():
        return None
    # Seconds through the hub client (proxies, token, endpoint from the environment), then the download.
    hub.check_access(repo_id)
    try:
        return Path(snapshot_download(repo_id, allow_patterns=allow_patterns))
    except Exception as err:  # noqa: BLE001 - hub.reason names each type the client raises
        raise QeebmError(hub.reason(err, repo_id)) from err


def _hub_failure(repo_id: str, err: QeebmError) -> QeebmError:
    return QeebmError(f"cannot load QE model '{repo_id}': {err}")


def resolve_checkpoint(name_or_path: str) -> Path:
    p = Path(name_or_path).expanduser()
    if p.is_file():
        return p.resolve()
    if p.is_dir():
        ckpt = p / CHECKPOINT
        if not ckpt.is_file() or not (p / "hparams.yaml").is_file():
            raise QeebmError(f"{p} is not a COMET model directory: it needs hparams.yaml and {CHECKPOINT}")
        return ckpt.resolve()
    if name_or_path.count("/") != 1 or name_or_path.startswith((".", "/", "~")):
        raise QeebmError(f"QE model '{name_or_path}' is neither a local path nor a hub id (org/name)")
    # What comet.download_model does for hub-hosted models (all the supported ones), without its
    # fallback to legacy download URLs, which would hang offline, and without importing comet.
    try:
        snap = _cached_or_downloaded(name_or_path, str(CHECKPOINT))
    except QeebmError as err:
        raise _hub_failure(name_or_path, err) from err
    if snap is None:
        raise _missing_files_error(name_or_path, None, "it is not in the local Hugging Face cache and the hub is "
                                   "unreachable: offline mode is on (HF_HUB_OFFLINE)")
    if not (snap / CHECKPOINT).is_file():
        raise _missing_files_error(name_or_path, None, f"the hub's copy has no {CHECKPOINT}")
    return snap / CHECKPOINT


def _resolve_encoder(model_dir: Path, hparams: dict, encoder_dir: str | None, repo_id: str) -> str:
    """A local directory holding the encoder's config + tokenizer, so comet never goes online."""
    if encoder_dir is not None:
        if not (Path(encoder_dir) / "config.json").is_file():
            raise QeebmError(f"encoder_dir {encoder_dir} has no config.json")
        return str(Path(encoder_dir).resolve())
    if (model_dir / ENCODER_SUBDIR / "config.json").is_file():
        return str((model_dir / ENCODER_SUBDIR).resolve())
    name = str(hparams.get("pretrained_model", ""))
    if (Path(name) / "config.json").is_file():
        return str(Path(name).resolve())
    if not name or Path(name).is_absolute():
        raise QeebmError(f"the encoder of {model_dir} ({name or 'no pretrained_model'}) is missing: "
                         f"put its config.json and tokenizer files in {model_dir / ENCODER_SUBDIR}")
    try:
        snap = _cached_or_downloaded(name, "config.json", allow_patterns=["*.json", "*.model", "*.txt"])
    except QeebmError as err:
        raise _hub_failure(repo_id, QeebmError(f"its encoder: {err}")) from err
    if snap is None or not (snap / "config.json").is_file():
        raise _missing_files_error(repo_id, name, f"the config/tokenizer of its encoder {name} is not "
                                   "available (not cached, offline mode is on)")
    return str(snap)


def load_qe(name_or_path: str, encoder_dir: str | None = None):
    """Load a CometKiwi / COMET / XCOMET model (eval mode, on CPU) from a hub id or a local
    directory (or .ckpt path) in comet's on-disk format. No remote code is executed."""
    ckpt = resolve_checkpoint(str(name_or_path))
    model_dir = ckpt.parents[1]
    hparams_file = model_dir / "hparams.yaml"
    if not hparams_file.is_file():
        raise QeebmError(f"{hparams_file} is missing")
    hparams = yaml.safe_load(hparams_file.read_text()) or {}
    from comet.models import str2model  # after the offline checks: importing comet takes seconds

    cls = str2model.get(hparams.get("class_identifier"))
    if cls is None:
        raise QeebmError(f"{hparams_file}: unknown class_identifier {hparams.get('class_identifier')!r}")
    encoder = _resolve_encoder(model_dir, hparams, encoder_dir, str(name_or_path))
    kwargs = {}
    # comet.load_from_checkpoint swaps "sparsemax_patch" for softmax (its issue #244); same here.
    if hparams.get("layer_transformation") == "sparsemax_patch":
        kwargs["layer_transformation"] = "softmax"
    try:
        # weights_only: tensors and plain containers only, so a checkpoint from elsewhere cannot run
        # code (torch's default since 2.6; said here so no older default can change it).
        model = cls.load_from_checkpoint(
            checkpoint_path=ckpt, load_pretrained_weights=False, map_location=torch.device("cpu"),
            strict=False, local_files_only=True, pretrained_model=encoder, weights_only=True, **kwargs)
    except QeebmError:
        raise
    except Exception as err:
        raise QeebmError(f"comet could not load {ckpt}: {type(err).__name__}: {err}") from err
    model.eval()
    log.info("loaded QE %s (%s, kind=%s, encoder from %s)", name_or_path, cls.__name__,
             qe_kind(model), encoder)
    return model


# ------------------------------------------------------------------------------------------ saving
def _plain(value):
    """hparams as YAML/weights_only-safe builtins (Lightning's AttributeDict, tuples, Paths...)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return value


def save_qe(model, out_dir: str | Path) -> Path:
    """Write `model` in comet's on-disk format (see the module docstring). Returns out_dir."""
    import pytorch_lightning as pl

    out = Path(out_dir).resolve()
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    enc_dir = out / ENCODER_SUBDIR
    tmp = out / (ENCODER_SUBDIR + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    # Saved via a temporary dir: the model may have been loaded from this very directory.
    model.encoder.tokenizer.save_pretrained(tmp)
    model.encoder.model.config.save_pretrained(tmp)
    shutil.rmtree(enc_dir, ignore_errors=True)
    tmp.rename(enc_dir)

    hparams = _plain(dict(model.hparams))
    hparams["class_identifier"] = _class_identifiers()[type(model)]
    hparams["pretrained_model"] = str(enc_dir)
    hparams["load_pretrained_weights"] = False
    # Weights are not tied across a reload: copy tensors out of any inference-mode/view storage.
    state = {k: v.detach().clone().cpu() for k, v in model.state_dict().items()}
    torch.save({"state_dict": state, "hyper_parameters": hparams,
                "pytorch-lightning_version": pl.__version__}, out / CHECKPOINT)
    _pin_serialization_id(out / CHECKPOINT)
    (out / "hparams.yaml").write_text(yaml.safe_dump(hparams, sort_keys=True))
    return out


def _pin_serialization_id(path: Path) -> None:
    """Make torch.save's output a function of its content alone.

    torch's zip checkpoints carry `.data/serialization_id`, 40 digits partly drawn at random on
    every save, so the same weights saved twice differ in bytes (and in a build manifest's hash).
    torch.load only reports the id, so it is replaced in place by digits derived from the tensor
    records (not data.pkl, which holds the machine-specific encoder path); the entry's CRC-32 is
    updated where the zip records it (local header or data descriptor, and the central directory),
    keeping the archive valid and its layout unchanged.
    """

    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(io.BytesIO(raw)) as zf:
        info = next((i for i in zf.infolist() if i.filename.endswith(".data/serialization_id")), None)
        if info is None:
            return
        old = zf.read(info)
        central = zf.start_dir
        digest = hashlib.sha256()
        for other in zf.infolist():
            if other is not info and not other.filename.endswith("/data.pkl"):
                digest.update(other.filename.encode() + b"\0" + zf.read(other))
    name_len, extra_len = struct.unpack_from("<HH", raw, info.header_offset + 26)
    at = info.header_offset + 30 + name_len + extra_len
    if bytes(raw[at:at + len(old)]) != old:
        return  # an unexpected layout: leave the file as torch wrote it
    new = str(int.from_bytes(digest.digest(), "big") % 10 ** len(old)).zfill(len(old)).encode()
    raw[at:at + len(old)] = new
    old_crc, new_crc = zlib.crc32(old), zlib.crc32(new)

    def swap_crc(offset: int) -> None:
        if struct.unpack_from("<I", raw, offset)[0] == old_crc:
            struct.pack_into("<I", raw, offset, new_crc)

    swap_crc(info.header_offset + 14)  # local header (0 when a data descriptor follows)
    desc = at + len(old)
    swap_crc(desc + 4 if raw[desc:desc + 4] == b"PK\x07\x08" else desc)  # data descriptor
    name = info.filename.encode()
    pos = central
    while raw[pos:pos + 4] == b"PK\x01\x02":  # central directory records
        n, e, c = struct.unpack_from("<HHH", raw, pos + 28)
        if raw[pos + 46:pos + 46 + n] == name:
            swap_crc(pos + 16)
            break
        pos += 46 + n + e + c
    path.write_bytes(bytes(raw))
