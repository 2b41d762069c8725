"""The link check's processes inside an emulated host or switch (:mod:`ralp_pipe.runtime.linkcheck`).

Standard library only and run by path (``python link_traffic.py ...``), so one starts in tens of
milliseconds and needs no package on the path. Two commands:

``traffic --rcvbuf BYTES [--listen ADDR:PORT:COUNT] [--send ADDR:PORT]`` accepts COUNT TCP
streams on ADDR:PORT and discards what they carry, and opens one stream to the ``--send``
address (retrying until its listener is up) that sends zeros as fast as the link takes them.
Received streams get a receive buffer of BYTES, which bounds their window; sent ones use Reno
(built into every kernel and allowed without privileges), whose window, with no loss on these
short queues, grows to that bound (BBR would hold it near the bandwidth times the smallest
round trip it saw, below what the other direction's queue needs). It prints ``ready`` once
listening and ``sending`` once connected, then runs until it is stopped; a stream that fails
ends it with status 1 and the error on stderr.

``read DEVICE[,DEVICE...] SECONDS [--at T]`` reads the bytes each DEVICE's root qdisc sent, the
bytes each DEVICE's interface counted as sent and the machine's CPU time (/proc/stat), sleeps
SECONDS and reads them again; it prints both readings as JSON, each with the clock (seconds) just
before and just after it. The qdiscs are read through one ``tc -batch`` started beforehand (one
command for all devices), so a reading takes a fraction of a millisecond instead of a process
start. With ``--at`` the first reading waits for that ``time.monotonic()`` (the same clock in
every namespace), so readers started together in several namespaces measure the same window.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
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


def _traffic(args: argparse.Namespace) -> None:
    """Listen, connect, report, then move bytes until stopped."""
    threading.excepthook = _fail
    if args.listen:
        _listen(args.listen, args.rcvbuf)
    print("ready", flush=True)
    if args.send:
        threading.Thread(target=_send, args=(_connect(args.send),), daemon=True).start()
    print("sending", flush=True)
    threading.Event().wait()


def _sent_bytes(devices: list[str]) -> dict[str, int]:
    """Bytes each of `devices` in this network namespace sent, from /proc/net/dev."""
    sent = {}
    with open("/proc/net/dev") as dev:
        for line in dev:
            name, _, fields = line.partition(":")
            if name.strip() in devices:
                sent[name.strip()] = int(fields.split()[8])
    missing = [device for device in devices if device not in sent]
    if missing:
        raise RuntimeError(f"/proc/net/dev has no {', '.join(missing)}")
    return sent


def _cpu_ticks() -> list[int]:
    """The machine's CPU time so far, in ticks: user, nice, system, idle, iowait, irq, softirq, steal."""
    with open("/proc/stat") as stat:
        return [int(value) for value in stat.readline().split()[1:9]]


def _read(args: argparse.Namespace) -> None:
    """Read the devices' counters twice, `args.seconds` apart, each reading bracketed by the clock."""
    devices = args.devices.split(",")
    tc = subprocess.Popen(
        ["stdbuf", "-oL", "tc", "-s", "-j", "-batch", "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    commands, replies = tc.stdin, tc.stdout
    assert commands is not None and replies is not None

    def read() -> dict[str, object]:
        before = time.perf_counter()
        commands.write("qdisc show\n")
        commands.flush()
        shown = json.loads(replies.readline())
        sent, ticks = _sent_bytes(devices), _cpu_ticks()
        after = time.perf_counter()
        qdisc = {q["dev"]: int(q["bytes"]) for q in shown if q.get("root") and q.get("dev") in devices}
        return {"clock": [before, after], "qdisc": qdisc, "interface": sent, "cpu": ticks}

    read()  # the first command pays for tc's start
    if args.at is not None:
        time.sleep(max(0.0, args.at - time.monotonic()))
    first = read()
    time.sleep(args.seconds)
    second = read()
    commands.close()
    tc.wait()
    print(json.dumps([first, second]))


def main(argv: list[str] | None = None) -> None:
    """Run the command named in `argv`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(required=True)
    traffic = commands.add_parser("traffic", help="TCP streams in and out until stopped")
    traffic.add_argument("--rcvbuf", type=int, required=True, help="receive buffer of each accepted stream, bytes")
    traffic.add_argument("--listen", help="ADDR:PORT:COUNT: accept COUNT streams and discard their bytes")
    traffic.add_argument("--send", help="ADDR:PORT: send to it as fast as the link allows")
    traffic.set_defaults(run=_traffic)
    read = commands.add_parser("read", help="devices' sent bytes (qdisc, interface) and the CPU time, twice")
    read.add_argument("devices", help="DEVICE[,DEVICE...]")
    read.add_argument("seconds", type=float)
    read.add_argument("--at", type=float, help="time.monotonic() at which the first reading is taken")
    read.set_defaults(run=_read)
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main(sys.argv[1:])
