"""The HTML and PNG report, built from a real search's file and study, opened in a real
headless Chromium: it loads without a console message, and draws every measured trial."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from loadertune import tune_loader
from loadertune.errors import ConfigError, NoRecommendationError
from loadertune.hardware import current_key
from loadertune.view.html import data as plot_data
from loadertune.view.html import load, write_report

from workloads import SleepDataset

pytest.importorskip("plotly", reason="the report extra is not installed")
pytest.importorskip("matplotlib", reason="the report extra is not installed")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A real search of a small latency-bound dataset over two batch sizes, saved to a file,
    its study in a SQLite storage beside it."""
    folder = tmp_path_factory.mktemp("searched")
    storage = f"sqlite:///{folder / 'studies.db'}"
    rec = tune_loader(
        SleepDataset(n=20000, sleep_s=0.0003),
        batch_size=[16, 32],
        step=lambda batch: batch.sum(),
        budget_s=14,
        window_s=0.3,
        storage=storage,
        seed=0,
        resume=False,
        verbose=False,
    )
    return Path(rec.save(folder / "rec.json")), storage


def _entry(path: Path) -> dict:
    doc = json.loads(path.read_text())
    (workloads,) = [m["workloads"] for m in doc["machines"].values()]
    (entry,) = workloads.values()
    return entry


def _measured_in_file(entry: dict) -> dict[int, int]:
    """Trials per batch size that measured the loader, counted from the file itself."""
    counts: dict[int, int] = {}
    for t in entry["trials"]:
        if t["phase"] in plot_data.MEASURED_PHASES and t["samples_per_s"] is not None:
            bs = t["params"]["batch_size"]
            counts[bs] = counts.get(bs, 0) + 1
    return counts


@pytest.mark.slow
def test_the_report_reads_the_file_and_the_study(searched) -> None:
    path, storage = searched
    data = load(str(path))
    entry = _entry(path)
    assert data.machine == current_key()
    assert len(data.trials) == len(entry["trials"])
    assert "details of" in data.study_note and storage in data.study_note
    # the trials without the study's details are named (a new user read "2 of 3" unexplained)
    found = int(data.study_note.split("details of ")[1].split(" of ")[0])
    none = re.findall(r"#(\d+) (\w+)", data.study_note.split("none for ")[-1])
    assert found + len(none) == len(data.trials) if found < len(data.trials) else not none
    # The study adds what the file leaves out: each measured trial's sub-windows and memory.
    measured = [t for t in data.measured if t.status == "ok"]
    assert measured and all(t.sub_window_samples_per_s for t in measured)
    assert all(t.pss_bytes and t.blocked_fraction is not None for t in measured)
    ends = [t.end_s for t in data.trials]
    assert ends == sorted(ends) and ends[-1] == pytest.approx(sum(t.wall_s for t in data.trials))


@pytest.mark.slow
def test_without_its_study_the_report_says_so_and_uses_the_file(searched, tmp_path) -> None:
    path, _ = searched
    doc = json.loads(path.read_text())
    for machine in doc["machines"].values():
        for entry in machine["workloads"].values():
            entry["search"]["storage"] = f"sqlite:///{tmp_path / 'missing' / 'none.db'}"
    moved = tmp_path / "moved.json"
    moved.write_text(json.dumps(doc))
    data = load(str(moved))
    assert "could not be read" in data.study_note
    assert not any(t.pss_bytes for t in data.trials)
    html = write_report(data, tmp_path / "r.html")[0].read_text()
    assert "no memory figures per trial" in html
    with pytest.raises(ConfigError, match="has no study 'nope'"):
        load(str(path), study="nope")


@pytest.mark.slow
def test_where_a_batch_sampler_decides_no_trial_or_plot_names_a_batch_size(
    searched, tmp_path
) -> None:
    """A loader whose batch sampler makes the batches: its trials record batch size 1 and its
    entry none. The report's table and plots said "bs=1" and "batch 1" (a new user's batches
    were 32), and drew no winner (its setting, without a batch size, was not read)."""
    path, _ = searched
    doc = json.loads(path.read_text())
    for machine in doc["machines"].values():
        for entry in machine["workloads"].values():
            entry["workload"]["batch_size_fixed"] = "the loader's batch_sampler decides"
            entry["loader_kwargs"].pop("batch_size")
            entry["baseline"]["loader_kwargs"].pop("batch_size")
            for t in entry["trials"]:
                t["params"]["batch_size"] = 1
    sampled = tmp_path / "sampled.json"
    sampled.write_text(json.dumps(doc))
    data = load(str(sampled))
    assert data.winner is not None and data.baseline is not None
    assert all(t.label.startswith("bs=sampler") for t in data.trials)
    page = write_report(data, tmp_path / "r.html")[0].read_text()
    assert "the batch sampler's batches: median" in page
    assert "winner: median of its final rounds" in page
    assert "bs=1 " not in page and "batch 1" not in page


