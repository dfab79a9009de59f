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
import sys
import tempfile

from etils import epath

from vit_jax import errors


def is_url(path):
  """True for `gs://...` and other `scheme://` paths, False for local ones."""
  return "://" in os.fspath(path)


def path(p):
  """`p` (a str or Path, local or URL) as an epath.Path."""
  return epath.Path(p)


def join(base, *parts):
  """`base` joined with `parts`, as a str; a URL stays a URL."""
  return os.fspath(epath.Path(base).joinpath(*parts))


# How long a tool waits for Cloud Storage to answer before it says that it
# cannot reach it (transient failures retried within it).
REACH_SECONDS = 30


def check_reachable(given, flag, writes=False):
  """Refuses `given`, a path (or a list of them) the user gave as `flag`,
  when it is a `gs://` URL whose bucket does not exist, may not be listed
  with this host's credentials, or does not answer within REACH_SECONDS;
  where the tool `writes` there, also when the credentials may not create
  objects in it. A local path passes, as does None (a flag not given).
  Asked once, before anything reads or writes there: TensorFlow's client
  asks again and again for a bucket that is not there, and a run that may
  not write would fail at its first checkpoint."""
  for p in given if isinstance(given, list) else [given]:
    p = os.fspath(p or "")
    if p.startswith("gs://"):
      bucket, _, prefix = p[len("gs://"):].partition("/")
      problem = _bucket_problem(bucket, prefix) or (
          writes and _write_problem(bucket))
      if problem:
        raise errors.InputError(f"{flag}={p}: {problem}")


def storage_client():
  """(a google-cloud-storage Client with this host's credentials, whether
  it is anonymous): without credentials, anonymous, as TensorFlow's client
  is (a public bucket reads)."""
  # Imported here: a tool given no gs:// path does without them.
  # pylint: disable=g-import-not-at-top
  from google.auth import exceptions as auth_exceptions
  from google.cloud import storage
  # pylint: enable=g-import-not-at-top
  try:
    return storage.Client(), False
  except auth_exceptions.DefaultCredentialsError:
    return storage.Client.create_anonymous_client(), True


def _bucket_problem(bucket, prefix):
  """What stops this host from listing `prefix` in gs://`bucket`, in a few
  words; None when nothing does."""
  # Imported here: a tool given no gs:// path does without them.
  # pylint: disable=g-import-not-at-top
  from google.api_core import exceptions, retry as retries
  from google.cloud.storage import retry as storage_retry
  # pylint: enable=g-import-not-at-top

  said = []

  def say_retrying(error):
    if not said:
      said.append(error)
      print(f"Cloud Storage did not answer for gs://{bucket} "
            f"({type(error).__name__}); retrying for up to "
            f"{REACH_SECONDS} s", file=sys.stderr, flush=True)

  retry = retries.Retry(predicate=storage_retry._should_retry,  # pylint: disable=protected-access
                        initial=1.0, maximum=8.0, timeout=REACH_SECONDS,
                        on_error=say_retrying)
  client, anonymous = storage_client()
  try:
    next(iter(client.list_blobs(bucket, prefix=prefix, max_results=1,
                                timeout=min(10, REACH_SECONDS),
                                retry=retry)), None)
  except exceptions.NotFound:
    return f"there is no bucket gs://{bucket}"
  except (exceptions.Forbidden, exceptions.Unauthorized) as e:
    if anonymous:
      return (f"this host has no credentials for Cloud Storage (`gcloud "
              f"auth application-default login`, or a service account), "
              f"and gs://{bucket} may not be listed without ({e.code})")
    return (f"these credentials may not list gs://{bucket} "
            f"({e.code}: {e.message})")
  except exceptions.RetryError as e:
    return (f"Cloud Storage did not answer for gs://{bucket} within "
            f"{REACH_SECONDS} s ({_innermost(e.cause)})")
  except exceptions.GoogleAPICallError as e:
    return f"Cloud Storage refused to list gs://{bucket} ({e})"
  return None


# What a tool that writes to a bucket does there: writes objects, and
# replaces them (an atomic write deletes its temporary; a lock is renewed).
WRITE_PERMISSIONS = ("storage.objects.create", "storage.objects.delete")


def _write_problem(bucket):
  """What stops this host's credentials from writing to gs://`bucket`
  (which answers), in a few words; None when nothing does, or where the
  service cannot say (a local emulator has no permissions to test)."""
  # pylint: disable-next=g-import-not-at-top
  from google.api_core import exceptions
  client, anonymous = storage_client()
  try:
    granted = set(client.bucket(bucket).test_iam_permissions(
        list(WRITE_PERMISSIONS), timeout=min(10, REACH_SECONDS)))
  except exceptions.GoogleAPICallError:
    return None  # Asked as a courtesy: the first write will say.
  missing = [name for name in WRITE_PERMISSIONS if name not in granted]
  if not missing:
    return None
  who = ("this host, which has no credentials for Cloud Storage,"
         if anonymous else "these credentials")
  return (f"{who} may not write to gs://{bucket} (not granted "
          f"{', '.join(missing)})")


def _innermost(error):
  """The last cause that `error`'s message names (urllib3 nests them as
  "Caused by ..."), cut to a line's length."""
  text = str(error).rsplit("Caused by ", 1)[-1].rstrip(")")
  return text if len(text) <= 200 else text[:197] + "..."


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
