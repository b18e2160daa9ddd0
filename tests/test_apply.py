"""Saved settings go to the loader they were measured on, and nowhere else (issue 11)."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

from torch.utils.data import DataLoader

from loadertune.trials.inside.apply_saved import ApplySaved, SavedEntry
from loadertune.trials.inside.identity import LoaderRecord
from loadertune.trials.inside.patch import patched
from loadertune.trials.lifeline import DieWithTrial

SCRIPT = textwrap.dedent("""
    from torch.utils.data import DataLoader
    from workloads import TensorDataset

    class Other(TensorDataset):
        pass

    def make(ds, bs):
        return DataLoader(ds, batch_size=bs)

    train = make(TensorDataset(n=32), 4)
    val = make(Other(n=32), 8)
    epochs = [DataLoader(TensorDataset(n=32), batch_size=2) for _ in range(3)]
""")
KWARGS = {"batch_size": 16, "num_workers": 2, "prefetch_factor": 4, "persistent_workers": True}


def _run(entries: list[SavedEntry]) -> tuple[dict, list[str], ApplySaved]:
    lines: list[str] = []
    controller = ApplySaved(entries, report=lines.append)
    namespace: dict = {"__name__": "__main__"}
    with patched(controller):
        exec(compile(SCRIPT, "mytrain.py", "exec"), namespace)
    return namespace, lines, controller


def test_the_entry_goes_to_its_loader_only_and_the_other_at_its_line_is_named() -> None:
    """``make()`` creates both loaders at one line: the key (the line calling it) tells them
    apart."""
    _, _, found = _run([])
    train_key = found.created[0].identity
    assert train_key[:2] == ("mytrain.py:9", "mytrain.py:11")
    entry = SavedEntry(
        "script mytrain.py:9",
        KWARGS,
        call_site="mytrain.py:9",
        key=train_key,
        dataset="workloads.TensorDataset",
    )
    ns, lines, controller = _run([entry])
    train, val = ns["train"], ns["val"]
    assert (train.batch_size, train.num_workers, train.prefetch_factor) == (16, 2, 4)
    assert train.persistent_workers
    assert (val.batch_size, val.num_workers) == (8, 0)  # the same line, another loader
    assert [r.index for r in entry.applied] == [1]
    assert any("#1 at mytrain.py:9" in line and "bs=16 w=2 pf=4 persist" in line for line in lines)
    # the script's batch size was 4: the run says the training changes with it, not only speed
    (applied,) = [line for line in lines if "#1 at mytrain.py:9" in line]
    assert "the batch size 16 is the search's pick, not the script's 4" in applied
    assert "learning rate" in applied
    assert any("#2 at mytrain.py:9" in line and "not changed" in line for line in lines)
    assert controller.unapplied() == []


def test_a_winner_at_another_batch_size_within_the_noise_leaves_the_batch_size_alone() -> None:
    """Within the noise of the script's settings, a winner at another batch size is passed over
    for the best at the script's own (the training would change, for no sure gain); clearly
    faster, it is applied, with the learning-rate note."""
    _, _, found = _run([])
    record = found.created[0]
    own_best = {"batch_size": 4, "num_workers": 1, "prefetch_factor": 2}
    entry = {
        "loader_kwargs": KWARGS,
        "within_noise": True,
        "best_at_batch_size": {"loader_kwargs": own_best, "samples_per_s": 100.0},
        "trials": [{"params": own_best, "phase": "search"}, {"params": KWARGS, "phase": "search"}],
        "workload": {
            "call_site": record.call_site,
            "key": list(record.identity),
            "lines": list(record.lines),
            "dataset": record.dataset,
        },
    }
    ns, lines, _ = _run([SavedEntry.from_entry("script mytrain.py", entry)])
    assert (ns["train"].batch_size, ns["train"].num_workers) == (4, 1)
    (applied,) = [line for line in lines if "#1 at mytrain.py:9" in line]
    assert "bs=16 w=2 pf=4 persist, changes the batch size and was within the noise" in applied
    assert "learning rate" not in applied
    clearly = SavedEntry.from_entry("script mytrain.py", {**entry, "within_noise": False})
    ns, lines, _ = _run([clearly])
    assert (ns["train"].batch_size, ns["train"].num_workers) == (16, 2)
    assert any("learning rate" in line for line in lines)
    # settings no trial measured are the user's edit of the file: applied as they are
    edited = {**entry, "loader_kwargs": {**KWARGS, "num_workers": 3}}
    ns, lines, _ = _run([SavedEntry.from_entry("script mytrain.py", edited)])
    assert (ns["train"].batch_size, ns["train"].num_workers) == (16, 3)


def test_every_loader_of_the_run_gets_the_workers_lifeline() -> None:
    """Changed or not, each loader's workers die with the run (issue 14; the SIGKILLed run is
    tests/test_cli.py::test_workers_die_with_a_sigkilled_run)."""
    entry = SavedEntry("script mytrain.py:13", KWARGS, call_site="mytrain.py:13")
    for entries in ([], [entry]):
        ns, _, controller = _run(entries)
        loaders = [ns["train"], ns["val"], *ns["epochs"]]
        assert all(isinstance(d.worker_init_fn, DieWithTrial) for d in loaders)
        assert len(controller.created) == 5


def test_a_loader_created_at_every_epoch_gets_the_settings_every_time() -> None:
    entry = SavedEntry("script mytrain.py:13", KWARGS, call_site="mytrain.py:13")
    ns, lines, _ = _run([entry])
    assert [loader.num_workers for loader in ns["epochs"]] == [2, 2, 2]
    assert len(lines) == 2, lines  # said once, and that its persistent workers do not persist
    assert "#4 at mytrain.py:13" in lines[1] and "keeps no workers" in lines[1], lines


def test_an_entry_for_another_dataset_is_not_applied_and_says_what_it_found() -> None:
    entry = SavedEntry(
        "script mytrain.py:13", KWARGS, call_site="mytrain.py:13", dataset="mypkg.Images"
    )
    ns, lines, controller = _run([entry])
    assert all(loader.num_workers == 0 for loader in ns["epochs"])
    assert any("loads workloads.TensorDataset" in line for line in lines)
    (missing,) = controller.unapplied()
    assert "matches the one measured at mytrain.py:13 (mypkg.Images)" in missing
    assert "loadertune search" in missing  # what to do
    assert "#3 at mytrain.py:13 (workloads.TensorDataset)" in missing


def test_an_entry_without_batch_size_keeps_the_scripts_batch() -> None:
    kwargs = {k: v for k, v in KWARGS.items() if k != "batch_size"}
    entry = SavedEntry("script mytrain.py:13", kwargs, call_site="mytrain.py:13")
    ns, lines, _ = _run([entry])
    assert [loader.batch_size for loader in ns["epochs"]] == [2, 2, 2]
    assert "bs=sampler w=2" in lines[0] and "bs=1" not in lines[0]


def test_an_old_entry_without_a_call_site_goes_by_order_of_creation() -> None:
    entry = SavedEntry("unknown", KWARGS, index=2)
    ns, _, _ = _run([entry])
    assert ns["val"].num_workers == 2 and ns["train"].num_workers == 0
    assert DataLoader.__init__.__name__ == "__init__"  # the patch is undone


def test_what_runs_the_script_is_not_part_of_a_loaders_key(tmp_path, monkeypatch) -> None:
    """A loader's key holds the script's frames only, whatever ran it (a trial process, `run`
    from a console script or `python -m`): `run` must find the loader a search keyed."""
    import sys

    from loadertune.trials.inside.child import run_as_main

    monkeypatch.setattr(sys, "argv", list(sys.argv))  # run_as_main sets both
    monkeypatch.setattr(sys, "path", list(sys.path))
    script = tmp_path / "train.py"
    script.write_text(
        "from torch.utils.data import DataLoader\n\n"
        "def make():\n"
        "    return DataLoader(list(range(8)), batch_size=2)\n\n"
        "loader = make()\n"
    )
    controller = ApplySaved([])
    with patched(controller):
        run_as_main(str(script), [])
    (record,) = controller.created
    assert [site.rsplit("/", 1)[-1] for site in record.identity] == ["train.py:4", "train.py:6"]


def test_a_loader_left_alone_is_named_once_not_at_every_re_creation() -> None:
    """The Hugging Face Trainer creates (and Accelerate rebuilds) an evaluation loader at every
    evaluation, at the training loader's line: one line says it is not changed, not one each."""
    entry = SavedEntry(
        "script mytrain.py:13", KWARGS, call_site="mytrain.py:13", dataset="mypkg.Images"
    )
    _, lines, _ = _run([entry])
    (line,) = [line for line in lines if "not changed" in line]
    assert "#3 at mytrain.py:13" in line


