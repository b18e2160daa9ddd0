"""Measurement: the meter on the training loop, the process tree's resources, NVML, and what a
failure was. Leaves: nothing here imports the trials or the search."""
