"""Its workers get stuck in ``__getitem__`` for minutes: each writes its pid to
``$STUCK_PIDS_DIR`` first, so a test can find them (issue 14: SIGKILL the CLI, no worker lives on).
"""

import os
import time

import torch
from torch.utils.data import DataLoader, Dataset


def note_pid(worker_id: int) -> None:
    """The script's own worker_init_fn: still called, and picklable (spawn, forkserver)."""
    os.environ["STUCK_WORKER_ID"] = str(worker_id)


class Stuck(Dataset):
    def __len__(self) -> int:
        return 1000

    def __getitem__(self, i: int):
        name = os.path.join(os.environ["STUCK_PIDS_DIR"], str(os.getpid()))
        with open(name, "w") as fh:
            fh.write(os.environ.get("STUCK_WORKER_ID", "no worker_init_fn"))
        time.sleep(600)  # far longer than torch's own 5 s check of its parent, which never runs
        return torch.zeros(4)


if __name__ == "__main__":  # spawned workers import this file
    if os.environ.get("STUCK_AFTER_ANOTHER"):  # a quick loader first (`run --tune` tunes it)
        for x in DataLoader(torch.arange(64.0), batch_size=8):
            pass
    context = os.environ.get("STUCK_CONTEXT") or None  # fork (default), spawn, forkserver
    for x in DataLoader(
        Stuck(),
        batch_size=4,
        num_workers=2,
        worker_init_fn=note_pid,
        multiprocessing_context=context,
    ):
        pass