@pytest.mark.slow
def test_the_report_finds_its_study_after_a_fresh_search_replaced_it(searched, tmp_path) -> None:
    """A fresh search of the same study name (another ``--out``) replaced the entry's study:
    the report reads the copy kept of it, not the newer search's trials."""
    import optuna

    from loadertune.search import study as study_module

    path, storage = searched
    search = _entry(path)["search"]
    name, started = search["study_name"], search["study_started"]
    moved = tmp_path / "studies.db"
    moved_url = f"sqlite:///{moved}"
    optuna.copy_study(
        from_study_name=name, from_storage=storage, to_storage=moved_url, to_study_name=name
    )
    doc = json.loads(path.read_text())
    for machine in doc["machines"].values():
        for entry in machine["workloads"].values():
            entry["search"]["storage"] = moved_url
    copy = tmp_path / "rec.json"
    copy.write_text(json.dumps(doc))
    study_module._replace(moved_url, name)  # as a fresh search of that name does
    newer = optuna.create_study(study_name=name, storage=moved_url, direction="maximize")
    newer.set_user_attr(study_module.STARTED, study_module._now())
    data = load(str(copy))
    kept = study_module.replaced_name(name, started)
    assert repr(kept) in data.study_note
    details = load(str(path)).study_note.split(": details of ")[1]  # as before it was replaced
    assert data.study_note.endswith(f": details of {details}")


def test_an_entry_that_is_not_there_is_named(tmp_path) -> None:
    path = tmp_path / "empty.json"
    with pytest.raises(NoRecommendationError, match="does not exist"):
        load(str(path))


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/run installs it)")
def test_the_page_opens_offline_in_chromium_and_draws_every_trial(searched, tmp_path) -> None:
    path, _ = searched
    out = tmp_path / "report.html"
    png = tmp_path / "png"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadertune",
            "report",
            str(path),
            "-o",
            str(out),
            "--png",
            str(png),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    page = out.read_text()
    assert not re.search(r"<script[^>]+src=", page), "plotly.js must be inlined, not fetched"
    dom = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--enable-logging=stderr",
            "--v=0",
            "--dump-dom",
            out.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    assert not console, f"the page logged to the console: {console}"
    drawn = dom.stdout
    assert 'id="rate-vs-workers"' in drawn and "main-svg" in drawn, "plotly did not draw"
    # Every measured trial of the file is a marker of its batch size's trace, no more, no less.
    expected = _measured_in_file(_entry(path))
    drawn_sizes = {
        int(bs) for bs in re.findall(r'class="trace scatter tracetrials-bs(\d+)"', drawn)
    }
    assert expected and drawn_sizes == set(expected)
    for bs, n in expected.items():
        trace = re.search(
            rf'class="trace scatter tracetrials-bs{bs}".*?(?=class="trace |$)', drawn, re.S
        )
        assert trace, f"no trace drawn for batch {bs}"
        assert trace.group(0).count('class="point"') == n, f"batch {bs}"
    # The progress plot shows the same trials by phase.
    progress = sum(
        m.group(0).count('class="point"')
        for m in re.finditer(
            r'class="trace scatter traceprogress-(?!best|failed)[a-z]+".*?(?=class="trace |$)',
            drawn,
            re.S,
        )
    )
    assert progress == sum(expected.values())
    assert sorted(p.name for p in png.iterdir()) == [
        "memory.png",
        "progress.png",
        "rate_vs_workers.png",
        "winner_vs_baseline.png",
    ]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in png.iterdir())


@pytest.mark.slow
def test_search_writes_the_report_at_the_end(tmp_path) -> None:
    script = Path(__file__).parent / "scripts" / "style_alias.py"
    out, report = tmp_path / "rec.json", tmp_path / "deep" / "report.html"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadertune",
            "search",
            str(script),
            "--out",
            str(out),
            "--report",
            str(report),
            *("--budget", "12", "--trials", "3", "--window", "0.3", "--fresh"),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"report written to {report}" in proc.stdout
    page = report.read_text()
    entry = _entry(out)
    assert "style_alias.py" in page and 'id="rate-vs-workers"' in page
    # The page's trial table lists each trial of the entry.
    assert page.count("<tr><td>") >= len(entry["trials"])