TOGETHER = textwrap.dedent("""
    from torch.utils.data import DataLoader
    from workloads import TensorDataset

    sets = [TensorDataset(n=32), TensorDataset(n=16)]
    for epoch in range(2):
        train, val = [DataLoader(ds, batch_size=4) for ds in sets]
        for batch in train:
            pass
        for batch in val:
            pass
""")


def test_loaders_created_together_at_one_line_are_told_apart() -> None:
    """Two identical loaders from one list comprehension shared one key, so an entry tuned on
    one went to both. Created before either is iterated, they are two loaders (the second's
    key says so); created again at the next epoch, each is the same loader as before."""
    found = ApplySaved([], report=lambda line: None)
    with patched(found):
        exec(compile(TOGETHER, "together.py", "exec"), {"__name__": "__main__"})
    keys = [r.identity for r in found.created]
    assert keys[0] != keys[1]
    assert keys[2:] == keys[:2]  # the next epoch's: the same two loaders
    assert "the 2nd created there" in found.created[1].describe()
    entry = SavedEntry(
        "script together.py:7",
        KWARGS,
        call_site="together.py:7",
        key=keys[1],
        dataset="workloads.TensorDataset",
    )
    lines: list[str] = []
    controller = ApplySaved([entry], report=lines.append)
    namespace: dict = {"__name__": "__main__"}
    with patched(controller):
        exec(compile(TOGETHER, "together.py", "exec"), namespace)
    assert [r.index for r in entry.applied] == [2, 4]  # val, at each epoch
    assert (namespace["train"].num_workers, namespace["val"].num_workers) == (0, 2)
    (line,) = [line for line in lines if "not changed" in line]  # said once, not each epoch
    assert "#1 at together.py:7" in line and "that was the 2nd created there" in line
    assert "if the script changed" not in line  # it did not: the entry is the other loader's


