"""Tests of loadertune.failures: each real torch message maps to the right failure kind."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loadertune.measure import failures
from loadertune.measure.failures import (
    RESOURCE_KINDS,
    Failure,
    FailureKind,
    classify_exception,
    classify_exit,
    classify_text,
)
from loadertune.trials import Limits
from loadertune.trials.supervisor import Supervisor
from loadertune.units import GIB

# The messages torch 2.x prints (or that its exceptions carry), verbatim.
KILLED = "DataLoader worker (pid 2183) is killed by signal: Killed. "
BUS_ERROR = (
    "DataLoader worker (pid 2194) is killed by signal: Bus error. It is possible that "
    "dataloader's workers are out of shared memory. Please try to raise your shared "
    "memory limit."
)
SEGFAULT = "DataLoader worker (pid 2205) is killed by signal: Segmentation fault. "
TIMED_OUT = "DataLoader timed out after 5 seconds"
TOO_MANY_FILES = (
    "Too many open files. Communication with the workers is no longer possible. "
    "Please increase the limit using `ulimit -n` in the shell or change the sharing "
    "strategy by calling `torch.multiprocessing.set_sharing_strategy('file_system')` "
    "at the beginning of your code"
)
ANCDATA = "received 0 items of ancdata"
CUDA_FORK = (
    "Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, "
    "you must use the 'spawn' start method"
)
CUDA_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; "
    "79.15 GiB total capacity; 75.02 GiB already allocated; 1.10 GiB free)"
)
PIN_THREAD = "Pin memory thread exited unexpectedly"
WORKER_EXITED = "DataLoader worker (pid(s) 3141, 3142) exited unexpectedly"
SHM_WRITE = "unable to write to file </torch_2183_3923811218_0>: No space left on device (28)"
DATASET_ERROR = (
    "Caught ValueError in DataLoader worker process 1.\nOriginal Traceback (most "
    'recent call last):\n  File "worker.py", line 349, in _worker_loop\n    data = '
    "fetcher.fetch(index)\nValueError: corrupt sample 5\n"
)


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        (KILLED, "worker_killed"),
        (BUS_ERROR, "shm_exhausted"),
        (SEGFAULT, "worker_crashed"),
        (TIMED_OUT, "timeout"),
        (TOO_MANY_FILES, "too_many_files"),
        (ANCDATA, "too_many_files"),
        (CUDA_FORK, "cuda_in_fork"),
        (CUDA_OOM, "oom"),
        (PIN_THREAD, "pin_memory_thread"),
        (WORKER_EXITED, "worker_crashed"),
        (SHM_WRITE, "shm_exhausted"),
        ("CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", "oom"),
    ],
)
@pytest.mark.parametrize("where", ["loader", "step", "script"])
def test_classify_text_setting_failures(text: str, kind: str, where: str) -> None:
    """What a DataLoader setting causes is tuning data, wherever it surfaced."""
    failure = classify_text(text, where=where)
    assert failure.kind == kind
    assert failure.user_bug is False
    assert failure.message
    assert failure.advice
    assert failure.detail == text  # the text itself when no traceback is given
    # as str(exc) of the exception torch raises, with its type in front (script mode)
    assert classify_text(f"RuntimeError: {text}", where=where).kind == kind


def test_worker_wrapped_errors_keep_their_cause() -> None:
    """A resource error raised inside a worker and re-raised by torch is still a resource error."""
    wrapped = (
        "Caught RuntimeError in DataLoader worker process 0.\nOriginal Traceback (most "
        f"recent call last):\n  ...\nRuntimeError: {CUDA_FORK}\n"
    )
    assert classify_text(wrapped, where="loader").kind == "cuda_in_fork"
    wrapped = (
        "Caught RuntimeError in DataLoader worker process 3.\nOriginal Traceback (most "
        f"recent call last):\n  ...\nRuntimeError: {SHM_WRITE}\n"
    )
    assert classify_text(wrapped, where="loader").kind == "shm_exhausted"


def test_classify_text_dataset_error_is_a_user_bug() -> None:
    failure = classify_text(DATASET_ERROR, where="loader", detail="the traceback")
    assert failure.kind == "dataset_error"
    assert failure.user_bug is True
    assert "ValueError in DataLoader worker 1" in failure.message
    assert failure.detail == "the traceback"
    assert failure.advice


def test_classify_text_unwrapped_loader_error_is_a_dataset_error() -> None:
    failure = classify_text("KeyError: 'image'", where="loader")
    assert failure.kind == "dataset_error"
    assert failure.user_bug is True
    assert "an error" in failure.message


def test_classify_text_unknown_step_error() -> None:
    text = "Traceback (most recent call last):\n  ...\nZeroDivisionError: division by zero\n"
    failure = classify_text(text, where="step")
    assert failure.kind == "step_error"
    assert failure.user_bug is True
    assert "ZeroDivisionError: division by zero" in failure.message  # the last line
    assert failure.advice
    assert failure.detail == text


def test_classify_text_unknown_script_error_and_empty_text() -> None:
    failure = classify_text("", where="script")
    assert failure.kind == "script_error"
    assert failure.user_bug is True
    assert "an exception" in failure.message


def test_classify_text_truncates_long_last_line() -> None:
    failure = classify_text("E" * 1000, where="step")
    assert len(failure.message) < 300


def test_classify_text_memory_error_in_worker_is_host_oom() -> None:
    text = (
        "MemoryError: Caught MemoryError in DataLoader worker process 0.\nOriginal Traceback "
        '(most recent call last):\n  File "/usr/lib/python3/site-packages/torch/utils/data/'
        '_utils/worker.py", line 374, in _worker_loop\n    data = fetcher.fetch(index)\n'
        "MemoryError\n"
    )
    failure = classify_text(text, where="loader")
    assert failure.kind == "host_oom"
    assert failure.user_bug is False


def test_classify_text_cuda_error_out_of_memory_is_oom() -> None:
    text = (
        "RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously "
        "reported at some other API call, so the stacktrace below might be incorrect.\nFor "
        "debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    )
    failure = classify_text(text, where="step")
    assert failure.kind == "oom"
    assert failure.user_bug is False


# -- classify_exception ---------------------------------------------------------------------------


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def test_classify_exception_memory_error() -> None:
    failure = classify_exception(_raised(MemoryError()), where="step")
    assert failure.kind == "host_oom"
    assert failure.user_bug is False
    assert "MemoryError" in failure.detail  # the traceback


def test_classify_exception_worker_memory_error_reraised_by_torch() -> None:
    """torch re-raises a worker's MemoryError as MemoryError: the exception path sees the type."""
    exc = MemoryError("Caught MemoryError in DataLoader worker process 0.\nOriginal Traceback ...")
    assert classify_exception(_raised(exc), where="loader").kind == "host_oom"


