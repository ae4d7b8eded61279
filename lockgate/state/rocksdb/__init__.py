"""The RocksDB keyed state backend: an embedded RocksDB per keyed operator and task,
incremental checkpoints with a changelog, local recovery (docs/state-backends.md)."""
