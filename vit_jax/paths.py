"""The one path layer: every path a user gives may be a local path or a URL
(`gs://BUCKET/...`), and is read and written through here or epath.

etils.epath speaks both (TensorFlow's gfile for gs://, which TFDS, CLU and
orbax use too). What this module adds is what epath leaves to its caller:
replacing a file whole, handing a library that wants a local file name one
(safetensors, matplotlib, zip writers), and printing a path as the user
can use it. Paths stay as the user gave them: a URL is never made
"absolute", which would turn `gs://B/x` into `./gs:/B/x`.
"""

import contextlib
import errno
import os
import re
import shutil
import tempfile

from etils import epath


def is_url(path):
  """True for `gs://...` and other `scheme://` paths, False for local ones."""
  return "://" in os.fspath(path)


def path(p):
  """`p` (a str or Path, local or URL) as an epath.Path."""
  return epath.Path(p)


def join(base, *parts):
  """`base` joined with `parts`, as a str; a URL stays a URL."""
  return os.fspath(epath.Path(base).joinpath(*parts))


def shown(p):
  """`p` as a user can paste it into a command: a local path absolute, a
  URL as it is."""
  return os.fspath(p) if is_url(p) else os.path.abspath(os.fspath(p))


def write_atomically(target, data):
  """Replaces the file at `target` with `data` (str or bytes): a reader or
  a crash sees the old file or the new one, never a part."""
  if isinstance(data, str):
    data = data.encode()
  with writing(target) as local:
    with open(local, "wb") as f:  # A local temporary file, never the target.
      f.write(data)


@contextlib.contextmanager
def writing(target):
  """`with writing(target) as local:` write the file `local` (a local file
  name); when the block ends without an error it replaces `target` whole,
  else `target` is left as it was and `local` is removed.

  A local target's temporary file sits beside it (a rename within one file
  system is atomic). A URL's is written to a local temporary file and then
  copied up in one object write, which a store like GCS makes atomic. An
  OSError on the way (a full disk) is raised again naming `target`, not
  the temporary file (vit_jax.cli prints "TARGET: No space left on
  device")."""
  target = os.fspath(target)
  try:
    with _replacing(target) as local:
      yield local
  except OSError as e:
    if e.errno is None or e.filename == target:
      raise
    raise OSError(e.errno, e.strerror or os.strerror(e.errno), target) from e


@contextlib.contextmanager
def _replacing(target):
  """`writing`'s work, its errors as they come."""
  if is_url(target):
    directory = tempfile.mkdtemp(prefix="vit_jax_upload_")
    local = os.path.join(directory, os.path.basename(target.rstrip("/")))
  else:
    directory = None
    os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
    local = f"{target}.tmp-{os.getpid()}"
  try:
    yield local
    if directory is None:
      os.replace(local, target)
    else:  # One upload: a bucket has no folders to make first.
      epath.Path(local).copy(epath.Path(target), overwrite=True)
  finally:
    if directory is None:
      with contextlib.suppress(FileNotFoundError):
        os.remove(local)
    else:
      shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def local_copy(source):
  """`with local_copy(source) as local:` a local file name holding the file
  at `source`: `source` itself when it is local, else a temporary copy
  (for readers such as safetensors' that take only local files)."""
  source = os.fspath(source)
  if not is_url(source):
    yield source
    return
  directory = tempfile.mkdtemp(prefix="vit_jax_download_")
  try:
    local = os.path.join(directory, os.path.basename(source.rstrip("/")))
    epath.Path(source).copy(epath.Path(local))
    yield local
  finally:
    shutil.rmtree(directory, ignore_errors=True)


def free_bytes(local):
  """The bytes free on the disk of the local path `local` (or of its
  nearest parent that exists)."""
  local = os.path.abspath(os.fspath(local))
  while not os.path.exists(local):
    local = os.path.dirname(local)
  return shutil.disk_usage(local).free


def describe_bytes(count):
  """`count` bytes for a person: "640 kB", "3.2 MB", "1.4 GB"."""
  for unit, size in (("GB", 1e9), ("MB", 1e6)):
    if count >= size:
      return f"{count / size:,.1f} {unit}"
  return f"{count / 1e3:,.0f} kB"


# Failures of storage, told apart from bugs: a full disk, no permission, a
# storage service that keeps failing (tensorstore and TensorFlow retry
# transient errors before they raise).
FAILING_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM,
                  errno.EROFS, errno.EIO}
# Status names of tensorstore's and cloud storage's errors.
FAILING_STATUSES = ("RESOURCE_EXHAUSTED", "PERMISSION_DENIED",
                    "UNAUTHENTICATED", "UNAVAILABLE", "DEADLINE_EXCEEDED",
                    "DATA_LOSS")


def storage_failure(exception):
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
