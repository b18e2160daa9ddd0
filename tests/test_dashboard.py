"""optuna-dashboard serves the studies loadertune writes: a real search into the default study
store, the dashboard started on a loopback port against it, its API asked for the studies and
the trials."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import optuna
import pytest

from loadertune import tune_loader
from loadertune.search import default_storage

from workloads import SleepDataset

pytest.importorskip("optuna_dashboard", reason="optuna-dashboard is not installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


@pytest.mark.slow
def test_the_dashboard_lists_a_loadertune_study_and_its_trials() -> None:
    rec = tune_loader(
        SleepDataset(n=8000, sleep_s=0.0003),
        batch_size=32,
        budget_s=8,
        window_s=0.3,
        seed=0,
        resume=False,
        verbose=False,
    )
    storage = default_storage()  # what `loadertune search` uses when --storage is not given
    assert rec.search["storage"] == storage
    name = rec.search["study_name"]
    n_trials = len(optuna.load_study(study_name=name, storage=storage).trials)
    assert n_trials > 0

    exe = shutil.which("optuna-dashboard", path=os.path.dirname(sys.executable))
    assert exe, "optuna_dashboard is installed but its command is not beside this Python"
    port = _free_port()
    server = subprocess.Popen(
        [exe, storage, "--host", "127.0.0.1", "--port", str(port), "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                studies = _get(f"http://127.0.0.1:{port}/api/studies")["study_summaries"]
                break
            except (urllib.error.URLError, ConnectionError):
                if server.poll() is not None or time.monotonic() > deadline:
                    out = server.stdout.read() if server.stdout else ""
                    pytest.fail(f"optuna-dashboard did not answer: {out[-2000:]}")
                time.sleep(0.3)
        ours = [s for s in studies if s["study_name"] == name]
        assert len(ours) == 1, [s["study_name"] for s in studies]
        attrs = {a["key"] for a in ours[0]["user_attrs"]}
        assert {"space", "estimates", "baseline"} <= attrs  # what loadertune stores with it
        detail = _get(f"http://127.0.0.1:{port}/api/studies/{ours[0]['study_id']}")
        assert len(detail["trials"]) == n_trials
        phases = {
            a["value"] for t in detail["trials"] for a in t["user_attrs"] if a["key"] == "phase"
        }
        assert "search" in phases or "probe" in phases or "baseline" in phases
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        if server.stdout:
            server.stdout.close()
    assert Path(storage.removeprefix("sqlite:///")).exists()
