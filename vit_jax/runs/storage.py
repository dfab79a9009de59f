"""Failures of storage, told apart from bugs: a full disk, no permission, a
storage service that keeps failing (transient errors were retried by
tensorstore and TensorFlow first).

A run that cannot write its checkpoints or metrics stops with one message
naming the cause (`stops_on_failure`); any other error keeps its traceback.
"""

import contextlib
import errno
import os
import re

from vit_jax import errors

FAILING_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM,
                  errno.EROFS, errno.EIO}
# Status names of tensorstore's and cloud storage's errors.
FAILING_STATUSES = ("RESOURCE_EXHAUSTED", "PERMISSION_DENIED",
                    "UNAUTHENTICATED", "UNAVAILABLE", "DEADLINE_EXCEEDED",
                    "DATA_LOSS")


def failure(exception):
  """Why `exception` (or one it was raised from) is a failure of storage,
  in a few words; None when it is not one."""
  seen = set()
  while exception is not None and id(exception) not in seen:
    seen.add(id(exception))
    if isinstance(exception, OSError) and exception.errno in FAILING_ERRNOS:
      return os.strerror(exception.errno)
    text = str(exception)
    # Tensorstore names the errno; TensorFlow's file errors only say it.
    code = re.search(r"os_error_code='(\d+)'", text)
    if code and int(code.group(1)) in FAILING_ERRNOS:
      return os.strerror(int(code.group(1)))
    for number in sorted(FAILING_ERRNOS):
      if os.strerror(number) in text:
        return os.strerror(number)
    status = re.search(r"\b(" + "|".join(FAILING_STATUSES) + r")\b", text)
    if status:
      return f"{status.group(1)} from storage: {text.splitlines()[0][:200]}"
    exception = exception.__cause__ or exception.__context__
  return None


@contextlib.contextmanager
def stops_on_failure(what, then=lambda: ""):
  """A storage failure inside becomes a RunError: "could not WHAT: CAUSE.
  Stopped; THEN. Free space ...". `then` says what was kept."""
  try:
    yield
  except Exception as e:  # pylint: disable=broad-except
    cause = failure(e)
    if cause is None:
      raise
    kept = then()
    raise errors.RunError(
        f"could not {what}: {cause}. Stopped{'; ' + kept if kept else ''}. "
        "Free space (or fix access) and run the same command to resume."
    ) from e
