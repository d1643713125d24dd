"""An HTTPS file server for a host outside the cluster: ``python https_files.py DIR CERT KEY
IP PORT`` serves DIR over TLS with CERT (the real-node tier's https:// sources)."""

from __future__ import annotations

import functools
import http.server
import ssl
import sys


def main() -> None:
    folder, cert, key, ip, port = sys.argv[1:6]
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=folder)
    server = http.server.ThreadingHTTPServer((ip, int(port)), handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
