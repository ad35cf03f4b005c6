"""Hub access through the hub client: a proxy is an environment variable the client follows (a local
proxy here answers for a hub that does not resolve), a gated model is the hub's own error turned into a
message naming the model, its licence page and the login, and a failure keeps its cause."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from qeebm.data import prepare as data_prep
from qeebm.errors import QeebmError
from qeebm.utils import hub

from support.hub import GATED, OPEN, online_hub


@pytest.fixture
def online(monkeypatch, tmp_path):
    with online_hub(monkeypatch, tmp_path) as proxy:
        yield proxy


def test_https_proxy_from_the_environment_is_used_and_its_refusal_is_the_error(online, monkeypatch):
    # The real endpoint: no socket of ours can reach it here, the client goes to the proxy it is told of.
    monkeypatch.setenv("HTTPS_PROXY", online.url)
    with pytest.raises(QeebmError) as err:
        hub.check_access(OPEN)
    assert [(m, t) for m, t, _ in online.seen] == [("CONNECT", "huggingface.co:443")]
    msg = str(err.value)
    assert "\n" not in msg and f"the proxy {online.url} (HTTPS_PROXY) did not get through" in msg
    assert "ProxyError" in msg and OPEN in msg


def test_a_hub_reached_only_through_a_proxy_is_reachable(online, monkeypatch):
    from huggingface_hub import constants

    # hub.invalid never resolves: only the proxy named in the environment leads there.
    monkeypatch.setattr(constants, "ENDPOINT", "http://hub.invalid")
    monkeypatch.setenv("HTTP_PROXY", online.url)
    hub.check_access(OPEN)
    corpus = data_prep.HubCorpus(OPEN, src_key="en", tgt_key="mn", revision="refs/convert/parquet")
    monkeypatch.setattr(data_prep, "_load_split", lambda *a: pytest.fail("stop after the access check"))
    with pytest.raises(pytest.fail.Exception, match="stop after the access check"):
        data_prep.prepare(corpus, Path("/nonexistent/data"), tokenizer=None, src_code="en", tgt_code="mn")
    assert [t for _, t, _ in online.seen] == [f"http://hub.invalid/api/models/{OPEN}",
                                              f"http://hub.invalid/api/datasets/{OPEN}/revision/refs%2Fconvert%2Fparquet"]
    with pytest.raises(QeebmError, match="the hub has no model 'org/missing', or it is private"):
        hub.check_access("org/missing")


def test_a_gated_model_names_its_licence_page_and_the_login(online, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "http://hub.invalid")
    monkeypatch.setenv("HTTP_PROXY", online.url)
    with pytest.raises(QeebmError) as err:
        hub.check_access(GATED)
    msg = str(err.value)
    assert "\n" not in msg
    assert f"'{GATED}' is gated" in msg and f"http://hub.invalid/{GATED}" in msg
    assert "hf auth login" in msg and "huggingface-cli login" in msg and "HF_TOKEN" in msg
    assert "no Hugging Face token was found here" in msg
    assert f"(hub: 403 GatedRepoError: Access to model {GATED} is restricted" in msg
    # With a token in the environment the client sends it, and the message says it lacks access.
    monkeypatch.setenv("HF_TOKEN", "hf_testtoken")
    with pytest.raises(QeebmError, match="the token found here has no access to it yet"):
        hub.check_access(GATED)
    assert online.seen[-1] == ("GET", f"http://hub.invalid/api/models/{GATED}/auth-check", "Bearer hf_testtoken")


def test_offline_mode_is_decided_before_any_request(online, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(QeebmError, match="offline mode is on"):
        hub.check_access(OPEN)
    assert online.seen == []


def gated_error(repo: str = GATED):
    from huggingface_hub.errors import GatedRepoError

    response = requests.Response()
    response.status_code = 401
    response.url = f"https://huggingface.co/{repo}/resolve/main/checkpoints/model.ckpt"
    response.headers.update({"X-Error-Code": "GatedRepo",
                             "X-Error-Message": f"Access to model {repo} is restricted. You must have access to it "
                                                "and be authenticated to access it. Please log in."})
    return GatedRepoError(f"401 Client Error. Cannot access gated repo for url {response.url}.", response=response,
                          server_message=response.headers["X-Error-Message"])


def test_a_gated_qe_model_is_one_line_naming_the_licence_page(online, monkeypatch, tmp_path):
    """The download (snapshot_download) is refused with the hub's GatedRepoError: the loader says so."""
    import huggingface_hub

    from qeebm.qe.models import load_qe

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(huggingface_hub.HfApi, "repo_info", lambda self, *a, **k: type("Info", (), {"gated": False})())
    calls = []

    def snapshot_download(repo_id, local_files_only=False, **kwargs):
        calls.append(local_files_only)
        if local_files_only:
            from huggingface_hub.errors import LocalEntryNotFoundError

            raise LocalEntryNotFoundError("not in the cache")
        raise gated_error(repo_id)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    with pytest.raises(QeebmError) as err:
        load_qe(GATED)
    assert calls == [True, False]
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"cannot load QE model '{GATED}': '{GATED}' is gated")
    assert f"https://huggingface.co/{GATED}" in msg and "huggingface-cli login" in msg and "HF_TOKEN" in msg
    assert "(hub: 401 GatedRepoError: Access to model Unbabel/XCOMET-XL is restricted." in msg


def test_a_gated_translator_keeps_the_hub_error():
    from qeebm.translation.translator import _hub_error

    # What transformers raises for a gated repository: an OSError whose cause is the hub's error.
    try:
        try:
            raise gated_error("org/gated-mt")
        except Exception as cause:
            raise OSError("You are trying to access a gated repo.") from cause
    except OSError as err:
        msg = str(_hub_error("org/gated-mt", err))
    assert msg.startswith("cannot load translator 'org/gated-mt': 'org/gated-mt' is gated")
    assert "https://huggingface.co/org/gated-mt" in msg
    # Without a hub error inside, the offline wording stays.
    assert "no model hub is reachable" in str(_hub_error("org/x", OSError("not cached")))
