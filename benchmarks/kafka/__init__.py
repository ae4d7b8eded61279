"""Workload W3 (Kafka → running sums → Kafka) and its latency benchmark."""

import os

BROKER_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else None
"""Where the benchmarks' own broker keeps its data: in memory, so that its
writes do not share the disk with the job's checkpoints (noida-db keeps its
topics in memory too: the benchmarks delete theirs after each round)."""
