"""A trial's killed workers leave nothing behind, in /dev/shm or in /tmp
(loadertune.trials.leftovers)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from loadertune.trials import leftovers
from loadertune.trials.inline import kill_new_children
from loadertune.trials.script.processes import group_members, kill_group

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not leftovers.SHM_DIR.is_dir(), reason="no /dev/shm on this system"),
]

# What a worker killed between torch's create and unlink leaves: a file named after itself.
LEAVES_A_FILE = """
import os, subprocess, sys, time
def leave():
    with open(f"/dev/shm/torch_{os.getpid()}_{sys.argv[1]}_0", "wb") as f:
        f.write(b"x" * 4096)
if len(sys.argv) > 2:  # the trial process starts a "worker" in its group, then leaves its own
    subprocess.Popen([sys.executable, __file__, sys.argv[1]])
leave()
print("ready", flush=True)
time.sleep(60)
"""


def _files(pid: int) -> list[Path]:
    return sorted(leftovers.SHM_DIR.glob(f"torch_{pid}_*"))


def test_kill_group_removes_its_dead_processes_files_and_no_one_elses(tmp_path: Path) -> None:
    script = tmp_path / "leaves.py"
    script.write_text(LEAVES_A_FILE)
    tag = str(time.monotonic_ns())
    group = subprocess.Popen(
        [sys.executable, str(script), tag, "with-worker"],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    bystander = subprocess.Popen([sys.executable, str(script), tag], stdout=subprocess.PIPE)
    try:
        assert group.stdout is not None and bystander.stdout is not None
        assert group.stdout.readline() and bystander.stdout.readline()
        deadline = time.monotonic() + 30
        while len(set(group_members(group.pid))) < 2 or not all(
            _files(p) for p in set(group_members(group.pid))
        ):
            assert time.monotonic() < deadline, "the group's worker never wrote its file"
            time.sleep(0.05)
        members = set(group_members(group.pid))
        assert kill_group(group.pid) == 0
        group.wait(timeout=10)
        assert all(not _files(pid) for pid in members), "a killed process's file is left"
        assert _files(bystander.pid), "a live process outside the group lost its file"
    finally:
        bystander.kill()
        bystander.wait()
        group.kill()
        group.wait()
        for f in _files(bystander.pid):
            f.unlink()


def test_a_real_loader_killed_mid_batch_leaves_no_shared_memory(short_temp: Path) -> None:
    """The leak itself, with torch's own shared memory: a loader making 16-MB batches, its
    group SIGKILLed five times at different points of a batch. With one ``killpg`` about half
    the kills left a file (``scripts/bench_shm_leftovers.py``); ``kill_group`` must leave none."""
    child = (
        "import torch\n"
        "from torch.utils.data import DataLoader, Dataset\n"
        "class Big(Dataset):\n"
        "    def __len__(self): return 10**6\n"
        "    def __getitem__(self, i): return torch.zeros(2**18)\n"
        "print('ready', flush=True)\n"
        "for _ in DataLoader(Big(), batch_size=16, num_workers=2, prefetch_factor=4): pass\n"
    )
    left: list[Path] = []
    for i in range(5):
        proc = subprocess.Popen(
            [sys.executable, "-c", child],
            stdout=subprocess.PIPE,
            start_new_session=True,
            env={**os.environ, "TMPDIR": str(short_temp)},
        )
        assert proc.stdout is not None and proc.stdout.readline()
        time.sleep(1.0 + i * 0.053)
        members = set(group_members(proc.pid))
        assert len(members) == 3, "the loader's workers are not running"
        kill_group(proc.pid)
        proc.wait(timeout=10)
        time.sleep(0.2)
        left += [f for pid in members for f in _files(pid)]
        leftovers.remove_leftovers(members)  # one leak must not fill /dev/shm for the rest
    assert not left, f"killed workers left shared memory: {left}"


def test_children_killed_in_process_leave_no_file() -> None:
    """An in-process trial's workers are this process's children (kill_new_children)."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in "ab"]
    for kid in kids:  # as if each was killed between torch's create and unlink
        (leftovers.SHM_DIR / f"torch_{kid.pid}_{time.monotonic_ns()}_0").write_bytes(b"x" * 4096)
    try:
        assert kill_new_children(before) == 2
        assert all(not _files(kid.pid) for kid in kids)
    finally:
        for kid in kids:
            kid.kill()
            kid.wait()
            for f in _files(kid.pid):
                f.unlink()


