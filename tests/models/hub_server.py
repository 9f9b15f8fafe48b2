"""A local stand-in for the Hugging Face Hub's file routes, for `huggingface_hub.snapshot_download` (no network).

`FakeHub` serves, on 127.0.0.1, the routes `snapshot_download` calls (huggingface_hub 1.x/2.x):

- `GET /api/{models|datasets}/{org}/{name}/revision/{rev}`: the repository's info, `sha` (its one commit) and
  `siblings`;
- `GET /api/{models|datasets}/{org}/{name}/tree/{rev}`: the file listing (`type`, `path`, `size`, `oid`);
- `HEAD`/`GET /{org}/{name}/resolve/{rev}/{file}` (a dataset: `/datasets/...`): the file, with `X-Repo-Commit`,
  `ETag` and `Content-Length`, as the Hub sends them for a file stored in git (not LFS, not Xet).

An unknown repository answers 404 with `X-Error-Code: RepoNotFound`, as the Hub does. Point a process at it with
`HF_ENDPOINT=hub.url` (read by `huggingface_hub.constants` at import: set it in a subprocess's environment) or pass
`endpoint=`. `hub.requests` records every request's method and path, to tell whether the Hub was asked at all.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
import urllib.parse
from typing import Dict, List, Tuple


class FakeHub:
    """`repos`: {("model"|"dataset", "org/name"): {path in repo: bytes}}; serves them until `close()`."""

    def __init__(self, repos: Dict[Tuple[str, str], Dict[str, bytes]]):
        self.repos = repos
        self.requests: List[Tuple[str, str]] = []
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                hub._answer(self, body=True)

            def do_HEAD(self):
                hub._answer(self, body=False)

            def log_message(self, *args):  # quiet
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeHub:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @staticmethod
    def commit(files: Dict[str, bytes]) -> str:
        """The repository's one commit: 40 hex digits from its files."""
        digest = hashlib.sha1()
        for path in sorted(files):
            digest.update(path.encode() + b"\0" + hashlib.sha1(files[path]).digest())
        return digest.hexdigest()

    def _answer(self, handler, body: bool) -> None:
        path = urllib.parse.unquote(urllib.parse.urlsplit(handler.path).path)
        self.requests.append((handler.command, path))
        parts = path.strip("/").split("/")
        if parts[0] == "api" and len(parts) >= 6 and parts[1] in ("models", "datasets"):
            repo_type, repo_id, route = parts[1][:-1], "/".join(parts[2:4]), parts[4]
            files = self.repos.get((repo_type, repo_id))
            if files is None or route not in ("revision", "tree"):
                return self._send(handler, 404, b"{}", {"X-Error-Code": "RepoNotFound"}, body)
            if route == "revision":
                info = {"id": repo_id, "sha": self.commit(files), "siblings": [{"rfilename": p} for p in sorted(files)]}
            else:
                info = [
                    {"type": "file", "path": p, "size": len(files[p]), "oid": hashlib.sha1(files[p]).hexdigest()}
                    for p in sorted(files)
                ]
            return self._send(handler, 200, json.dumps(info).encode(), {"Content-Type": "application/json"}, body)
        repo_type = "dataset" if parts[0] == "datasets" else "model"
        parts = parts[1:] if repo_type == "dataset" else parts
        if len(parts) < 5 or parts[2] != "resolve":
            return self._send(handler, 404, b"", {}, body)
        files = self.repos.get((repo_type, "/".join(parts[:2])))
        if files is None:
            return self._send(handler, 404, b"", {"X-Error-Code": "RepoNotFound"}, body)
        name = "/".join(parts[4:])
        if name not in files:
            return self._send(handler, 404, b"", {"X-Error-Code": "EntryNotFound"}, body)
        data = files[name]
        headers = {"X-Repo-Commit": self.commit(files), "ETag": f'"{hashlib.sha1(data).hexdigest()}"'}
        return self._send(handler, 200, data, headers, body)

    @staticmethod
    def _send(handler, status: int, data: bytes, headers: Dict[str, str], body: bool) -> None:
        handler.send_response(status)
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        if body:
            handler.wfile.write(data)


def directory_files(directory: str) -> Dict[str, bytes]:
    """{relative path: bytes} of every file under `directory` (a checkpoint written by a test, as a repository)."""
    import os

    out = {}
    for root, _, names in os.walk(directory):
        for name in names:
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, directory).replace(os.sep, "/")] = f.read()
    return out
