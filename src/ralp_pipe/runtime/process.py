"""Starting, watching and stopping child processes: the one place ralp-pipe does it.

Every child starts in a session (process group) of its own, with stdin closed, and receives
SIGKILL when the process that started it dies (``PR_SET_PDEATHSIG``), so a killed driver never
leaves ranks, probes or shard workers running. A child is either a command (:func:`start`) or a
Python function forked from a server that imported the modules it needs once
(:func:`start_forked`; the ranks of a run: importing torch and torchvision costs each
interpreter seconds of CPU, paid once instead of once per rank). Where the starting process runs
no other Python thread, the server is a fork of it, so a command that imported the ranks' modules
itself imports them once, not again in a server. A forked child dies with the server, which exits
when the process that started it does. :func:`stop` ends a child's whole group
(SIGTERM, then SIGKILL after a grace period); :func:`supervise` waits for a set of children and
stops all of them at the first failure or at the deadline, naming the child that failed first.
Only processes started here are ever signalled, by PID.
"""

from __future__ import annotations

import ctypes
import gc
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import multiprocessing.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Mapping, NoReturn, Sequence

from ralp_pipe.errors import RunFailure
from ralp_pipe.runtime import cgroup

GRACE_S = 5.0  # between SIGTERM and SIGKILL
SETTLE_S = 1.0  # after a first failure, time for the others failing of the same cause to exit
POLL_S = 0.02
_PR_SET_PDEATHSIG = 1

Process = subprocess.Popen[bytes]
_FORKSERVER = multiprocessing.get_context("forkserver")
DEFERRED = (signal.SIGINT, signal.SIGTERM)  # noted by signals_deferred while children are started


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on `host` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def die_with_parent(parent: int | None = None) -> None:
    """In a child (before exec, or as a pool initializer): get SIGKILL when the parent dies.

    `parent` is the PID the child must still have as its parent (default: its parent now);
    a child whose parent is already gone exits at once.
    """
    parent = os.getppid() if parent is None else parent
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def start(
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    stdout: int | IO[bytes] | None = None,
    stderr: int | IO[bytes] | None = None,
) -> Process:
    """Start `argv` in a session of its own, tied to this process's life (`env` replaces the environment)."""
    return subprocess.Popen(
        list(argv),
        env=None if env is None else dict(env),
        stdout=stdout,
        stderr=stderr,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=die_with_parent,
    )


def start_logged(argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None) -> Process:
    """:func:`start` with stdout and stderr written to `log`."""
    with open(log, "wb") as out:
        return start(argv, env, stdout=out, stderr=subprocess.STDOUT)


class Forked:
    """A child forked by :func:`start_forked`, seen through the part of Popen's interface used here."""

    def __init__(self, process: multiprocessing.process.BaseProcess) -> None:
        self._process = process

    @property
    def pid(self) -> int:
        assert self._process.pid is not None  # started
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        """The exit status (negative: killed by that signal), None while it runs."""
        return self._process.exitcode


Child = Process | Forked


def start_fork_server(preload: Sequence[str]) -> None:
    """Start the server :func:`start_forked` forks from, importing `preload`, now (a no-op once it runs).

    Where this process runs no other Python thread the server is a fork of it (:func:`_fork_server_here`): what
    this process imported, `preload` among them, it has already. Otherwise (a fork would copy a lock another
    thread may hold) it is a fresh interpreter importing `preload` beside this process. It starts with SIGINT
    and SIGTERM blocked (:func:`stops_blocked`), so a Ctrl-C reaching the whole process group while it imports
    `preload` stops the driver alone instead of printing the server's KeyboardInterrupt; :func:`_forked_child`
    unblocks them in each child.
    """
    _FORKSERVER.set_forkserver_preload(list(preload))
    multiprocessing.resource_tracker.ensure_running()  # first: it unblocks both signals once its own process runs
    server: Any = multiprocessing.forkserver._forkserver  # private: its address, alive pipe and PID
    with stops_blocked():
        if server._forkserver_pid is None and threading.active_count() == 1:
            _fork_server_here(server, list(preload))
        else:
            multiprocessing.forkserver.ensure_running()


def _fork_server_here(server: Any, preload: list[str]) -> None:
    """Start multiprocessing's fork server `server` as a fork of this process: as its ``ensure_running`` starts
    one, with ``os.fork`` in place of a fresh interpreter."""
    address = multiprocessing.connection.arbitrary_address("AF_UNIX")  # type: ignore[attr-defined]
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(address)
        if not multiprocessing.util.is_abstract_socket_namespace(address):
            os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()  # every client holds its write end: at EOF the server exits
        sys.stdout.flush()  # else the server's children would write this process's pending output again
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _serve(listener.fileno(), alive_r, alive_w, preload)
        os.close(alive_r)
    server._forkserver_address, server._forkserver_alive_fd, server._forkserver_pid = address, alive_w, pid


