"""A hub for tests: a local HTTP proxy that answers the hub client's metadata requests, and the
client put online with no token, no proxy and no direct socket to anything but that proxy:
`from support.hub import FakeProxy, online_hub`."""

from __future__ import annotations

import contextlib
import http.server
import json
import socket
import threading

GATED = "Unbabel/XCOMET-XL"
OPEN = "facebook/mbart-large-50"


class FakeProxy(http.server.ThreadingHTTPServer):
    """An HTTP proxy on 127.0.0.1. For http:// URLs (requests sends the absolute URL to the proxy) it
    plays the hub: the ``gated`` repositories are gated and refuse their files, the ``open`` ones are
    open, anything else is missing. CONNECT (how https goes through a proxy) is recorded and refused,
    as a proxy that blocks the target would."""

    def __init__(self, gated=(GATED,), open=(OPEN,)):
        self.gated, self.open = set(gated), set(open)
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
        if repo not in self.server.gated | self.server.open:
            self._reply(404, {"error": "Repository not found"}, **{"X-Error-Code": "RepoNotFound",
                                                                    "X-Error-Message": "Repository not found"})
        elif rest.endswith("/auth-check") and repo in self.server.gated:
            message = f"Access to model {repo} is restricted and you are not in the authorized list."
            self._reply(403, {"error": message}, **{"X-Error-Code": "GatedRepo", "X-Error-Message": message})
        else:
            self._reply(200, {"id": repo, "sha": "0" * 40, "gated": "manual" if repo in self.server.gated else False,
                              "siblings": []})


@contextlib.contextmanager
def online_hub(monkeypatch, tmp_path, **proxy):
    """The hub client online (tests run with HF_HUB_OFFLINE=1) with an empty cache, no token and no
    proxy unless the test sets one; yields a FakeProxy. Nothing may open a socket of its own to
    anything but it (the hub client connects to the proxy it is told of)."""
    from huggingface_hub import constants
    from huggingface_hub.utils import reset_sessions

    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_TOKEN",
                 "HUGGING_FACE_HUB_TOKEN", "NO_PROXY", "no_proxy", "HTTP_PROXY", "http_proxy", "HTTPS_PROXY",
                 "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    direct = []
    real = socket.create_connection

    def create_connection(address, *args, **kwargs):
        direct.append(address)
        return real(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", create_connection)
    reset_sessions()  # a session made offline refuses every request
    server = FakeProxy(**proxy)
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        reset_sessions()
    assert not [a for a in direct if a[0] != "127.0.0.1"], f"the hub was probed directly: {direct}"
