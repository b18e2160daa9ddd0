"""Hot swapping: many settings in one pass over the data, the setting of the loader under a
running loop changed between segments of an epoch. Runs in the user's process, driven by a
script trial's child (:mod:`loadertune.trials.inside.sequence`) or by the live run
(:mod:`loadertune.trials.hotswap.live_runner`, for ``tuned()`` and ``loadertune run --tune``).
"""
