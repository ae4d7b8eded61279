"""The Spark launcher: a job's tasks as one long-lived barrier stage of task hosts."""
