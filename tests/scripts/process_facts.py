"""Records what its process looks like to a script, one JSON line per start in the file argv[1]:
its pid and parent, its name, argv, a variable of the environment, the first draws of `random`
and numpy's global generator, then trains over a short loader."""

import json
import os
import random
import sys

import numpy as np
from torch.utils.data import DataLoader

from _data import Latency

facts = {
    "pid": os.getpid(),
    "ppid": os.getppid(),
    "name": __name__,
    "argv": sys.argv,
    "marker": os.environ.get("PROCESS_FACTS_MARKER"),
    "random": random.random(),
    "numpy": float(np.random.rand()),
    "stdin_closed": sys.stdin.read() == "",
}
with open(sys.argv[1], "a") as fh:
    fh.write(json.dumps(facts) + "\n")
print("process_facts: started")  # to the launch's log

loader = DataLoader(Latency(n=400), batch_size=16)
for epoch in range(50):
    for x, y in loader:
        pass
