"""The fork server: launches forked from one process that imported torch (and the script's
installed packages) once, set up as a fresh trial process would be."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path

import psutil
import pytest

from loadertune.api import tune_script
from loadertune.config import Config
from loadertune.errors import ConfigError
from loadertune.search import SearchSettings
from loadertune.trials import Limits, window_for
from loadertune.trials.script.forkserver import ForkServer, _unsafe_to_fork, installed_imports
from loadertune.trials.script.runner import ScriptRunner

SCRIPTS = Path(__file__).parent / "scripts"
LIMITS = Limits(timeout_s=60, startup_s=30, hang_s=5)


def _run(runner: ScriptRunner, config: Config | None):
    window = window_for(config or Config(16), window_s=0.3)
    result = runner.run(config, window=window, limits=LIMITS)
    assert result.ok, result.failure
    return result


def _facts(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_installed_imports_are_the_scripts_installed_packages_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mymodule.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # found, but the user's own: never preloaded
    script = tmp_path / "train.py"
    script.write_text(
        "import os, json\n"
        "import torch.nn as nn\n"
        "from mymodule import x\n"
        "from . import sibling\n"
        "try:\n    import numpy as np\nexcept ImportError:\n    np = None\n"
        "if True:\n    from click import echo\n"
        "def later():\n    import rich\n"
        "import not_a_package_anywhere\n"
    )
    assert installed_imports(script) == ["torch", "numpy", "click"]
    assert installed_imports(tmp_path / "missing.py") == []


def test_a_thread_an_import_started_makes_forking_unsafe() -> None:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="started-by-an-import")
    thread.start()
    try:
        why = _unsafe_to_fork(cuda_mapped_before=False)
    finally:
        stop.set()
        thread.join()
    assert why is not None and "started-by-an-import" in why


@pytest.mark.slow
@pytest.mark.parametrize("fork_server", [True, False])
def test_a_forked_launch_looks_to_the_script_as_a_fresh_one(
    fork_server: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each launch is a fork of the server (or, without it, a child of this process), and the
    script sees what `python script.py ARGS` would show it: its name, its argv, the environment,
    no standard input, and draws of `random` and numpy that differ from launch to launch."""
    monkeypatch.setenv("PROCESS_FACTS_MARKER", "seen")
    out = tmp_path / "facts.jsonl"
    runner = ScriptRunner(
        SCRIPTS / "process_facts.py", [str(out)], loader=1, fork_server=fork_server
    )
    try:
        _run(runner, None)
        _run(runner, Config(16, 1, 2))
        runner._end_launch()
        _run(runner, Config(16, 2, 2))
        server = runner._server
        assert runner.n_launches == 2
        assert (server is not None and server.n_forks == 2) == fork_server
        parent = server.proc.pid if server is not None else os.getpid()
        log = (Path(runner._logdir.name) / "launch-2.log").read_text()
    finally:
        runner.close()
    facts = _facts(out)
    assert len(facts) == 2  # one per launch: the hot swap ran the second setting in the first
    assert [f["ppid"] for f in facts] == [parent, parent]
    for f in facts:
        assert f["name"] == "__main__"
        assert f["argv"] == [str(SCRIPTS / "process_facts.py"), str(out)]
        assert f["marker"] == "seen" and f["stdin_closed"]
    assert facts[0]["random"] != facts[1]["random"]
    assert facts[0]["numpy"] != facts[1]["numpy"]
    assert "process_facts: started" in log


