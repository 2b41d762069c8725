"""Traffic of the link check (:mod:`ralp_pipe.runtime.linkcheck`), run inside one emulated host.

``python -m ralp_pipe.runtime.linktraffic --rcvbuf BYTES [--listen ADDR:PORT:COUNT] [--send ADDR:PORT]``
accepts COUNT TCP streams on ADDR:PORT and discards what they carry, and opens one stream to the
``--send`` address (retrying until its listener is up) that sends zeros as fast as the link
takes them. Received streams get a receive buffer of BYTES, which bounds their window; sent
ones use Reno (built into every kernel and allowed without privileges), whose window, with no
loss on these short queues, grows to that bound (BBR would hold it near the bandwidth times the
smallest round trip it saw, below what the other direction's queue needs). It prints ``ready``
once listening and ``sending`` once connected, then runs until it is stopped; a stream that
fails ends it with status 1 and the error on stderr. Standard library only, so one starts in
tens of milliseconds.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time

BLOCK = 1 << 20
CONNECT_S = 30.0  # how long a sender waits for its listener
CONGESTION = b"reno"


def _drain(conn: socket.socket) -> None:
    with conn:
        while conn.recv(BLOCK):
            pass


def _accept(server: socket.socket, count: int) -> None:
    for _ in range(count):
        conn, _ = server.accept()
        threading.Thread(target=_drain, args=(conn,), daemon=True).start()


def _listen(address: str, rcvbuf: int) -> None:
    host, port, count = address.rsplit(":", 2)
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # accepted streams inherit it
    server.bind((host, int(port)))
    server.listen(int(count))
    threading.Thread(target=_accept, args=(server, int(count)), daemon=True).start()


def _connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + CONNECT_S
    while True:
        conn = socket.socket()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, CONGESTION)
        conn.settimeout(CONNECT_S)
        try:
            conn.connect((host, int(port)))
            return conn
        except ConnectionRefusedError:
            conn.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _send(conn: socket.socket) -> None:
    block = bytes(BLOCK)
    while True:
        conn.sendall(block)


def _fail(args: threading.ExceptHookArgs) -> None:
    print(f"link traffic failed: {args.exc_type.__name__}: {args.exc_value}", file=sys.stderr, flush=True)
    os._exit(1)


def main(argv: list[str] | None = None) -> None:
    """Listen, connect, report, then move bytes until stopped."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rcvbuf", type=int, required=True, help="receive buffer of each accepted stream, bytes")
    parser.add_argument("--listen", help="ADDR:PORT:COUNT: accept COUNT streams and discard their bytes")
    parser.add_argument("--send", help="ADDR:PORT: send to it as fast as the link allows")
    args = parser.parse_args(argv)
    threading.excepthook = _fail
    if args.listen:
        _listen(args.listen, args.rcvbuf)
    print("ready", flush=True)
    if args.send:
        threading.Thread(target=_send, args=(_connect(args.send),), daemon=True).start()
    print("sending", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main(sys.argv[1:])
