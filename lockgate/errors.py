"""Errors Lockgate raises on purpose. Each message names the problem and the fix."""


class LockgateError(Exception):
    """Base of every error Lockgate raises on purpose."""


class PipelineDefinitionError(LockgateError):
    """The pipeline as written cannot run (bad uid, parallelism, guarantee...)."""


class CheckpointCorruptError(LockgateError):
    """A checkpoint or savepoint cannot be read back as it was written."""


class JobFailedError(LockgateError):
    """The job failed and the restart strategy gave up."""


class AuthenticationError(LockgateError):
    """A peer failed the HMAC challenge on the job secret."""


class ConfigurationError(LockgateError):
    """A setting cannot work (an unwritable folder, ...): restarting cannot help."""


class SavepointMismatchError(LockgateError):
    """A checkpoint or savepoint does not belong to the job it is restored
    into in a way that would lose output (a sink that moved)."""


class OutputLostError(LockgateError):
    """Output a completed checkpoint committed is gone (deleted outside Lockgate)."""


class UserFunctionError(LockgateError):
    """A user function raised; the message names the operator. The job restarts
    under its restart strategy (the failure may be transient)."""

    where: str | None = None
    """Which input it was processing: the task's input records, the first of them."""


class UnsendableRecordError(UserFunctionError):
    """An operator emitted a record that cannot be pickled to the next task:
    the same input emits it again after a restart, so the job fails at once."""


class JobInterrupted(SystemExit):
    """Ctrl-C ended the job (cleanly: the committed output is what its latest
    completed checkpoint committed). A ``SystemExit`` with code 130, so that
    ``python app.py`` ends quietly with the shell's code for Ctrl-C; catch it
    to go on after an interrupted ``Pipeline.run()``."""

    def __init__(self, job_id: str, checkpoint: str | None) -> None:
        super().__init__(130)
        self.job_id = job_id
        self.checkpoint = checkpoint
        """The latest completed checkpoint (None: none completed)."""
