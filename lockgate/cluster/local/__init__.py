"""The local launcher: one process per task, forked by a fork server of the driver's."""
