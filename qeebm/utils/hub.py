"""The Hugging Face hub, asked through its own client.

Whether a model or data set can be had is decided by huggingface_hub, which reads the way there from
the environment: HTTPS_PROXY / HTTP_PROXY / NO_PROXY (through requests), HF_ENDPOINT, HF_TOKEN or
the token ``hf auth login`` stored, HF_HUB_OFFLINE. A failure keeps its cause: a gated repository the
account here may not read names the page where its licence is accepted and the login; a proxy or
network failure says what the client met.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from qeebm.errors import QeebmError, first_line

# Seconds for one metadata request: the hub client's own default for its HEAD requests. Without a
# limit a network that drops packets holds the first request for the kernel's connect timeout (minutes).
TIMEOUT = 10.0
LOGIN = "`hf auth login` (or `huggingface-cli login`), or set HF_TOKEN"
_TRUE = ("1", "ON", "YES", "TRUE")


def offline(datasets: bool = False) -> bool:
    """Whether the environment says to stay off the hub. huggingface_hub reads HF_HUB_OFFLINE once,
    when it is imported; the variables are read again here, so a later setting counts too."""
    from huggingface_hub import constants

    names = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE") + (("HF_DATASETS_OFFLINE",) if datasets else ())
    return bool(constants.HF_HUB_OFFLINE) or any(os.environ.get(n, "").upper() in _TRUE for n in names)


def page(repo_id: str, repo_type: str = "model") -> str:
    """The repository's page on the hub (where a gated repository's licence is accepted)."""
    from huggingface_hub import constants

    prefix = "" if repo_type == "model" else f"{repo_type}s/"
    return f"{constants.ENDPOINT.rstrip('/')}/{prefix}{repo_id}"


def hub_cause(err: BaseException) -> Optional[BaseException]:
    """The hub client's or the network's error in ``err``'s chain of causes (transformers and datasets
    wrap them in OSError and their own types), the most telling first: a gated repository, any other
    answer of the hub, then a network failure."""
    import requests
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled

    chain, seen = [], set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        chain.append(err)
        err = err.__cause__ or err.__context__
    for kinds in ((GatedRepoError,), (OfflineModeIsEnabled,),
                  (HfHubHTTPError,), (requests.ConnectionError, requests.Timeout)):
        for e in chain:
            # A cache miss only says the client gave up; what it met is further down the chain.
            if isinstance(e, kinds) and not isinstance(e, LocalEntryNotFoundError):
                return e
    return None


def reason(err: BaseException, repo_id: str, repo_type: str = "model") -> str:
    """Why ``repo_id`` could not be had, in one line, from what the hub client raised."""
    import requests
    from huggingface_hub import get_token
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    cause = hub_cause(err) or err
    status = getattr(getattr(cause, "response", None), "status_code", None)
    # The hub's own words (its X-Error-Message) where it sent some, else the client's first line.
    detail = (getattr(cause, "server_message", None) or "").strip().splitlines()[:1] or [first_line(cause)]
    said = f"(hub: {f'{status} ' if status else ''}{type(cause).__name__}: {detail[0]})"
    if isinstance(cause, GatedRepoError):
        who = ("no Hugging Face token was found here" if get_token() is None
               else "the token found here has no access to it yet")
        return (f"'{repo_id}' is gated: its licence must be accepted on the hub, and {who}. Accept it at "
                f"{page(repo_id, repo_type)} with your account, then log in on this machine: {LOGIN} {said}")
    if isinstance(cause, OfflineModeIsEnabled):
        return f"'{repo_id}' is not in the local Hugging Face cache and offline mode is on (HF_HUB_OFFLINE)"
    if isinstance(cause, RevisionNotFoundError):
        return f"'{repo_id}' has no such revision on the hub {said}"
    if isinstance(cause, EntryNotFoundError):
        return f"a file of '{repo_id}' is missing on the hub {said}"
    if isinstance(cause, RepositoryNotFoundError):
        return (f"the hub has no {repo_type} '{repo_id}', or it is private and needs a login ({LOGIN}) {said}")
    if isinstance(cause, HfHubHTTPError):
        if status in (401, 403):
            return f"the hub refused the request for '{repo_id}': log in again ({LOGIN}) {said}"
        return f"the hub could not serve '{repo_id}' {said}"
    if isinstance(cause, requests.exceptions.ProxyError):
        proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy") or "the proxy"
        return f"the proxy {proxy} (HTTPS_PROXY) did not get through to the hub for '{repo_id}' {said}"
    if isinstance(cause, (requests.ConnectionError, requests.Timeout)):
        from huggingface_hub import constants

        return (f"the hub at {constants.ENDPOINT} did not answer for '{repo_id}' {said}; behind a proxy set "
                "HTTPS_PROXY (the hub client reads it), or fill the Hugging Face cache where the hub is "
                "reachable and set HF_HUB_OFFLINE=1 here")
    return f"'{repo_id}' could not be had: {type(cause).__name__}: {first_line(cause)}"


def check_access(repo_id: str, repo_type: str = "model", revision: Optional[str] = None,
                 timeout: float = TIMEOUT) -> None:
    """Ask the hub, in seconds, whether ``repo_id`` can be downloaded from here: its metadata (which a
    proxy, a network failure or a wrong id stops), and for a gated repository whether the account
    logged in here may read its files. Raises a QeebmError with ``reason``; offline mode is one too."""
    from huggingface_hub import HfApi

    if offline(datasets=repo_type == "dataset"):
        raise QeebmError(f"'{repo_id}' cannot be checked on the hub: offline mode is on (HF_HUB_OFFLINE)")
    api = HfApi()
    try:
        info = api.repo_info(repo_id, repo_type=repo_type, revision=revision, timeout=timeout)
        # Anyone may read a gated repository's metadata; only its files need the accepted licence.
        if getattr(info, "gated", False):
            api.auth_check(repo_id, repo_type=repo_type)
    except Exception as err:  # noqa: BLE001 - the client raises many types; reason() names each
        raise QeebmError(reason(err, repo_id, repo_type)) from err


def cached(repo_id: str, repo_type: str = "model", revision: Optional[str] = None,
           allow_patterns=None) -> Optional[Path]:
    """The repository's snapshot in the local Hugging Face cache, or None when it is not there."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, repo_type=repo_type, revision=revision, local_files_only=True,
                                      allow_patterns=allow_patterns))
    except Exception:  # noqa: BLE001 - a cache miss has several types across hub versions
        return None


def require(repo_id: str, repo_type: str = "model", revision: Optional[str] = None,
            required: Optional[str] = None) -> str:
    """Where ``repo_id`` will come from: the local cache (holding ``required``, if named), else the hub
    when ``check_access`` says it can be had from here. Raises a QeebmError saying why not."""
    snap = cached(repo_id, repo_type, revision)
    if snap is not None and (required is None or (snap / required).is_file()):
        return "in the local Hugging Face cache"
    if offline(datasets=repo_type == "dataset"):
        raise QeebmError(f"'{repo_id}' is not in the local Hugging Face cache and offline mode is on (HF_HUB_OFFLINE)")
    check_access(repo_id, repo_type, revision)
    return "on the hub, readable from here"
