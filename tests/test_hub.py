"""Hub access through the hub client: a proxy is an environment variable the client follows (a local
proxy here answers for a hub that does not resolve), a gated model is the hub's own error turned into a
message naming the model, its licence page and the login, and a failure keeps its cause."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from pathlib import Path

import pytest
import requests

from qeebm import data_prep, hub
from qeebm.errors import QeebmError

GATED = "Unbabel/XCOMET-XL"
OPEN = "facebook/mbart-large-50"


class FakeProxy(http.server.ThreadingHTTPServer):
    """An HTTP proxy on 127.0.0.1. For http:// URLs (requests sends the absolute URL to the proxy) it
    plays the hub: GATED is gated and refuses its files, OPEN is open, anything else is missing.
    CONNECT (how https goes through a proxy) is recorded and refused, as a proxy that blocks the
    target would."""

    def __init__(self):
        self.seen: list[tuple[str, str, str | None]] = []  # (method, target, Authorization)
        super().__init__(("127.0.0.1", 0), _Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _reply(self, status: int, body: dict, **headers) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        for k, v in {"Content-Type": "application/json", "Content-Length": str(len(data)), **headers}.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_CONNECT(self):
        self.server.seen.append(("CONNECT", self.path, self.headers.get("Authorization")))
        self.send_response(403, "Blocked by proxy policy")
        self.end_headers()

    def do_GET(self):
        self.server.seen.append(("GET", self.path, self.headers.get("Authorization")))
        path = self.path.split("://", 1)[-1].split("/", 1)[1].split("?")[0]  # api/models/org/name[/...]
        kind, _, rest = path.removeprefix("api/").partition("/")
        repo = "/".join(rest.split("/")[:2])
        if repo not in (GATED, OPEN):
            self._reply(404, {"error": "Repository not found"}, **{"X-Error-Code": "RepoNotFound",
                                                                    "X-Error-Message": "Repository not found"})
        elif rest.endswith("/auth-check") and repo == GATED:
            message = f"Access to model {GATED} is restricted and you are not in the authorized list."
            self._reply(403, {"error": message}, **{"X-Error-Code": "GatedRepo", "X-Error-Message": message})
        else:
            self._reply(200, {"id": repo, "sha": "0" * 40, "gated": "manual" if repo == GATED else False,
                              "siblings": []})


@pytest.fixture
def online(monkeypatch, tmp_path):
    """The hub client online (tests run with HF_HUB_OFFLINE=1), with no token and no proxy set
    unless a test sets one; no one may probe the hub with a socket of its own."""
    from huggingface_hub import constants
    from huggingface_hub.utils import reset_sessions

    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_TOKEN",
                 "HUGGING_FACE_HUB_TOKEN", "NO_PROXY", "no_proxy", "HTTP_PROXY", "http_proxy", "HTTPS_PROXY",
                 "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    direct = []
    real = socket.create_connection

    def create_connection(address, *args, **kwargs):
        direct.append(address)
        return real(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", create_connection)
    reset_sessions()  # a session made offline refuses every request
    proxy = FakeProxy()
    yield proxy
    proxy.shutdown()
    proxy.server_close()
    reset_sessions()
    assert not [a for a in direct if a[0] != "127.0.0.1"], f"the hub was probed directly: {direct}"


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
    from qeebm.translator import _hub_error

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