def test_more_workers_than_cpus_is_told_once_not_warned_by_torch(recwarn) -> None:
    """A saved setting with more workers than CPUs is the search's pick: torch's warning against
    it would contradict the measurement. The run says it once; other loaders keep the warning."""
    import os

    cpus = len(os.sched_getaffinity(0))
    many = {"batch_size": 4, "num_workers": cpus + 1}
    entry = SavedEntry("script mytrain.py:9", many, call_site="mytrain.py:9")
    lines: list[str] = []
    namespace: dict = {"__name__": "__main__"}
    with patched(ApplySaved([entry], report=lines.append)):
        exec(compile(SCRIPT, "mytrain.py", "exec"), namespace)
        for _ in range(2):
            assert sum(1 for _ in namespace["train"]) == 8
        assert not [w for w in recwarn if "worker processes in total" in str(w.message)]
        other = DataLoader(list(range(8)), num_workers=cpus + 1)  # torch still warns for it
        assert sum(1 for _ in other) == 8
    warned = [w for w in recwarn if "worker processes in total" in str(w.message)]
    assert warned and all("loadertune" not in w.filename for w in warned), warned[0].filename
    assert len([line for line in lines if f"{cpus + 1} workers on {cpus} CPUs" in line]) == 1


def _run_file(path: Path, entries: list[SavedEntry]) -> tuple[dict, list[str], ApplySaved]:
    """The script from a real file: the entries' texts are read from it, as in a real run."""
    lines: list[str] = []
    controller = ApplySaved(entries, report=lines.append)
    namespace: dict = {"__name__": "__main__"}
    with patched(controller):
        exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace, lines, controller


def _entry_for(record: LoaderRecord, kwargs: dict = KWARGS) -> SavedEntry:
    return SavedEntry(
        "script mytrain.py",
        dict(kwargs),
        call_site=record.call_site,
        key=record.identity,
        dataset=record.dataset,
        lines=record.lines,
    )


TWO = textwrap.dedent("""
    from torch.utils.data import DataLoader
    from workloads import TensorDataset

    train = DataLoader(TensorDataset(n=32), batch_size=4)
    val = DataLoader(TensorDataset(n=32), batch_size=8)
""")


