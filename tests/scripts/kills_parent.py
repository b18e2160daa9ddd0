"""With 2 or more workers, a worker SIGKILLs the trial's main process (as the OOM killer would
pick it): the workers are left orphaned."""

import os
import signal

from torch.utils.data import DataLoader, get_worker_info

from _data import Latency


class Deadly(Latency):
    def __getitem__(self, i):
        info = get_worker_info()
        if info is not None and info.num_workers >= 2 and i > 100:
            os.kill(os.getppid(), signal.SIGKILL)
        return super().__getitem__(i)


for x, y in DataLoader(Deadly(), batch_size=16):
    pass