def _serve(listener: int, alive_r: int, alive_w: int, preload: list[str]) -> NoReturn:
    """The forked server: the stops and hooks a fresh interpreter has (its children inherit them), then
    multiprocessing's server loop, which ends when the last client is gone."""
    status = 1
    try:
        os.close(alive_w)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        sys.unraisablehook = sys.__unraisablehook__
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__  # a child's output goes to its log's descriptors
        multiprocessing.forkserver.main(listener, alive_r, preload)
    except SystemExit:  # its clients are gone
        status = 0
    finally:
        os._exit(status)


def start_forked(target: Callable[..., None], args: tuple[Any, ...], log: Path, preload: Sequence[str]) -> Forked:
    """Run ``target(*args)`` in a child forked from the server that imported `preload`; its output goes to `log`.

    The server starts, importing `preload`, on the first call of this process; `target` and
    `args` must be picklable. The child's exit status is `target`'s ``SystemExit`` code (1 on an
    exception, whose traceback lands in `log`).
    """
    start_fork_server(preload)  # a no-op once the server runs
    process = _FORKSERVER.Process(target=_forked_child, args=(target, args, str(log)))
    process.start()
    return Forked(process)


@contextmanager
def stops_blocked() -> Iterator[None]:
    """Block SIGINT and SIGTERM in this thread during the block; a stop sent meanwhile arrives at its end.

    A process started in the block inherits the mask (across exec too), as multiprocessing's resource
    tracker is started: a Ctrl-C to the whole process group then reaches only this process, which stops
    its children itself, and never interrupts a child's start-up into a traceback.
    """
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, DEFERRED)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Note SIGINT and SIGTERM during the block and act on the first at its end, so a stop cannot fall between
    starting a child and recording it (Python-level: a signal mask would not hold, another thread may take it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {signum: signal.signal(signum, lambda signum, _frame: caught.append(signum)) for signum in DEFERRED}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if caught:
            signal.raise_signal(caught[0])


def _forked_child(target: Callable[..., None], args: tuple[Any, ...], log: str) -> None:
    """In the forked child: the session, parent-death signal and output a started command gets, then `target`."""
    os.setsid()
    die_with_parent()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, DEFERRED)  # blocked in the server (start_fork_server)
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError:  # the run was stopped and its log folder removed before this child got going
        os._exit(1)
    # The server hands each child its clients' "alive" pipe. Closed here, the pipe's last writer
    # is the process that started the server: when that dies the server exits, and so does this child.
    server: Any = multiprocessing.forkserver._forkserver  # private: its alive pipe
    if server._forkserver_alive_fd is not None:
        os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None
    for std in (1, 2):
        os.dup2(fd, std)
    os.close(fd)
    # The objects inherited from the server (torch's import: most of the heap) go to the permanent
    # generation, so the child's collections never walk them. Otherwise the first full collection
    # writes to every inherited object's header, copying the whole heap page by page: a ResNet-18
    # allreduce rank spent 0.7 s of CPU in its second step (N=3 at 1 Gbit/s: 5.9 images/s, 9.8 frozen).
    gc.freeze()
    target(*args)


def exit_now(status: int) -> NoReturn:
    """Flush stdout and stderr, then end this process with `status`, without the interpreter's teardown.

    By then every file is closed and every child stopped; the teardown would only unload torch's
    and torchvision's modules (0.8 s of CPU a process), and in a rank run the C++ destructors of
    gloo's threads and DDP's reducer after its group was destroyed, which aborted a finished srun
    rank once ("terminate called without an active exception"). A forked rank ends this way too
    (multiprocessing's ``os._exit``).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def stop(procs: Sequence[Child], grace: float = GRACE_S) -> None:
    """SIGTERM the process group of every still-running child, SIGKILL whatever is left after `grace`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [p for p in procs if p.poll() is None]
        for proc in alive:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:  # a forked child that has not made its session yet
                try:
                    os.kill(proc.pid, sig)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace
        while any(p.poll() is None for p in alive) and time.monotonic() < deadline:
            time.sleep(POLL_S)