def test_classify_exception_too_many_open_files() -> None:
    exc = _raised(OSError(errno.EMFILE, "Too many open files"))
    failure = classify_exception(exc, where="loader")
    assert failure.kind == "too_many_files"
    assert failure.user_bug is False
    assert "OSError" in failure.detail


def test_classify_exception_emfile_with_other_wording() -> None:
    exc = _raised(OSError(24, "cannot open shared memory object"))
    assert classify_exception(exc, where="loader").kind == "too_many_files"


def test_classify_exception_runtime_error_by_text() -> None:
    failure = classify_exception(_raised(RuntimeError(KILLED)), where="loader")
    assert failure.kind == "worker_killed"
    assert "Traceback" in failure.detail


def test_classify_exception_user_errors() -> None:
    failure = classify_exception(_raised(ValueError("corrupt sample 5")), where="loader")
    assert (failure.kind, failure.user_bug) == ("dataset_error", True)
    failure = classify_exception(_raised(ValueError("shapes do not match")), where="step")
    assert (failure.kind, failure.user_bug) == ("step_error", True)
    assert "ValueError: shapes do not match" in failure.message


# -- classify_exit --------------------------------------------------------------------------------


def test_classify_exit_sigkill_is_host_oom() -> None:
    failure = classify_exit(-signal.SIGKILL)
    assert failure.kind == "host_oom"
    assert failure.user_bug is False
    assert classify_exit(-9).kind == "host_oom"


