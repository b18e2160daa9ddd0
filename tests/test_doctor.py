"""``loadertune doctor`` under real conditions: each one is made real for a child process (a
small /dev/shm in its own mount namespace, a low open-file limit, one CPU of affinity, a cgroup
CPU quota, thread variables), and the doctor run in it must report it with its fix."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

DOCTOR = [sys.executable, "-m", "loadertune", "doctor"]


def run(
    argv: list[str],
    *,
    preexec: Callable[[], None] | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=preexec,
        env=env,
        cwd=Path(__file__).parent.parent,
    )


def findings(proc: subprocess.CompletedProcess[str]) -> dict[str, dict]:
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {f["topic"]: f for f in json.loads(proc.stdout)["findings"]}


def test_this_machine_as_it_is() -> None:
    found = findings(run([*DOCTOR, "--json"]))
    assert found["torch internals"]["level"] == "ok"
    assert {"/dev/shm", "open files", "start method", "threads"} <= set(found)
    text = run(DOCTOR)
    assert text.returncode == 0
    assert text.stdout.startswith("loadertune doctor: ")


def test_a_small_dev_shm_in_a_mount_namespace() -> None:
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    probe = run(["unshare", "-m", "true"])
    if probe.returncode != 0:
        pytest.skip(f"no new mount namespace here: {probe.stderr.strip()}")
    # Docker's default is 64 MiB; this is smaller still. The mount is private to the child.
    script = "mount -t tmpfs -o size=16m tmpfs /dev/shm && exec " + " ".join(DOCTOR)
    proc = run(["unshare", "-m", "sh", "-c", script])
    if proc.returncode != 0 and "mount" in proc.stderr:
        pytest.skip(f"cannot mount a tmpfs: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if "/dev/shm" in x and "problem" in x)
    assert "16 MiB" in line and "Docker's default is 64 MiB" in line and "Bus error" in line
    assert "fix: give the container more: docker run --shm-size=8g" in proc.stdout
    assert shutil.disk_usage("/dev/shm").total > 16 * 2**20, "the test's own /dev/shm changed"


def test_a_low_open_file_limit() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    proc = run(
        [*DOCTOR, "--json"],
        preexec=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard)),
    )
    f = findings(proc)["open files"]
    assert f["level"] == "problem"
    assert f["measured"].startswith("ulimit -n is 256") and "Too many open files" in f["measured"]
    assert "ulimit -n" in f["fix"] and "set_sharing_strategy('file_system')" in f["fix"]


@pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to restrict the affinity to one"
)
def test_a_restricted_cpu_affinity() -> None:
    proc = run([*DOCTOR, "--json"], preexec=lambda: os.sched_setaffinity(0, {0}))
    f = findings(proc)["CPU affinity"]
    assert f["level"] == "problem"
    assert f"1 of the machine's {os.cpu_count()} CPUs (CPU 0)" in f["measured"]
    assert "taskset" in f["fix"] and "fit 1 CPU(s)" in f["fix"]
    assert json.loads(proc.stdout)["hardware"]["usable_cpus"] == 1


def test_a_cgroup_cpu_quota() -> None:
    """A real cgroup (v1 cpu controller) with half a CPU's quota, the child moved into it."""
    base = Path("/sys/fs/cgroup/cpu")
    if not (base / "cpu.cfs_quota_us").exists() or not os.access(base, os.W_OK):
        pytest.skip("no writable cgroup v1 cpu controller here")
    group = base / f"loadertune-test-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text("50000")
    except OSError as exc:
        pytest.skip(f"cannot create a cgroup: {exc}")
    try:
        proc = run(
            [*DOCTOR, "--json"],
            preexec=lambda: (group / "cgroup.procs").write_text(str(os.getpid())),
        )
        f = findings(proc)["CPU quota"]
    finally:
        group.rmdir()  # empty again: the child has exited
    assert f["level"] == "problem"
    assert f"allows 0.5 CPUs' worth of time of the machine's {os.cpu_count()}" in f["measured"]
    assert "docker run --cpus" in f["fix"]


def test_thread_variables() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    unset = findings(run([*DOCTOR, "--json"], env=env))["threads"]
    if len(os.sched_getaffinity(0)) > 1:
        assert unset["level"] == "note" and "OMP_NUM_THREADS" in unset["measured"]
        assert "export OMP_NUM_THREADS=" in unset["fix"]
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    assert findings(run([*DOCTOR, "--json"], env=env))["threads"]["level"] == "ok"
