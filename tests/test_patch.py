"""The DataLoader patch: every import style, creation order and call sites, applying settings."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from loadertune.config import Config
from loadertune.trials.inside.patch import LoaderRecord, matches_site, patched
from loadertune.trials.loader import apply_settings
from loadertune.trials.messages import NO_BATCHING


class Recorder:
    def __init__(self) -> None:
        self.created: list[tuple[LoaderRecord, dict[str, Any]]] = []
        self.iterated: list[LoaderRecord] = []

    def on_create(self, record, arguments):
        self.created.append((record, dict(arguments)))
        return arguments

    def on_iter(self, loader, record, original):
        self.iterated.append(record)
        return original(loader)


SCRIPT = textwrap.dedent("""
    import torch.utils.data as tud
    from torch.utils.data import DataLoader
    from torch.utils.data import DataLoader as DL
    from workloads import TensorDataset

    class Mine(DataLoader):
        def __init__(self, ds, **kw):
            super().__init__(ds, batch_size=4, **kw)

    ds = TensorDataset(n=16)
    a = DataLoader(ds, 2, True)
    b = tud.DataLoader(ds, batch_size=8)
    c = DL(ds, batch_size=16, drop_last=True)
    d = Mine(ds)
    for loader in (d, c, b, a):
        next(iter(loader))
""")


def test_every_import_style_goes_through_the_patch() -> None:
    rec = Recorder()
    with patched(rec):
        exec(compile(SCRIPT, "myscript.py", "exec"), {"__name__": "__main__"})
    assert [r.index for r, _ in rec.created] == [1, 2, 3, 4]
    sites = [r.call_site for r, _ in rec.created]
    assert sites == ["myscript.py:12", "myscript.py:13", "myscript.py:14", "myscript.py:15"]
    assert rec.created[0][1] == {
        "dataset": rec.created[0][1]["dataset"],
        "batch_size": 2,
        "shuffle": True,
    }
    assert rec.created[3][1]["batch_size"] == 4  # the subclass's own argument, kept
    assert [r.index for r in rec.iterated] == [4, 3, 2, 1]


def test_the_patch_is_undone() -> None:
    original = DataLoader.__init__, DataLoader.__iter__
    with patched(Recorder()):
        assert DataLoader.__init__ is not original[0]
    assert (DataLoader.__init__, DataLoader.__iter__) == original


def test_apply_settings_keeps_every_combination_valid() -> None:
    args = {
        "dataset": None,
        "batch_size": 4,
        "num_workers": 4,
        "prefetch_factor": 8,
        "persistent_workers": True,
    }
    out = apply_settings(args, Config(16))
    assert (
        out["num_workers"] == 0
        and "prefetch_factor" not in out
        and out["persistent_workers"] is False
    )
    sampler = BatchSampler(SequentialSampler(range(10)), batch_size=5, drop_last=False)
    out = apply_settings({"dataset": None, "batch_sampler": sampler}, Config(16, 2))
    assert "batch_size" not in out and out["num_workers"] == 2


@pytest.mark.parametrize(
    ("site", "wanted", "ok"),
    [
        ("examples/train.py:42", "train.py:42", True),
        ("examples/train.py:42", "examples/train.py:42", True),
        ("/abs/examples/train.py:42", "examples/train.py:42", True),
        ("examples/train.py:42", "train.py:43", False),
        ("examples/mytrain.py:42", "train.py:42", False),
    ],
)
def test_matches_site(site: str, wanted: str, ok: bool) -> None:
    assert matches_site(site, wanted) is ok


def test_a_batch_sampler_is_rebuilt_with_the_trials_batch_size_where_its_type_allows() -> None:
    from loadertune.trials.loader import batch_size_fixed, epoch_samples

    sampler = BatchSampler(SequentialSampler(range(100)), batch_size=10, drop_last=False)
    out = apply_settings({"dataset": list(range(100)), "batch_sampler": sampler}, Config(32, 0))
    assert out["batch_sampler"].batch_size == 32 and sampler.batch_size == 10  # a copy
    loader = DataLoader(**out)
    assert [len(b) for b in loader] == [32, 32, 32, 4]
    assert epoch_samples(loader) == 100  # known from the batch sampler: persistence is tried

    class Buckets(BatchSampler):  # a subclass may batch by other rules: not rebuilt
        pass

    custom = Buckets(SequentialSampler(range(100)), batch_size=10, drop_last=False)
    assert "cannot rebuild it" in (batch_size_fixed(custom) or "")
    kept = apply_settings({"dataset": None, "batch_sampler": custom}, Config(32, 0))
    assert kept["batch_sampler"] is custom


def test_a_loader_without_automatic_batching_is_rebuilt_without_it() -> None:
    """``batch_size=None`` and no batch sampler: rebuilt with a trial's workers, its items stay
    the batches (the trial's batch size 1 is not applied) and its sampler is kept."""
    from loadertune.trials.loader import rebuilt, why_batch_size_fixed

    loader = DataLoader(list(range(20)), batch_size=None, shuffle=True)
    assert why_batch_size_fixed(loader) == NO_BATCHING
    new = rebuilt(loader, Config(1, 2, 2))
    assert new.batch_size is None and new.batch_sampler is None and new.num_workers == 2
    assert new.sampler is loader.sampler  # shuffled as the script's
    items = list(new)
    assert sorted(items) == list(range(20)) and all(type(x) is int for x in items)  # not [x]
    script_kwargs = {"dataset": list(range(20)), "batch_size": None, "shuffle": True}
    assert apply_settings(script_kwargs, Config(1, 2))["batch_size"] is None
    assert why_batch_size_fixed(DataLoader(list(range(20)), batch_size=4)) is None


def test_accelerates_shard_of_a_batch_sampler_is_rebuilt_around_a_resized_one() -> None:
    shard_type = pytest.importorskip("accelerate.data_loader").BatchSamplerShard
    inner = BatchSampler(SequentialSampler(range(64)), batch_size=8, drop_last=False)
    shard = shard_type(inner, num_processes=2, process_index=1)
    out = apply_settings({"dataset": list(range(64)), "batch_sampler": shard}, Config(16, 0))
    new = out["batch_sampler"]
    assert type(new) is shard_type and new.batch_size == 16 and new.process_index == 1
    assert [len(b) for b in new] == [16, 16]  # rank 1's half of 64 samples in batches of 16
    assert shard.batch_size == 8  # the original is untouched


def test_call_sites_survive_a_loadertune_folder_in_the_working_directory(tmp_path) -> None:
    """A folder named ``loadertune`` in the working directory (the study cache when
    XDG_CACHE_HOME=$PWD) shadows an editable install as a namespace package, whose ``__file__``
    is None: the call site read ``<unknown>:0`` there."""
    import subprocess
    import sys

    (tmp_path / "loadertune").mkdir()
    (tmp_path / "train.py").write_text(
        "import torch\nfrom torch.utils.data import DataLoader\n\n"
        "loader = DataLoader(torch.arange(8.0), batch_size=4)\n"
    )
    probe = textwrap.dedent(f"""
        import runpy
        from loadertune.trials.inside.patch import patched

        class Rec:
            def on_create(self, record, arguments):
                print("SITE", record.call_site)
                return arguments

        with patched(Rec()):
            runpy.run_path({str(tmp_path / "train.py")!r}, run_name="__main__")
    """)
    proc = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "SITE train.py:4" in proc.stdout, proc.stdout