def test_a_fork_that_died_with_its_server_is_classified_by_the_servers_end() -> None:
    """Its own status is the parent-death signal (SIGKILL) whatever ended the server: a server
    killed by SIGKILL may be the OOM killer's doing, one that crashed or exited is not."""
    oom = classify_exit(-signal.SIGKILL, server_code=-signal.SIGKILL)
    assert oom.kind == "host_oom" and "fork server" in oom.message
    crashed = classify_exit(-signal.SIGKILL, output="tail", server_code=-signal.SIGSEGV)
    assert crashed.kind == "trial_crashed" and "SIGSEGV" in crashed.message
    assert "LOADERTUNE_FORK_SERVER=0" in crashed.advice and crashed.detail == "tail"
    assert "exited (1)" in classify_exit(-signal.SIGKILL, server_code=1).message


def test_classify_exit_sigsegv_is_trial_crashed() -> None:
    failure = classify_exit(-11, output="last lines")
    assert failure.kind == "trial_crashed"
    assert "SIGSEGV" in failure.message
    assert failure.detail == "last lines"
    assert failure.user_bug is False


def test_classify_exit_sigbus_is_shm_exhausted() -> None:
    assert classify_exit(-signal.SIGBUS).kind == "shm_exhausted"


def test_classify_exit_unknown_signal_number() -> None:
    failure = classify_exit(-200)
    assert failure.kind == "trial_crashed"
    assert "signal 200" in failure.message


def test_classify_exit_output_names_the_cause() -> None:
    output = f"epoch 1\nTraceback (most recent call last):\n  ...\nRuntimeError: {BUS_ERROR}\n"
    failure = classify_exit(1, output=output)
    assert failure.kind == "shm_exhausted"
    assert failure.detail == output


def test_classify_exit_output_with_user_error_is_trial_crashed() -> None:
    output = "Traceback (most recent call last):\n  ...\nNameError: name 'x' is not defined\n"
    failure = classify_exit(1, output=output)
    assert failure.kind == "trial_crashed"
    assert "status 1" in failure.message
    assert failure.detail == output


def test_classify_exit_without_output() -> None:
    failure = classify_exit(3)
    assert failure.kind == "trial_crashed"
    assert "status 3" in failure.message


# -- every failure --------------------------------------------------------------------------------


def _all_failures() -> list[Failure]:
    texts = [
        KILLED,
        BUS_ERROR,
        SEGFAULT,
        TIMED_OUT,
        TOO_MANY_FILES,
        ANCDATA,
        CUDA_FORK,
        CUDA_OOM,
        PIN_THREAD,
        WORKER_EXITED,
        SHM_WRITE,
        DATASET_ERROR,
        "",
        "something else",
    ]
    out = [classify_text(t, where=w) for t in texts for w in ("loader", "step", "script")]
    out += [
        classify_exception(_raised(e), where="step")
        for e in (MemoryError(), OSError(24, "x"), ValueError("v"))
    ]
    out += [
        classify_exit(rc, output=o) for rc in (-9, -11, -7, -200, 0, 1) for o in ("", BUS_ERROR)
    ]
    out += [failures.hang(10), failures.memory_budget(3 * GIB, 2 * GIB)]
    return out


def test_every_failure_has_message_and_advice() -> None:
    for failure in _all_failures():
        assert failure.kind, failure
        assert failure.message.strip(), failure
        assert failure.advice.strip(), failure


def test_every_failure_kind_is_a_member() -> None:
    for failure in _all_failures():
        assert isinstance(failure.kind, FailureKind), failure


def test_failure_kind_reads_as_its_plain_value() -> None:
    """Members compare, hash, print and serialise as their strings: code and files that hold
    the plain strings keep working."""
    kind = FailureKind.WORKER_KILLED
    assert kind == "worker_killed" and "worker_killed" in RESOURCE_KINDS
    assert {kind: 1}["worker_killed"] == 1
    assert str(kind) == f"{kind}" == "worker_killed"
    assert f"FAILED {kind}: x" == "FAILED worker_killed: x"
    failure = classify_text(KILLED, where="loader")
    assert json.loads(json.dumps(failure.to_dict()))["kind"] == "worker_killed"
    assert json.dumps(failure.to_dict()) == json.dumps(
        {**failure.to_dict(), "kind": "worker_killed"}
    )
    assert FailureKind("oom") is FailureKind.OOM


