"""A real HTTPS file server on loopback with a certificate of its own (made by ``openssl``),
for sources that must be fetched over TLS from a host the runner trusts only by its CA file."""

from __future__ import annotations

import contextlib
import functools
import http.server
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass
class HttpsServer:
    url: str
    """``https://HOST:PORT``, serving the files of the folder it was started on."""
    ca_file: Path
    """The server's self-signed certificate: trust it to reach the server."""


def make_certificate(folder: Path, ip: str) -> tuple[Path, Path]:
    """A self-signed certificate for ``ip`` (its SAN) and its key."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", f"/CN={ip}", "-addext", f"subjectAltName=IP:{ip}",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


@contextlib.contextmanager
def https_server(root: Path, certs: Path) -> Iterator[HttpsServer]:
    """Serve ``root`` over HTTPS on a free loopback port until the block ends."""
    cert, key = make_certificate(certs, "127.0.0.1")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)  # listening at once
    port = server.server_address[1]
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield HttpsServer(f"https://127.0.0.1:{port}", cert)
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass
