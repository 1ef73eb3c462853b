"""A local stand-in for the Hugging Face Hub's file endpoint, for tests that
must never reach the internet: `GET`/`HEAD /{org}/{name}/resolve/{revision}/{file}`
answered from `root/{org}/{name}/{file}`, with the headers the hub clients
read (`X-Repo-Commit`, `ETag`, `Content-Length`, `Accept-Ranges`; `Range`
requests get 206 and `Content-Range`) and the Hub's 404s
(`X-Error-Code: RepoNotFound`, `EntryNotFound`, `RevisionNotFound`).
Point `HF_ENDPOINT` at it.

Run as a script (`python tests/fake_hub.py ROOT`), it prints its base URL on
one line and serves until stdin closes; `FakeHub` serves from a thread."""

from __future__ import annotations

import hashlib
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

#: The commit every repo's `main` resolves to.
COMMIT = "0123456789abcdef0123456789abcdef01234567"
_RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


class _Handler(BaseHTTPRequestHandler):
    server: _HubServer

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
        pass

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _refuse(self, code: str) -> None:
        payload = f'{{"error": "{code}"}}'.encode()
        self.send_response(404)
        self.send_header("X-Error-Code", code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(payload)

    def _answer(self, body: bool) -> None:
        self.server.requests.append(self.path)
        match = _RESOLVE.match(self.path.split("?")[0])
        if match is None:
            self._refuse("RepoNotFound")
            return
        repo, revision, name = match.groups()
        repo_dir = self.server.root / repo
        if not repo_dir.is_dir():
            self._refuse("RepoNotFound")
            return
        if revision not in ("main", COMMIT):
            self._refuse("RevisionNotFound")
            return
        path = repo_dir / name
        if ".." in Path(name).parts or not path.is_file():
            self._refuse("EntryNotFound")
            return
        data = path.read_bytes()
        start, end = 0, len(data) - 1
        ranged = _RANGE.match(self.headers.get("Range", ""))
        if ranged is not None:
            start = int(ranged.group(1))
            end = min(int(ranged.group(2)) if ranged.group(2) else end, end)
        self.send_response(206 if ranged is not None else 200)
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        self.send_header("Accept-Ranges", "bytes")
        if ranged is not None:
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        if body:
            self.wfile.write(data[start : end + 1])


class _HubServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root = root
        #: Every request path, in order.
        self.requests: list[str] = []


class FakeHub:
    """The fake hub serving `root` from a thread (a context manager);
    `url` is its base URL, `requests` the paths asked for."""

    def __init__(self, root: Path) -> None:
        self._server = _HubServer(root)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self.requests = self._server.requests
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def main() -> None:
    """Serves `sys.argv[1]`, prints the base URL, and stops when stdin closes."""
    with FakeHub(Path(sys.argv[1])) as hub:
        print(hub.url, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main()