def test_an_edit_above_the_loader_moves_it_and_its_entry_follows(tmp_path: Path) -> None:
    """Lines added or removed above a loader do not lose its saved settings; the loader now at
    the entry's old line is not taken for it (before the texts, it was: same line, same dataset)."""
    path = tmp_path / "mytrain.py"
    path.write_text(SCRIPT)
    _, _, found = _run_file(path, [])
    train = found.created[0]
    assert train.lines[:2] == (
        "return DataLoader(ds, batch_size=bs)",
        "train = make(TensorDataset(n=32), 4)",
    )
    path.write_text("# a comment\nimport os\n" + SCRIPT)  # two lines above
    ns, lines, controller = _run_file(path, [_entry_for(train)])
    assert (ns["train"].batch_size, ns["train"].num_workers) == (16, 2)
    assert (ns["val"].batch_size, ns["val"].num_workers) == (8, 0)
    assert any(f"(measured at {train.call_site})" in line for line in lines), lines
    assert controller.unapplied() == []

    path.write_text(TWO)
    _, _, found = _run_file(path, [])
    entry = _entry_for(found.created[0])  # train, at line 5
    path.write_text(TWO[1:])  # one line fewer above: val is now at line 5, train at 4
    ns, lines, _ = _run_file(path, [entry])
    assert ns["train"].num_workers == 2 and ns["val"].num_workers == 0
    assert any("reads otherwise" in line and "not changed" in line for line in lines), lines


def test_another_call_of_the_training_loaders_helper_is_not_taken_for_an_edit(
    tmp_path: Path,
) -> None:
    """Training and validation loaders made by one helper, of one dataset class, the script
    unchanged: the validation loader is left alone as created by another call, not told its
    code "reads otherwise now than when it was measured" and to search again (a new user's
    script was)."""
    path = tmp_path / "mytrain.py"
    path.write_text(
        textwrap.dedent("""
            from torch.utils.data import DataLoader
            from workloads import TensorDataset

            def make(ds, bs):
                return DataLoader(ds, batch_size=bs)

            train = make(TensorDataset(n=32), 4)
            val = make(TensorDataset(n=16), 8)
        """)
    )
    _, _, found = _run_file(path, [])
    entry = _entry_for(found.created[0])
    ns, lines, controller = _run_file(path, [entry])
    assert ns["train"].num_workers == 2 and ns["val"].num_workers == 0
    (said,) = [line for line in lines if "not changed" in line]
    assert "mytrain.py:9, the entry's loader by" in said and "mytrain.py:8" in said, said
    assert "reads otherwise" not in said and "loadertune search" not in said, said
    assert controller.unapplied() == []


def test_a_frameworks_other_loader_at_the_same_line_is_named_as_such() -> None:
    """A Trainer builds its training and its evaluation loader from one line of the user's
    (``trainer.train()``): the evaluation loader is left alone as created by other code, not
    told its code "reads otherwise now than when it was measured" (and to search again)."""
    from loadertune.trials.inside.identity import LoaderRecord

    site = "train.py:52"
    train_key = ("transformers/trainer.py:get_train_dataloader", site, "train.py:60")
    eval_key = ("transformers/trainer.py:get_eval_dataloader", site, "train.py:60")
    lines = ("out = tr.train()", "main()")
    entry = SavedEntry("script train.py:52", KWARGS, call_site=site, key=train_key, lines=lines)
    train = LoaderRecord(1, site, key=train_key, lines=lines)
    evaluation = LoaderRecord(3, site, key=eval_key, lines=lines)
    assert entry.differs(train) is None
    why = entry.differs(evaluation)
    assert why == (
        "it was created by transformers/trainer.py:get_eval_dataloader, the entry's loader by "
        "transformers/trainer.py:get_train_dataloader"
    )
    reported: list[str] = []
    ApplySaved([entry], report=reported.append).on_create(evaluation, {"dataset": [1]})
    (line,) = reported
    assert "get_eval_dataloader" in line and "loadertune search" not in line


def test_an_entry_at_the_loaders_own_lines_wins_over_one_that_follows_it(tmp_path: Path) -> None:
    path = tmp_path / "mytrain.py"
    path.write_text(TWO)
    _, _, found = _run_file(path, [])
    old = _entry_for(found.created[0])
    path.write_text("\n\n" + TWO)
    _, _, found = _run_file(path, [])
    new = _entry_for(found.created[0], {**KWARGS, "num_workers": 3})  # searched again after
    for entries in ([old, new], [new, old]):
        fresh = [dataclasses.replace(e, applied=[]) for e in entries]
        ns, _, _ = _run_file(path, fresh)
        assert ns["train"].num_workers == 3


def test_the_loaders_own_line_edited_is_measured_again(tmp_path: Path) -> None:
    path = tmp_path / "mytrain.py"
    path.write_text(TWO)
    _, _, found = _run_file(path, [])
    entry = _entry_for(found.created[0])
    path.write_text(TWO.replace("batch_size=4)", "batch_size=4, shuffle=True)"))
    ns, lines, controller = _run_file(path, [entry])
    assert ns["train"].num_workers == 0
    assert any("its code reads otherwise now" in line for line in lines), lines
    assert controller.unapplied()