@pytest.mark.slow
def test_a_dead_server_costs_no_trial_the_next_launch_starts_afresh(tmp_path: Path) -> None:
    out = tmp_path / "facts.jsonl"
    runner = ScriptRunner(SCRIPTS / "process_facts.py", [str(out)], loader=1, fork_server=True)
    try:
        _run(runner, None)
        server = runner._server
        assert server is not None and server.n_forks == 1
        os.killpg(server.proc.pid, signal.SIGKILL)  # its fork, the launch, dies with it
        assert runner._launch is not None and runner._launch.proc.wait(timeout=10) == -9
        _run(runner, Config(16, 1, 2))
        # once without the script's packages, then (that server gone too) fresh processes
        assert runner._server is not None and runner._server.preload is None
        os.killpg(runner._server.proc.pid, signal.SIGKILL)
        assert runner._launch is not None and runner._launch.proc.wait(timeout=10) == -9
        _run(runner, Config(16, 2, 2))
        assert runner.n_launches == 3
    finally:
        runner.close()
    facts = _facts(out)
    assert len(facts) == 3
    assert facts[2]["ppid"] == os.getpid()  # no server left: a fresh process


@pytest.mark.slow
def test_a_preload_that_starts_a_thread_falls_back_to_torch_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A package whose import starts a thread (a fork would inherit its locks held): the server
    refuses to fork after preloading it, and a server with torch alone takes over."""
    packages = tmp_path / "site-packages"
    packages.mkdir()
    (packages / "starts_a_thread.py").write_text(
        "import threading\nthreading.Thread(target=threading.Event().wait, daemon=True).start()\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(packages), *sys.path]))
    monkeypatch.syspath_prepend(str(packages))
    script = tmp_path / "train.py"
    script.write_text("import starts_a_thread\n" + (SCRIPTS / "process_facts.py").read_text())
    (tmp_path / "_data.py").write_text((SCRIPTS / "_data.py").read_text())
    out = tmp_path / "facts.jsonl"
    runner = ScriptRunner(script, [str(out)], loader=1, fork_server=True)
    try:
        _run(runner, None)  # the preloading server refused: a fresh process ran it
        runner._end_launch()
        _run(runner, Config(16, 1, 2))
        server = runner._server
        assert server is not None and server.preload is None and server.n_forks == 1
        server_log = (Path(runner._logdir.name) / "forkserver-1.log").read_text()
    finally:
        runner.close()
    facts = _facts(out)
    assert [f["ppid"] for f in facts] == [os.getpid(), server.proc.pid]
    assert "cannot fork after the preload: an import started a thread" in server_log


@pytest.mark.slow
def test_a_trial_that_dies_with_its_server_says_so(tmp_path: Path) -> None:
    """The fork dies of its parent-death signal (SIGKILL) when the server ends mid-trial; that
    is not the out-of-memory killer's doing, and the trial's cause names the server instead.
    The search goes on: the next launch starts afresh."""
    runner = ScriptRunner(SCRIPTS / "slow_samples.py", [], loader=1, fork_server=True)
    try:
        _run(runner, None)  # the server is up, and the script's loader is known
        server = runner._server
        assert server is not None
        timer = threading.Timer(2.0, os.kill, (server.proc.pid, signal.SIGTERM))
        timer.start()
        config = Config(8, 2, 2)
        result = runner.run(config, window=window_for(config, window_s=30.0), limits=LIMITS)
        timer.join()
        assert not result.ok
        assert result.failure is not None and result.failure.kind == "trial_crashed"
        assert "fork server" in result.failure.message and "SIGTERM" in result.failure.message
        _run(runner, Config(8, 1, 2))
    finally:
        runner.close()


def test_tune_script_starts_the_server_before_the_search_and_a_bad_setting_leaves_none() -> None:
    """``tune_script`` starts the fork server before the search sets up (its imports overlap
    the study's creation); a setting rejected meanwhile closes it: no process is left."""
    started: list[ForkServer] = []
    original = ScriptRunner.start_server

    def spy(self: ScriptRunner) -> None:
        original(self)
        assert self._server is not None and self._server.alive
        started.append(self._server)

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ScriptRunner, "start_server", spy)
        with pytest.raises(ConfigError, match="max_workers"):
            tune_script(
                SCRIPTS / "process_facts.py",
                ["/dev/null"],
                settings=SearchSettings(max_workers=10**6),
            )
    assert len(started) == 1 and started[0].proc.poll() is not None  # started, then stopped
    left = {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert not {pid for pid in left if psutil.pid_exists(pid)}