# A trial process: starts a "worker" (which leaves a file named after itself) at once, and
# another each time a line comes on stdin; prints each worker's pid.
TRIAL = """
import subprocess, sys
leave = "import os, time; open(f'/dev/shm/torch_{os.getpid()}_%s_0', 'wb').write(b'x'); "
leave += "print('ok', flush=True); time.sleep(60)"
def worker():
    w = subprocess.Popen([sys.executable, "-c", leave % sys.argv[1]], stdout=subprocess.PIPE)
    w.stdout.readline()
    print(w.pid, flush=True)
    return w
kept = [worker()]
for _ in sys.stdin:
    kept.append(worker())
"""


def test_a_worker_killed_during_a_trial_leaves_no_file_but_older_processes_keep_theirs() -> None:
    """The OOM killer ends a worker mid-batch, not loadertune: the supervisor removes what the
    trial's dead processes left when the trial ends, and leaves alone those of processes that
    were there before the trial (a user's own, in an in-process trial)."""
    from loadertune.trials.contract import Limits
    from loadertune.trials.supervisor import Supervisor

    tag = str(time.monotonic_ns())
    trial = subprocess.Popen(
        [sys.executable, "-c", TRIAL, tag],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert trial.stdin is not None and trial.stdout is not None
    try:
        older = int(trial.stdout.readline())
        with Supervisor(trial.pid, limits=Limits(timeout_s=60, startup_s=30, hang_s=5)) as sup:
            trial.stdin.write("\n")
            trial.stdin.flush()
            worker = int(trial.stdout.readline())
            sup.sampler.window_started()  # the sampler looks at the tree
            deadline = time.monotonic() + 10
            while worker not in sup.sampler.seen_pids:
                assert time.monotonic() < deadline, "the sampler never saw the worker"
                time.sleep(0.05)
            for pid in (older, worker):  # both die during the trial, as the OOM killer does
                psutil.Process(pid).kill()
            deadline = time.monotonic() + 10
            while not all(leftovers._dead(pid) for pid in (older, worker)):
                assert time.monotonic() < deadline
                time.sleep(0.05)
        assert not _files(worker), "the trial's killed worker left its file"
        assert _files(older), "a process older than the trial lost its file"
    finally:
        kill_group(trial.pid)
        trial.wait()
        for f in _files(older):
            f.unlink()


SPAWNED = """
import torch
from torch.utils.data import DataLoader, Dataset
class D(Dataset):
    def __len__(self): return 10**6
    def __getitem__(self, i): return torch.zeros(10)
if __name__ == "__main__":
    it = iter(DataLoader(D(), batch_size=4, num_workers=2, multiprocessing_context="spawn"))
    next(it)
    print("ready", flush=True)
    for _ in it: pass
"""


def test_a_spawn_context_loaders_semaphores_are_unlinked_when_its_group_is_killed(
    tmp_path: Path, short_temp: Path
) -> None:
    """Its queues' named semaphores are unlinked only by multiprocessing's resource tracker,
    which kill_group leaves to the last, so that it cleans up after the others (it left 14 per
    killed group)."""
    script = tmp_path / "spawned.py"
    script.write_text(SPAWNED)
    before = set(leftovers.SHM_DIR.glob("sem.*"))
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        start_new_session=True,
        env={**os.environ, "TMPDIR": str(short_temp)},
    )
    assert proc.stdout is not None and proc.stdout.readline()
    assert any(
        "multiprocessing.resource_tracker" in " ".join(psutil.Process(pid).cmdline())
        for pid in group_members(proc.pid)
    ), "no resource tracker in the group: the test tests nothing"
    assert kill_group(proc.pid) == 0
    proc.wait(timeout=10)
    left = set(leftovers.SHM_DIR.glob("sem.*")) - before
    for f in left:
        f.unlink()
    assert not left, f"semaphores left: {sorted(left)}"