def test_failure_to_dict() -> None:
    failure = Failure("oom", "m", "a", user_bug=False, detail="d")
    assert failure.to_dict() == {
        "kind": "oom",
        "message": "m",
        "advice": "a",
        "user_bug": False,
        "detail": "d",
    }


def test_hang_and_memory_budget() -> None:
    hang = failures.hang(12)
    assert hang.kind == "timeout"
    assert "12 s" in hang.message
    assert hang.advice == classify_text(TIMED_OUT, where="loader").advice
    budget = failures.memory_budget(3 * GIB, 2 * GIB)
    assert budget.kind == "memory_budget"
    assert "3.0 GiB" in budget.message
    assert "2.0 GiB" in budget.message
    assert budget.kind in RESOURCE_KINDS


def test_resource_kinds() -> None:
    """Kinds a larger setting would repeat; a crash or a timeout is not one of them."""
    for text in (KILLED, BUS_ERROR, TOO_MANY_FILES, CUDA_OOM):
        assert classify_text(text, where="loader").kind in RESOURCE_KINDS
    assert classify_exit(-9).kind in RESOURCE_KINDS
    for text in (SEGFAULT, TIMED_OUT, CUDA_FORK, PIN_THREAD):
        assert classify_text(text, where="loader").kind not in RESOURCE_KINDS


# -- the messages as torch produces them ----------------------------------------------------------


def _torch_chain(signal_text: str) -> BaseException:
    """A killed worker as torch 2.x usually reports it: its SIGCHLD handler raises the signal's
    text inside the queue read, which ``_try_get_data`` re-raises as "exited unexpectedly"."""
    try:
        try:
            raise RuntimeError(signal_text)
        except RuntimeError as cause:
            raise RuntimeError("DataLoader worker (pid(s) 2183) exited unexpectedly") from cause
    except RuntimeError as exc:
        return exc


@pytest.mark.parametrize(
    ("signal_text", "kind"),
    [(KILLED, "worker_killed"), (BUS_ERROR, "shm_exhausted"), (SEGFAULT, "worker_crashed")],
)
def test_classify_exception_looks_at_the_cause_of_exited_unexpectedly(
    signal_text: str, kind: str
) -> None:
    exc = _torch_chain(signal_text)
    failure = classify_exception(exc, where="loader")
    assert failure.kind == kind
    assert "exited unexpectedly" in failure.detail  # the whole traceback is kept


def test_chain_text_lists_the_exception_and_its_causes() -> None:
    text = failures.chain_text(_torch_chain(KILLED))
    first = "RuntimeError: DataLoader worker (pid(s) 2183) exited unexpectedly"
    assert text.splitlines()[0] == first
    assert f"RuntimeError: {KILLED}" in text


@pytest.mark.parametrize(
    ("signum", "kind"),
    [
        (signal.SIGKILL, "worker_killed"),
        (signal.SIGBUS, "shm_exhausted"),
        (signal.SIGSEGV, "worker_crashed"),
    ],
)
def test_classify_exception_with_dead_worker_signals(signum: int, kind: str) -> None:
    """When torch only says "exited unexpectedly", the workers' exit signals name the cause."""
    exc = _raised(RuntimeError("DataLoader worker (pid(s) 2183) exited unexpectedly"))
    assert classify_exception(exc, where="loader").kind == "worker_crashed"
    assert classify_exception(exc, where="loader", worker_signals=(signum,)).kind == kind


def test_signal_text_matches_torch_wording() -> None:
    assert failures.signal_text(signal.SIGKILL) == "killed by signal: Killed"
    assert failures.signal_text(signal.SIGBUS) == "killed by signal: Bus error"
    assert failures.signal_text(signal.SIGSEGV) == "killed by signal: Segmentation fault"
    assert KILLED.startswith(f"DataLoader worker (pid 2183) is {failures.signal_text(9)}")


