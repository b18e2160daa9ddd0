"""What a search leaves: the recommendation, the analysis behind it (bottleneck, advice), and
the recommendation file (``loadertune.json``) with the keys it files workloads under.
"""