# An in-process trial of a loader with three workers, in a process whose temporary folder is
# the test's; what it leaves there is listed after it ends. With "hang", its samples hang after
# the first thousands: the trial kills its workers.
IN_PROCESS_TRIAL = """
import sys, time
import torch
from torch.utils.data import Dataset
from loadertune.config import Config
from loadertune.trials import Limits, window_for
from loadertune.trials.inline import InlineRunner
HANG = sys.argv[1:] == ["hang"]
class Rows(Dataset):
    def __len__(self): return 10**6
    def __getitem__(self, i):
        if HANG and i > 3000:
            time.sleep(3600)
        return torch.randn(64)
runner = InlineRunner(Rows())
config = Config(32, 3, 2)
limits = Limits(timeout_s=60, startup_s=30, hang_s=2)
result = runner.run(config, window=window_for(config, window_s=30 if HANG else 0.3), limits=limits)
runner.close()
assert (result.failure is not None) == HANG, result.failure
"""


def _temp_leftovers(folder: Path) -> list[str]:
    return sorted(
        p.name
        for p in folder.iterdir()
        if p.name.startswith(("pymp-", leftovers.TEMP_PREFIX, leftovers.LOG_PREFIX))
    )


def test_a_trials_killed_workers_leave_no_temporary_folder() -> None:
    """Each worker hands its batches over through a socket in a folder of /tmp made on its first
    batch; a trial that kills its workers (here: they hang) left one such folder each (31,766 on
    this machine after a day): the trial removes them."""
    folder = Path(tempfile.mkdtemp(prefix="lt-"))  # short: see the next test
    try:
        env = {**os.environ, "TMPDIR": str(folder)}
        done = subprocess.run(
            [sys.executable, "-c", IN_PROCESS_TRIAL, "hang"],
            env=env,
            capture_output=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        assert _temp_leftovers(folder) == []
    finally:
        shutil.rmtree(folder)


def test_a_long_temporary_folder_is_not_nested() -> None:
    """A socket's path has a limit (107 bytes): under a $TMPDIR of 70 characters, where
    multiprocessing's own socket fits, one folder more left the workers no socket to hand a
    batch over through, and the trial timed out."""
    folder = Path(tempfile.mkdtemp(prefix="lt-"))
    try:
        long = folder / ("x" * (70 - len(str(folder)) - 1))
        long.mkdir()
        assert len(str(long)) + leftovers.SOCKET_NAME_LEN <= leftovers.SOCKET_PATH_MAX
        env = {**os.environ, "TMPDIR": str(long)}
        done = subprocess.run(
            [sys.executable, "-c", IN_PROCESS_TRIAL], env=env, capture_output=True, timeout=120
        )
        assert done.returncode == 0, done.stderr.decode()[-2000:]
    finally:
        shutil.rmtree(folder)


# A trial process that made its folder, started a "worker" in its group, and ended by itself.
ENDS_LEAVING_A_WORKER = """
import os, subprocess, sys
os.makedirs(os.path.join(sys.argv[1], f"loadertune-mp-{os.getpid()}-abc", "pymp-x"))
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
"""


def test_a_group_whose_leader_ended_and_was_reaped_loses_its_folder_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trial process that ends by itself (its script ran out of epochs) is reaped at once and
    no longer listed in its group; killing the group still removes the folder named after it
    (its workers' sockets are made there, so its own exit may not have emptied it)."""
    leader = subprocess.Popen(
        [sys.executable, "-c", ENDS_LEAVING_A_WORKER, str(tmp_path)], start_new_session=True
    )
    try:
        leader.wait(timeout=30)
        assert _temp_leftovers(tmp_path) == [f"{leftovers.TEMP_PREFIX}{leader.pid}-abc"]
        assert leader.pid not in group_members(leader.pid) and group_members(leader.pid)
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
        assert kill_group(leader.pid) == 0
        assert _temp_leftovers(tmp_path) == []
    finally:
        kill_group(leader.pid)


def test_only_dead_processes_temporary_folders_are_removed(tmp_path: Path) -> None:
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        for pid in (alive.pid, dead.pid):
            (tmp_path / f"{leftovers.TEMP_PREFIX}{pid}-abc" / "pymp-x").mkdir(parents=True)
        (tmp_path / f"pymp-{dead.pid}").mkdir()  # not one of loadertune's names: not touched
        leftovers.remove_leftovers([alive.pid, dead.pid], temp=tmp_path)
        assert _temp_leftovers(tmp_path) == [
            f"{leftovers.TEMP_PREFIX}{alive.pid}-abc",
            f"pymp-{dead.pid}",
        ]
    finally:
        alive.kill()
        alive.wait()


def test_the_sweep_removes_this_users_folders_of_processes_that_are_gone(tmp_path: Path) -> None:
    """What a SIGKILLed search left (nobody was there to remove it) goes when the next one
    starts: folders named after processes that no longer exist; a live one's stay, and so do
    names that are not loadertune's and files that are not folders."""
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        for prefix in (leftovers.TEMP_PREFIX, leftovers.LOG_PREFIX):
            for pid in (alive.pid, dead.pid):
                (tmp_path / f"{prefix}{pid}-abc" / "pymp-x").mkdir(parents=True)
        (tmp_path / f"pymp-{dead.pid}").mkdir()
        (tmp_path / f"{leftovers.TEMP_PREFIX}{dead.pid}-file").write_text("")
        (tmp_path / f"{leftovers.TEMP_PREFIX}x-abc").mkdir()
        assert leftovers.sweep(tmp_path) == 2
        assert _temp_leftovers(tmp_path) == [
            f"{leftovers.LOG_PREFIX}{alive.pid}-abc",
            f"{leftovers.TEMP_PREFIX}{alive.pid}-abc",
            f"{leftovers.TEMP_PREFIX}{dead.pid}-file",
            f"{leftovers.TEMP_PREFIX}x-abc",
            f"pymp-{dead.pid}",
        ]
    finally:
        alive.kill()
        alive.wait()


def _left_by_a_killed_process(folder: Path) -> Path:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = folder / f"{leftovers.TEMP_PREFIX}{dead.pid}-abc"
    (left / "pymp-x").mkdir(parents=True)
    return left


def test_a_search_and_a_run_sweep_as_they_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tune_loader (every search goes through run_search) and `loadertune run` (through
    run_patched) each remove what a killed one left."""
    from loadertune import tune_loader
    from loadertune.api.saved import run_script

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    left = _left_by_a_killed_process(tmp_path)
    tune_loader([float(i) for i in range(64)], n_trials=1, budget_s=5, verbose=False, resume=False)
    assert not left.exists()
    left = _left_by_a_killed_process(tmp_path)
    script = tmp_path / "train.py"
    script.write_text("print('trained')\n")
    assert run_script(script, path=tmp_path / "none.json", report=lambda line: None) == 0
    assert not left.exists()


def test_a_script_search_leaves_no_temporary_folder(tmp_path: Path) -> None:
    """A script's trial processes and their workers are killed with their group at each
    launch's end: what multiprocessing made for them in /tmp goes with them (112 folders were
    left by this search before)."""
    script = Path(__file__).parent / "scripts" / "slow_samples.py"
    folder = Path(tempfile.mkdtemp(prefix="lt-"))  # short (a socket's path is short)
    try:
        env = {**os.environ, "TMPDIR": str(folder)}
        args = ["search", str(script), "--out", str(tmp_path / "rec.json"), "--budget", "25"]
        args += ["--window", "0.3", "--storage", f"sqlite:///{tmp_path}/s.db", "--fresh"]
        done = subprocess.run(
            [sys.executable, "-m", "loadertune", *args, "--json"],
            env=env,
            capture_output=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        trials = json.loads(done.stdout)["trials"]
        assert any(t["params"]["num_workers"] and t["status"] == "ok" for t in trials)
        assert _temp_leftovers(folder) == []
    finally:
        shutil.rmtree(folder)