# Run in a child process: torch's SIGCHLD handler for a killed worker may fire long after next()
# returned, and must not do so inside pytest.
_PRODUCE = """
import gc, json, sys
from torch.utils.data import DataLoader
from loadertune.measure import failures
from workloads import FaultDataset
out = {}
for fault in sys.argv[1:]:
    it = iter(DataLoader(FaultDataset(fault, at=0, n=8), batch_size=2, num_workers=1))
    try:
        next(it)
        out[fault] = None
    except Exception as exc:
        cause = exc.__cause__
        out[fault] = [f"{type(exc).__name__}: {exc}", str(cause) if cause is not None else "",
                      failures.chain_text(exc)]
    it._shutdown_workers()  # now, rather than whenever the iterator is collected
    del it
    gc.collect()
print(json.dumps(out))
"""


@pytest.mark.slow
def test_real_dataloader_failures() -> None:
    """Failures produced by a real DataLoader: the texts the classifier must recognise."""
    proc = subprocess.run(
        [sys.executable, "-c", _PRODUCE, "raise", "sigkill", "sigbus"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parent,
    )
    assert proc.returncode == 0, proc.stderr
    produced = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all(produced.values()), produced  # every fault made next() fail

    text, _, _ = produced["raise"]
    assert text.startswith("ValueError: Caught ValueError in DataLoader worker process 0.")
    failure = classify_text(text, where="loader")
    assert (failure.kind, failure.user_bug) == ("dataset_error", True)

    for fault, kind in (("sigkill", "worker_killed"), ("sigbus", "shm_exhausted")):
        text, cause, chain = produced[fault]
        # torch names the signal in the message itself or in its cause, depending on timing
        signal_text = cause if "killed by signal" in cause else text
        assert "killed by signal" in signal_text, produced[fault]
        assert classify_text(signal_text, where="loader").kind == kind
        assert classify_text(chain, where="loader").kind == kind  # what script mode sends


def test_a_rest_between_epochs_may_last_the_limits_rest_s_not_the_hang_limit() -> None:
    """A whole-epoch trial begun mid-epoch waits for the next epoch, after the loop's own rest
    (validation): it is allowed ``rest_s``; without it a rest ends the trial at ``hang_s``."""

    for rest_s, fails in ((1.0, False), (None, True)):
        with Supervisor(os.getpid(), limits=Limits(hang_s=0.05, rest_s=rest_s)) as sup:
            sup.event("first_batch")
            sup.event("rest")
            time.sleep(0.15)
            failure = sup.expired()
            assert (failure is not None) == fails, (rest_s, failure)
            if failure is not None:
                assert failure.kind == "timeout" and "went unused" in failure.message


def test_a_trial_process_gone_before_it_is_watched_is_an_empty_tree() -> None:
    """A launch's script can run out of epochs between two settings, and a fork server reaps
    it at once: watching its pid then must not raise (it ended a search with
    ``psutil.NoSuchProcess`` in a confirmation round); the trial learns of the end from the
    process's channel, as of any end."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    assert gone.wait() == 0  # reaped: no such process any more
    with Supervisor(gone.pid, limits=Limits(hang_s=5.0)) as sup:
        sup.sampler.window_started()
        time.sleep(0.3)
        usage = sup.window_ended()
    assert usage.n_workers == 0 and usage.cpu_percent_workers in (None, 0.0)


def test_a_script_that_printed_nothing_gets_no_empty_output_section() -> None:
    from loadertune.trials.script.reported import with_output

    assert with_output("advice", "") == "advice"
    assert with_output("advice", "  \n") == "advice"
    assert with_output("advice", "epoch 1\n") == "advice\n--- script output (tail) ---\nepoch 1\n"


def test_a_window_that_received_no_batch_is_a_failure_not_a_rate_of_zero() -> None:
    import dataclasses

    from test_report import _measurement

    from loadertune.config import Config
    from loadertune.trials.contract import TrialResult, empty_window

    def result(rate: float) -> TrialResult:
        m = dataclasses.replace(_measurement(rate), window_s=0.75)
        return TrialResult(Config(32, 27, 8), measurement=m)

    empty = empty_window(result(0.0))
    assert empty.status == "failed" and empty.failure is not None
    assert "received no batch in 0.75 s" in empty.failure.message
    assert empty_window(result(123.0)).status == "ok"
