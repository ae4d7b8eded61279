"""Nexmark on Lockgate: a deterministic event generator as a replayable
source with splits, the queries q0, q1, q2, q3, q5, q7 and q8, their
references in plain Python, and a runner (``python3 -m benchmarks.nexmark``).
See ``README.md`` of this folder."""
