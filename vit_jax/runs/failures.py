"""A run that cannot write its checkpoints or metrics (a full disk, no
permission, a storage service that keeps failing: paths.storage_failure)
stops with one message naming the cause (`stops_on_failure`); any other
error keeps its traceback."""

import contextlib

from vit_jax import errors, paths


@contextlib.contextmanager
def stops_on_failure(what, then=lambda: ""):
  """A storage failure inside becomes a RunError: "could not WHAT: CAUSE.
  Stopped; THEN. Free space ...". `then` says what was kept."""
  try:
    yield
  except Exception as e:  # pylint: disable=broad-except
    cause = paths.storage_failure(e)
    if cause is None:
      raise
    kept = then()
    raise errors.RunError(
        f"could not {what}: {cause}. Stopped{'; ' + kept if kept else ''}. "
        "Free space (or fix access) and run the same command to resume."
    ) from e
