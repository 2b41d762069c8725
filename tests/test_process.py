"""Children forked from the preloaded server: their own session and log, and the exit status a command would give."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ralp_pipe.runtime.process import Forked, start_forked
from support import forked

PRELOAD = ["ralp_pipe.engine.rank"]  # what the ranks' server imports: the first start in a process fixes it


def _wait(child: Forked, timeout_s: float = 120) -> int:
    deadline = time.monotonic() + timeout_s
    while child.poll() is None:
        assert time.monotonic() < deadline, "the forked child never exited"
        time.sleep(0.02)
    assert child.returncode is not None
    return child.returncode


@pytest.mark.parametrize("code", [0, 3])
def test_a_forked_child_has_its_own_session_and_log_and_exits_with_its_status(tmp_path: Path, code: int) -> None:
    log = tmp_path / "child.log"
    child = start_forked(forked.report, (code,), log, PRELOAD)
    assert _wait(child) == code
    pid, session = (int(word) for word in log.read_text().split()[1:4:2])
    assert pid == session == child.pid  # its own session and process group: stop() signals the whole group


def test_an_exception_in_a_forked_child_is_status_1_with_its_traceback_in_the_log(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    assert _wait(start_forked(forked.fail, (), log, PRELOAD)) == 1
    text = log.read_text()
    assert "Traceback" in text and "ValueError: a bad value in the forked child" in text


def test_a_forked_child_never_collects_the_objects_it_inherited_from_the_server(tmp_path: Path) -> None:
    """A full collection over the inherited heap would copy it page by page (copy-on-write) in every rank."""
    log = tmp_path / "child.log"
    assert _wait(start_forked(forked.frozen, (), log, PRELOAD)) == 0
    frozen = int(log.read_text().split()[1])
    # every object the server held: its imports (the first server of a process fixes them: the whole suite
    # shares one) and the interpreter's own, at least thousands; none without the freeze
    assert frozen > 1000, log.read_text()


def test_a_forked_child_takes_sigint_and_sigterm_though_its_server_blocks_them(tmp_path: Path) -> None:
    """The server imports with SIGINT and SIGTERM blocked (a Ctrl-C to the group must not print its traceback);
    its children take them again."""
    log = tmp_path / "child.log"
    assert _wait(start_forked(forked.blocked, (), log, PRELOAD)) == 0
    assert log.read_text().split() == ["blocked"]
