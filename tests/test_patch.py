"""The DataLoader patch: every import style, creation order and call sites, applying settings."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from loadertune.config import Config
from loadertune.trials.loader import apply_settings
from loadertune.trials.patch import LoaderRecord, matches_site, patched


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
