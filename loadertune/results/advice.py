"""What to do beyond the loader's settings, chosen from what a search measured: one rule per
function, each ``(outcome, hw, diag) -> a line or None`` (``diag``: what
:func:`loadertune.results.analysis.analyze` found), then each kind of failure with its fix."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

from loadertune.hardware import Hardware
from loadertune.units import GIB, MIB

if TYPE_CHECKING:
    from loadertune.search import SearchOutcome
    from loadertune.search.probe import Estimates


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


# Loading whose CPU seconds per sample are below this share of the step's seconds per sample
# is cheap beside the step: making it cheaper still (pre-decoding, packing) wins little. At a
# third, halving it raises a CPU-bound ceiling by an eighth or more.
COSTLY_LOADING_SHARE = 1 / 3


def _decoding_limits(est: Estimates) -> bool:
    """Producing samples on the CPU is what limits training: the probe's lowest ceiling is the
    workers' or the CPUs' (not the step's, the copy's, or the hand-over that loading in the
    training process avoids: an in-memory dataset that wins at ``num_workers=0`` is not
    decode-bound), and a sample's loading costs a real share of the step's time."""
    if est.limiting_stage not in ("loader", "cpu"):
        return False
    load_cpu_s = est.load_s_per_sample * est.load_cpu_fraction
    return load_cpu_s >= COSTLY_LOADING_SHARE * est.step_s_per_sample


def _advise_loading(outcome: SearchOutcome, hw: Hardware, diag: dict[str, Any]) -> str | None:
    est = outcome.winner_estimates
    if diag.get("bottleneck") != "input" or est is None:
        return None
    if est.io_bound:
        return (
            "loading waits on I/O, not the CPU: keep the data on a local disk or in RAM, "
            "and pack small files into larger ones (npy, LMDB, HDF5) to cut per-file "
            "latency; more workers than CPUs is right here"
        )
    if not _decoding_limits(est):
        return None
    return (
        "decoding and augmentation on the CPU limit training: store samples "
        "pre-decoded or in a packed format (npy, LMDB, HDF5), make augmentation "
        "cheaper, or decode on the GPU (NVIDIA DALI)"
    )


def _advise_step(outcome: SearchOutcome, hw: Hardware, diag: dict[str, Any]) -> str | None:
    if diag.get("bottleneck") != "compute":
        return None
    gpu = diag["memory"]["gpu"]
    if gpu is None and not any(t.cuda_device for t in outcome.trials):
        return (
            "with the winner, the training step is the bottleneck, not the loader: loading "
            "faster still buys nothing; profile the step"
        )
    fits = (gpu or {}).get("predicted_max_batch_size")
    more = (
        f"; the GPU-memory line predicts a batch of {fits} fits (convolutions often fit more)"
        if fits and fits > outcome.winner.batch_size
        else ""
    )
    return (
        "with the winner, the GPU step is the bottleneck, not the loader: use mixed precision "
        f"(torch.autocast) to cut compute and activation memory{more}"
    )


def _advise_in_process(outcome: SearchOutcome, hw: Hardware, diag: dict[str, Any]) -> str | None:
    est = outcome.winner_estimates
    if est is None or est.limiting_stage != "main_process" or outcome.winner.num_workers:
        return None
    return (
        "loading in the training process (num_workers=0) is fastest here: handing a "
        "batch over from a worker costs more than producing it"
    )


def _advise_copy_on_read(outcome: SearchOutcome, hw: Hardware, diag: dict[str, Any]) -> str | None:
    host = diag["memory"]["host"]
    if not host["copy_on_read"]:
        return None
    rate = host["worker_uss_growth_bytes_per_s"] / MIB
    return (
        f"each worker's memory grows {rate:,.0f} MiB/s while loading (copy-on-read: Python "
        "objects touched by forked workers are copied, pytorch#13246): keep samples in "
        "numpy arrays or tensors instead of lists and dicts"
    )


def _advise_shm(outcome: SearchOutcome, hw: Hardware, diag: dict[str, Any]) -> str | None:
    shm_free = hw.shm_free_bytes
    in_flight = diag["memory"]["host"]["in_flight_bytes"]
    if shm_free is None or not (
        shm_free < GIB
        or (in_flight and in_flight > 0.5 * shm_free)
        or "shm_exhausted" in diag["failures"]
    ):
        return None
    return (
        f"/dev/shm has {shm_free / GIB:.1f} GiB free; batches in flight live there: "
        "raise it (docker run --shm-size=8g) to allow more workers or prefetch"
    )


def _advise_quota(outcome: SearchOutcome, hw: Hardware, diag: dict[str, Any]) -> str | None:
    if hw.cpu_quota is None or hw.cpu_quota >= hw.logical_cpus:
        return None
    return (
        f"a CPU quota limits this process to {hw.cpu_quota:g} CPUs of the machine's "
        f"{hw.logical_cpus}: settings tuned here fit that quota, not the whole machine"
    )


def _advise_spin(outcome: SearchOutcome, hw: Hardware, diag: dict[str, Any]) -> str | None:
    winner = outcome.results_for(outcome.winner)
    main_cpu = _median([r.resources.cpu_percent_main for r in winner if r.ok and r.resources])
    busy = [r for r in outcome.trials if r.ok and r.config.num_workers and r.resources]
    spin = _median([r.resources.cpu_percent_main for r in busy if r.resources])
    if hw.usable_cpus > 4 or spin is None or spin <= 120 or (main_cpu or 0) <= 100:
        return None
    return (
        f"the training process keeps {spin:.0f}% of a CPU busy while workers run (torch's "
        "intra-op threads spin-wait between operations) and the workers need the same "
        f"{hw.usable_cpus} CPUs: try torch.set_num_threads(1) or OMP_WAIT_POLICY=PASSIVE "
        "in the training process, then tune again"
    )


def _advise_oversubscribed(
    outcome: SearchOutcome, hw: Hardware, diag: dict[str, Any]
) -> str | None:
    if outcome.winner.num_workers <= hw.usable_cpus:
        return None
    # The cause only where the probe saw it: CPU-bound loading measured while other processes
    # hold the CPUs can look like waiting, and must not be told it waits on I/O.
    est = outcome.estimates
    why = " because the loading waits on I/O" if est is not None and est.io_bound else ""
    return (
        f"the winner uses {outcome.winner.num_workers} workers on {hw.usable_cpus} usable "
        f"CPUs; torch warns about this, but it was the best setting measured here{why}"
    )


def _advise_far_from_ceiling(
    outcome: SearchOutcome, hw: Hardware, diag: dict[str, Any]
) -> str | None:
    percent = diag.get("percent_of_ceiling")
    if percent is None or percent >= 80 or diag.get("bottleneck") != "input":
        return None
    return (
        f"the winner reaches {percent:.0f}% of the estimated ceiling: the loader, not the "
        "settings, is what to change next"
    )


_ADVICE = (
    _advise_loading,
    _advise_step,
    _advise_in_process,
    _advise_copy_on_read,
    _advise_shm,
    _advise_quota,
    _advise_spin,
    _advise_oversubscribed,
    _advise_far_from_ceiling,
)


def advice(outcome: SearchOutcome, hw: Hardware, diag: dict[str, Any]) -> list[str]:
    """What to do beyond the knobs, chosen from what was measured: each rule that applies,
    then each kind of failure the trials met with its fix."""
    out = [line for rule in _ADVICE if (line := rule(outcome, hw, diag))]
    for kind, info in diag["failures"].items():
        out.append(
            f"{info['count']} trial(s) failed with {kind} ({info['message']}): {info['advice']}"
        )
    return out