class _Pool(ProcessPoolExecutor):
    """A process pool whose workers never see a Ctrl-C and are killed, their queued work dropped, when its block fails."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """Submit work; the workers this starts have SIGINT and SIGTERM blocked (:func:`stops_blocked`)."""
        with stops_blocked():
            return super().submit(fn, *args, **kwargs)

    def __exit__(self, exc_type: type[BaseException] | None, *rest: Any) -> bool | None:
        if exc_type is None:
            return super().__exit__(exc_type, *rest)
        workers = list((getattr(self, "_processes", None) or {}).values())  # ours: started by this pool
        for worker in workers:
            worker.kill()
        for worker in workers:
            worker.join(GRACE_S)
        # With its workers gone the pool's thread drops the queued work and closes its queues, so their
        # semaphores are released before this process ends (else multiprocessing's resource tracker warns
        # of "leaked semaphore objects" after the command's last line).
        self.shutdown(wait=True, cancel_futures=True)
        return None


def process_pool(workers: int) -> ProcessPoolExecutor:
    """`workers` fresh interpreters (spawned: safe next to threads) that die with this process.

    A failure or interrupt inside the ``with`` block kills the workers at once instead of
    waiting for the work they hold (an interrupted `prepare-shards` exits promptly).
    """
    return _Pool(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=die_with_parent,
        initargs=(os.getpid(),),
    )


def tail(path: Path, lines: int = 25) -> str:
    """The last `lines` lines of a log, or a note saying why there are none."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(log {path} unreadable: {exc.strerror})"
    return "\n".join(text.splitlines()[-lines:]) or f"(log {path} is empty)"


def last_line(path: Path) -> str:
    """The last non-blank line of a log."""
    lines = [line for line in tail(path, 200).splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(empty log)"


def describe_status(code: int | None) -> str:
    """Words for an exit status: killed by which signal, or an error."""
    if code is not None and code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return "raised an error" if code else "ok"


def _exit_order(procs: Sequence[Child], logs: Sequence[Path], seen: dict[int, int]) -> list[int]:
    """Failed children, first to fail first: by the poll that saw them end, then by their log's last write."""

    def written(i: int) -> int:
        try:
            return logs[i].stat().st_mtime_ns
        except OSError:
            return 0

    failed = [i for i, p in enumerate(procs) if p.returncode not in (None, 0)]
    return sorted(failed, key=lambda i: (seen.get(i, 1 << 62), written(i), i))


def supervise(procs: Sequence[Child], logs: Sequence[Path], timeout_s: float, what: str) -> None:
    """Wait for all `procs`; stop them all and raise :class:`RunFailure` at the first failure or the deadline.

    The message names the child that failed first (by time), every failed child's cause (a SIGKILL
    where the OOM killer struck in the children's memory cgroup meanwhile: killed for memory, with
    the cgroup's peak and limit), the ones still running, and ends with the first one's last log lines.
    """
    deadline = time.monotonic() + timeout_s
    memory = cgroup.memory_cgroup()  # the children's: they live in this process's cgroup
    kills_before = memory.oom_kills() if memory else 0
    seen: dict[int, int] = {}
    tick = 0
    try:
        while True:
            tick += 1
            codes = [p.poll() for p in procs]
            for i, code in enumerate(codes):
                if code is not None:
                    seen.setdefault(i, tick)
            if any(c not in (None, 0) for c in codes):
                time.sleep(SETTLE_S)
                codes = [p.poll() for p in procs]
                running = [i for i, c in enumerate(codes) if c is None]
                stop(procs)
                order = _exit_order(procs, logs, seen)
                oom = cgroup.oom_note(memory, kills_before)
                causes = "; ".join(
                    f"{what} {i} exited with status {codes[i]} ({describe_status(codes[i])}"
                    f"{f'; {oom}' if oom and codes[i] == -signal.SIGKILL else ''}): {last_line(logs[i])}"
                    for i in order
                )
                still = f"; stopped {what}s {running}, still running (hung?)" if running else ""
                raise RunFailure(
                    f"{what} {order[0]} failed first: {causes}{still}. Last lines of {logs[order[0]]}:\n"
                    f"{tail(logs[order[0]])}"
                )
            if all(c == 0 for c in codes):
                return
            if time.monotonic() > deadline:
                hung = [i for i, c in enumerate(codes) if c is None]
                stop(procs)
                raise RunFailure(
                    f"{what}s {hung} still running after the {timeout_s:.0f} s limit; stopped them. "
                    f"Last lines of {logs[hung[0]]}:\n{tail(logs[hung[0]])}"
                )
            time.sleep(POLL_S * 5)
    except BaseException:
        stop(procs)
        raise


def wait_all(procs: Sequence[Process], timeout_s: float, fail_fast: bool = True) -> list[int]:
    """Wait for `procs` and return their exit codes; stop the rest on the first failure (if `fail_fast`).

    At the deadline every child still running is stopped and :class:`RunFailure` names them.
    """
    deadline = time.monotonic() + timeout_s
    try:
        while any(p.poll() is None for p in procs):
            if fail_fast and any(p.returncode not in (None, 0) for p in procs):
                stop(procs)
                break
            if time.monotonic() > deadline:
                running = [i for i, p in enumerate(procs) if p.poll() is None]
                stop(procs)
                raise RunFailure(f"processes {running} were still running after {timeout_s:g} s and were stopped")
            time.sleep(POLL_S)
    except BaseException:
        stop(procs)
        raise
    return [int(p.returncode) for p in procs]
