"""Real users' scripts (issue 11): Lightning, Hugging Face Trainer and Accelerate, a loader made
at every epoch (issue 14), each searched and run through the real CLI with the real framework
on the CPU.

Each search must exit 0, tune the training loader (not the validation loader Lightning's sanity
check iterates first), record the user's own line and dataset, and every trial it recorded must
have run its setting: the scripts' collate function writes, from inside the trial process (and
its workers), each batch's length and the worker that made it (``$LOADERTUNE_TEST_LOG``), and
those are checked against each trial's recorded setting. ``run`` must apply the entry to that
loader only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent / "scripts"
pytestmark = pytest.mark.frameworks


def _needs(*modules: str) -> None:
    for module in modules:
        pytest.importorskip(module)


def _cli(args: list[str], tmp_path: Path, *, timeout: float = 300) -> subprocess.CompletedProcess:
    log = tmp_path / "log"
    log.mkdir(exist_ok=True)
    env = {**os.environ, "LOADERTUNE_TEST_LOG": str(log), "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "loadertune", *args],
        cwd=SCRIPTS,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _batches(tmp_path: Path) -> dict[int, list[tuple[int, str]]]:
    """Per training process (pid): (batch length, worker id or "main") of each batch made."""
    seen: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for path in (tmp_path / "log").glob("*.log"):
        for line in path.read_text().splitlines():
            length, worker = line.split()
            seen[int(path.stem)].append((int(length), worker))
    return seen


def search(script: str, tmp_path: Path, *extra: str, budget: int = 40) -> dict:
    out = tmp_path / "rec.json"
    proc = _cli(
        ["search", script, "--budget", str(budget), "--fresh", "--json", "--out", str(out), *extra],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    entry = json.loads(proc.stdout)
    entry["stderr"] = proc.stderr
    return entry


def check_trials_ran_their_settings(
    entry: dict, tmp_path: Path, *, val_batch: int, epoch_samples: int | None = None
) -> int:
    """Every measured trial ran with the batch size and workers it recorded, as the script saw
    it from inside the trial; returns how many trials were checked. The validation loader's
    batches (``val_batch`` samples, made in the main process) are told apart by their size.

    A trial process that ran one setting made only that setting's batches. One that ran several
    in turn (hot-swapped, pruned and failed settings among them) made each recorded one's: its
    batch size from each of its workers that had a batch to make (every epoch hands its batches
    to the workers in turn from the first: with ``epoch_samples``, an epoch of fewer full
    batches than workers leaves the last workers none; 84 workers on 64 batches did)."""
    batches = {
        pid: [(n, worker) for n, worker in made if not (n == val_batch and worker == "main")]
        for pid, made in _batches(tmp_path).items()
    }
    # A replay hands one batch, made in the main process at its batch size, to the step again
    # and again; the process may go on to a setting of the same batch size (on a GPU machine
    # a replay at batch 64 went on to bs=64 w=13, whose process then had one batch of "main").
    for trial in entry["trials"]:
        if trial["phase"] == "replay":
            one = (trial["params"]["batch_size"], "main")
            for pid in trial.get("pids") or []:
                if one in batches.get(pid, []):
                    batches[pid].remove(one)
    measured = [
        t
        for t in entry["trials"]
        if t["status"] == "ok" and t["phase"] != "replay" and t.get("ran")
    ]
    # What each process ran: every trial, pruned, failed and cut ones too (a process whose
    # only measured setting was preceded or followed by another made both's batches; a
    # baseline the search's deadline cut 3 s in had made 191 batches in the process of the
    # confirmation's last measured setting).
    per_pid: dict[int, list[dict]] = defaultdict(list)
    for trial in entry["trials"]:
        if trial["phase"] == "replay":
            continue
        for pid in trial.get("pids") or []:
            per_pid[pid].append(trial["params"])
        if not trial.get("ran"):
            continue
        for ran in trial["ran"].get("ranks") or [trial["ran"]]:  # each rank of a torchrun trial
            if ran["pid"] not in (trial.get("pids") or []):
                per_pid[ran["pid"]].append(trial["params"])
            for pid in ran.get("cut_short_pids", []):  # the script ended its first try there
                per_pid[pid].append(trial["params"])
    # A failed trial that says nowhere which process it ran in: any may have made its batches
    # (a trial skipped before it started, with no ``pids``, made none).
    unattributed = any(
        not t.get("ran")
        and not t.get("pids")
        and t["phase"] != "replay"
        and t["status"] == "failed"
        for t in entry["trials"]
    )
    checked = 0
    for trial in measured:
        params = trial["params"]
        workers_with_batches = params["num_workers"]
        if epoch_samples is not None and workers_with_batches:
            workers_with_batches = min(workers_with_batches, epoch_samples // params["batch_size"])
        expected = {str(i) for i in range(workers_with_batches)} or {"main"}
        for ran in trial["ran"].get("ranks") or [trial["ran"]]:
            made = batches[ran["pid"]]
            assert made, f"no batch logged by trial process {ran['pid']}: {trial}"
            assert ran["workers_started"] == params["num_workers"]
            assert max(ran["batch_lengths"]) == params["batch_size"], (trial, ran)
            lengths = {length for length, _ in made}
            workers = {worker for _, worker in made}
            if len(per_pid[ran["pid"]]) == 1 and not unattributed:
                assert max(lengths) == params["batch_size"], (trial, sorted(lengths))
                assert workers == expected, (trial, workers)
                continue
            full = {worker for length, worker in made if length == params["batch_size"]}
            assert expected <= full, (trial, sorted(full))
        checked += 1
    return checked


def _line(script: str, text: str) -> str:
    """``script:N``, the line of ``script`` holding ``text``."""
    lines = (SCRIPTS / script).read_text().splitlines()
    (number,) = [i for i, line in enumerate(lines, 1) if text in line]
    return f"{script}:{number}"


def _tuned(entry: dict, line: str, dataset: str) -> None:
    workload = entry["workload"]
    assert workload["call_site"] == line, workload
    assert workload["dataset"] == dataset, workload
    assert f"tuned: DataLoader #{workload['loader_index']} at {line}" in entry["stderr"]


def _edited(tmp_path: Path, entry: dict, **kwargs: object) -> Path:
    """The saved file with the entry's settings changed (as a user may edit it), so that what
    ``run`` applies shows in the batches."""
    path = Path(entry["out"])
    doc = json.loads(path.read_text())
    (saved,) = doc["machines"][entry["hardware_key"]]["workloads"].values()
    saved["loader_kwargs"] = {"pin_memory": False, "persistent_workers": False, **kwargs}
    path.write_text(json.dumps(doc))
    for log in (tmp_path / "log").glob("*.log"):
        log.unlink()
    return path


def run_applies_only_to_the_tuned_loader(
    script: str, tmp_path: Path, entry: dict, *, other_batch: int, args: list[str]
) -> str:
    """``run`` with the entry edited: its settings reach the tuned loader only; its stderr."""
    path = _edited(tmp_path, entry, batch_size=24, num_workers=1, prefetch_factor=2)
    proc = _cli(["run", script, "--file", str(path), "--", *args], tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"at {entry['workload']['call_site']}" in proc.stderr
    assert "bs=24 w=1 pf=2" in proc.stderr
    ((_, made),) = _batches(tmp_path).items()
    assert (24, "0") in made  # the training loader: the entry's batch size, in a worker
    assert (other_batch, "main") in made  # the validation loader: as the script built it
    assert {length for length, worker in made if worker == "main"} == {other_batch}
    return proc.stderr


def _no_rank_left() -> None:
    """No process of a distributed trial outlives it (the autouse fixture checks the same,
    by environment; here by command line, for a rank that dropped the environment). Only this
    test's: a trial process runs in the folder of the scripts searched (another checkout's
    tests, run beside these on the same machine, have theirs)."""
    import psutil

    left = [
        (p.pid, p.info["cmdline"])
        for p in psutil.process_iter(["cmdline", "cwd"])
        if any("loadertune.trials" in part for part in p.info["cmdline"] or [])
        and p.info["cwd"] == str(SCRIPTS)
    ]
    assert not left, left


def test_lightning_fit_tunes_the_training_loader_not_the_sanity_checked_one(
    tmp_path: Path,
) -> None:
    _needs("lightning")
    entry = search("lightning_fit.py", tmp_path)
    _tuned(entry, _line("lightning_fit.py", "train = DataLoader("), "_frameworks.Features")
    assert entry["workload"]["chosen_by"] == "the optimizer"
    assert check_trials_ran_their_settings(entry, tmp_path, val_batch=50) >= 1
    run_applies_only_to_the_tuned_loader(
        "lightning_fit.py", tmp_path, entry, other_batch=50, args=["--epochs", "1"]
    )


def test_lightning_datamodule_records_the_users_line_not_lightnings(tmp_path: Path) -> None:
    _needs("lightning")
    entry = search("lightning_datamodule.py", tmp_path)
    _tuned(
        entry, _line("lightning_datamodule.py", "DataLoader(self.train_set"), "_frameworks.Features"
    )
    # the user's frames only: Lightning's wrapper of __init__ is not taken for the creator
    assert all(part.startswith("lightning_datamodule.py:") for part in entry["workload"]["key"])
    assert check_trials_ran_their_settings(entry, tmp_path, val_batch=50) >= 1


def test_loadertune_loader_names_the_users_line_in_a_datamodule(tmp_path: Path) -> None:
    _needs("lightning")
    line = _line("lightning_datamodule.py", "DataLoader(self.train_set")
    entry = search("lightning_datamodule.py", tmp_path, "--loader", line, budget=20)
    _tuned(entry, line, "_frameworks.Features")
    assert entry["workload"]["chosen_by"] == "--loader"


def test_accelerate_batch_sizes_are_really_applied_to_the_prepared_loader(
    tmp_path: Path,
) -> None:
    """``prepare`` rebuilds the loader with a batch_sampler: a searched batch size is applied to
    it (it was recorded but not run before), and the validation loader, prepared first, is not
    the one tuned."""
    _needs("accelerate")
    entry = search("accelerate_loop.py", tmp_path, "--batch-sizes", "32,64", budget=60)
    _tuned(entry, _line("accelerate_loop.py", "train = DataLoader("), "_frameworks.Features")
    assert entry["workload"]["rebuilt_by_framework"]
    assert "batch_size" in entry["loader_kwargs"]
    checked = check_trials_ran_their_settings(entry, tmp_path, val_batch=50, epoch_samples=4096)
    assert checked >= 2
    sizes = {t["params"]["batch_size"] for t in entry["trials"] if t["status"] == "ok"}
    assert entry["search"]["space"]["batch_sizes"] == [32, 64]
    run_applies_only_to_the_tuned_loader(
        "accelerate_loop.py", tmp_path, entry, other_batch=50, args=["--epochs", "1"]
    )
    assert sizes


def test_hugging_face_trainer_tunes_its_train_dataloader(tmp_path: Path) -> None:
    _needs("transformers", "accelerate")
    out = tmp_path / "hf"
    entry = search("hf_trainer.py", tmp_path, "--", "--output-dir", str(out))
    _tuned(entry, _line("hf_trainer.py", "trainer.train()"), "_frameworks.Tokens")
    assert any("get_train_dataloader" in part for part in entry["workload"]["key"])
    assert check_trials_ran_their_settings(entry, tmp_path, val_batch=20) >= 1
    run_applies_only_to_the_tuned_loader(
        "hf_trainer.py",
        tmp_path,
        entry,
        other_batch=20,
        args=["--epochs", "1", "--output-dir", str(out)],
    )


def test_a_loader_created_at_every_epoch_is_one_loader(tmp_path: Path) -> None:
    """Issue 14: ``for epoch ...: for x in DataLoader(...)`` was "no progress for 15 s"."""
    entry = search("per_epoch.py", tmp_path, budget=30)
    _tuned(entry, _line("per_epoch.py", "DataLoader(dataset"), "_data.Latency")
    assert entry["workload"]["recreated_each_epoch"]
    assert entry["search"]["space"]["persistent_workers"] == [False]  # moot: new loaders
    assert any((t.get("ran") or {}).get("loaders", 0) > 1 for t in entry["trials"])


def test_torchrun_two_ranks_on_gloo_one_search_one_result(tmp_path: Path) -> None:
    """``--nproc-per-node 2``: every trial runs both ranks under torch's launcher, each rank's
    loader with the trial's setting (checked rank by rank from inside), one entry for world
    size 2; ``run --nproc-per-node 2`` applies it in each rank."""
    entry = search(
        "ddp_train.py", tmp_path, "--nproc-per-node", "2", "--batch-sizes", "32,64", budget=90
    )
    _tuned(entry, _line("ddp_train.py", "loader = DataLoader("), "_frameworks.Features")
    assert (entry["workload"]["world_size"], entry["workload"]["nproc_per_node"]) == (2, 2)
    assert entry["workload_key"].endswith("[2 ranks]")
    measured = [t for t in entry["trials"] if t["status"] == "ok" and t["ran"]]
    assert all(len(t["ran"]["ranks"]) == 2 for t in measured)
    # DistributedSampler gives each of the 2 ranks half of the 4096 samples: at batch 64 an
    # epoch of 32 batches, so a trial of 34 workers leaves the last two none
    checked = check_trials_ran_their_settings(entry, tmp_path, val_batch=0, epoch_samples=2048)
    assert checked >= 1
    _no_rank_left()
    path = _edited(tmp_path, entry, batch_size=24, num_workers=1, prefetch_factor=2)
    proc = _cli(
        [
            "run",
            "ddp_train.py",
            "--nproc-per-node",
            "2",
            "--file",
            str(path),
            "--",
            "--epochs",
            "1",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stderr.count("bs=24 w=1 pf=2") == 1  # rank 0 speaks for both
    made = _batches(tmp_path)
    assert len(made) == 2  # two ranks, each with the entry's settings
    assert all({(24, "0")} == {(n, w) for n, w in batches if n == 24} for batches in made.values())
    assert all({w for _, w in batches} == {"0"} for batches in made.values())
    _no_rank_left()


def test_a_plain_search_of_a_distributed_script_says_to_use_nproc_per_node(
    tmp_path: Path,
) -> None:
    proc = _cli(
        ["search", "ddp_train.py", "--budget", "20", "--out", str(tmp_path / "r.json")], tmp_path
    )
    assert proc.returncode == 1
    assert "--nproc-per-node" in proc.stderr
    assert proc.stderr.count("search it as torchrun runs it") == 1, proc.stderr  # (was 2)
    assert not (tmp_path / "r.json").exists()


# -- scripts held back while issue 11 was built, written as users write them ---------------------


def test_accelerate_with_gradient_accumulation_runs_every_batch_size_it_records(
    tmp_path: Path,
) -> None:
    """A trial at another batch size than its hot-swapping process's prepared loader ran was
    recorded ``not_applied``: it now gets a process whose loader is built with that size."""
    _needs("accelerate")
    entry = search("accelerate_accumulate.py", tmp_path, "--batch-sizes", "16,32", budget=30)
    _tuned(entry, _line("accelerate_accumulate.py", "train_dl = DataLoader("), "__main__.Slow")
    assert not [t for t in entry["trials"] if t["error"] == "not_applied"], entry["trials"]
    assert check_trials_ran_their_settings(entry, tmp_path, val_batch=100) >= 1
    run_applies_only_to_the_tuned_loader(
        "accelerate_accumulate.py", tmp_path, entry, other_batch=100, args=["--epochs", "1"]
    )


def test_hugging_face_trainer_evaluating_every_50_steps(tmp_path: Path) -> None:
    """``run`` names the evaluation loaders it leaves alone once, not twice per evaluation."""
    _needs("transformers", "accelerate")
    out = str(tmp_path / "hf")
    entry = search("hf_trainer_steps.py", tmp_path, "--", "--out", out, budget=30)
    _tuned(entry, _line("hf_trainer_steps.py", "trainer.train()"), "__main__.Reviews")
    assert check_trials_ran_their_settings(entry, tmp_path, val_batch=40) >= 1
    stderr = run_applies_only_to_the_tuned_loader(
        "hf_trainer_steps.py", tmp_path, entry, other_batch=40, args=["--out", out, "--epochs", "2"]
    )
    assert stderr.count("not changed") == 1, stderr[-3000:]


def test_torchrun_ranks_are_main_processes_not_workers(tmp_path: Path) -> None:
    """Under ``--nproc-per-node 2`` the ranks were counted as loader workers: a baseline with
    ``num_workers=0`` showed half a CPU and 250 MiB of "workers"."""
    entry = search("ddp_validate.py", tmp_path, "--nproc-per-node", "2", budget=30)
    _tuned(entry, _line("ddp_validate.py", "train_loader = DataLoader("), "__main__.Slow")
    base = entry["baseline"]
    assert base["loader_kwargs"]["num_workers"] == 0
    assert (base["cpu_percent_workers"], base["worker_pss_bytes"]) == (0, None), base
    assert base["cpu_percent_main"] > 0
    assert check_trials_ran_their_settings(entry, tmp_path, val_batch=75) >= 1
    _no_rank_left()
