"""Shared fixtures. Every test is checked for processes it left behind."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Studies go to a temporary directory, never to the user's cache."""
    os.environ["LOADERTUNE_CACHE_DIR"] = str(tmp_path_factory.mktemp("loadertune-cache"))


@pytest.fixture(autouse=True, scope="session")
def _sigint_as_in_a_terminal() -> object:
    """A suite started in the background by a shell without job control inherits SIGINT
    ignored, and so would every CLI the tests start (Python keeps an ignored SIGINT ignored):
    the Ctrl-C tests would then test the launcher. Run them as from a terminal."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _descendants() -> dict[int, psutil.Process]:
    """Our descendants, and any process anywhere that carries this session's environment (a
    DataLoader worker whose trial process was killed is re-parented to init, but keeps it)."""
    found = {p.pid: p for p in psutil.Process().children(recursive=True)}
    marker = os.environ.get("LOADERTUNE_CACHE_DIR")
    for p in psutil.process_iter():
        if p.pid == os.getpid() or p.pid in found:
            continue
        try:
            if marker and p.environ().get("LOADERTUNE_CACHE_DIR") == marker:
                found[p.pid] = p
        except psutil.Error:
            pass
    return found


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


@pytest.fixture
def short_temp() -> Iterator[Path]:
    """A temporary folder for a test's child processes to use as theirs ($TMPDIR), removed after
    the test with what they left there (a process the test kills leaves multiprocessing's
    folder): short, since a socket's path there must be."""
    folder = Path(tempfile.mkdtemp(prefix="lt-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def no_leftover_processes() -> object:
    """Fail a test that leaves a child process (a DataLoader worker, a trial) running."""
    before = set(_descendants())
    yield
    from loadertune.measure.resources import multiprocessing_helper

    deadline = time.monotonic() + 5.0  # a worker being reaped may take a moment
    while True:
        left = _alive(
            [
                p
                for pid, p in _descendants().items()
                if pid not in before and not multiprocessing_helper(p)
            ]
        )
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for p in left:  # clean up so one failure does not cascade, then fail
        p.kill()
    assert not left, f"processes outlived the test: {[(p.pid, p.name()) for p in left]}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`gpu` tests need CUDA; skip them cleanly without it."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (run on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
