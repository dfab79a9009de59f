"""One writer per workdir: the run that trains in it holds WORKDIR/lock.json.

A second run on a held workdir stops before it writes anything, naming the
holder. A lock is stale, and taken over, when its holder is gone: on the
same host, when its process no longer exists (a kill -9, a crash); from
another host (a pod's other slice, a workdir on GCS), when its holder has
not renewed it for LEASE_SECONDS. A run that finds the lock of another
host renewed less than that ago waits for the lease to lapse, once, rather
than refusing: the holder may be its own predecessor, gone without
releasing it; if the holder renews it meanwhile, it is alive, and the run
stops. The holder renews it every RENEW_SECONDS from a thread of its own.
On a pod, process 0 holds the lock for the run's processes and tells
them whether it got it.

Taking the lock is a compare-and-swap: on a local disk, an exclusive
create; in a Cloud Storage bucket, a write on the condition that the
object's generation is still the one read (0: none), so that of runs
starting together exactly one holds it; its renewals and its removal are
conditioned on the generation it wrote.
"""

import contextlib
import json
import os
import socket
import sys
import threading
import time

import jax
from etils import epath
from jax.experimental import multihost_utils

from vit_jax import errors, paths

LOCK_FILE = "lock.json"
# Short, so that a run restarted on other hosts after its predecessor died
# without releasing the lock (a hard preemption) waits little.
LEASE_SECONDS = 180
RENEW_SECONDS = 30


class WorkdirLock:
  """`with WorkdirLock(workdir):` holds the workdir while the block runs;
  `wait`: for another host's lock to lapse (else refused at once)."""

  def __init__(self, workdir, wait=True):
    self._path = epath.Path(workdir) / LOCK_FILE
    self._me = {"host": socket.gethostname(), "pid": os.getpid(),
                "since": time.time()}
    self._wait = wait
    self._stop = threading.Event()
    self._renewer = None
    self._object = (_BucketObject(os.fspath(self._path))
                    if os.fspath(self._path).startswith("gs://") else None)
    self._seen = 0  # In a bucket: the generation last read (0: none).
    self._written = None  # In a bucket: the generation of our lock.

  def __enter__(self):
    try:
      return self._enter()
    except BaseException:
      # A signal (cli.signals.Stopped) or an error after our lock was
      # written but before `with` could call __exit__: the lock goes all
      # the same.
      self._stop.set()
      if jax.process_index() == 0 and self._held_by_me():
        self._remove()
      raise

  def _enter(self):
    holder = self._acquire() if jax.process_index() == 0 else None
    if jax.process_count() > 1:  # Every process stops, or none.
      refused = multihost_utils.broadcast_one_to_all(
          int(holder is not None))
      if refused and holder is None:
        holder = {"host": "?", "pid": "?", "since": 0}
    if holder is not None:
      raise errors.RunError(
          f"{self._path.parent} is in use by process {holder['pid']} on host "
          f"{holder['host']} (since {time.ctime(holder['since'])}): one run "
          f"at a time writes a workdir. If that run is gone for good, remove "
          f"{self._path}")
    if jax.process_index() == 0:
      self._renewer = threading.Thread(target=self._renew, daemon=True)
      self._renewer.start()
    return self

  def __exit__(self, *exc):
    if self._renewer is not None:
      self._stop.set()
      self._renewer.join()
      if self._held_by_me():
        self._remove()
    return False

  def _remove(self):
    if self._object is None:
      self._path.unlink(missing_ok=True)
    else:
      self._object.delete(self._written)

  def _acquire(self):
    """None when this process now holds the lock, else its live holder."""
    if self._object is None:  # A bucket has no folders to make.
      self._path.parent.mkdir(parents=True, exist_ok=True)
    waited = False
    for _ in range(3):  # Another run may take it over at the same moment.
      holder = self._read()
      if holder is not None and not self._stale(holder):
        if (waited or not self._wait
            or holder.get("host") == self._me["host"]):
          return holder
        self._wait_out(holder)
        waited = True
        holder = self._read()
        if holder is not None and not self._stale(holder):
          return holder
      if self._create(replace=holder is not None):
        return None
    return self._read() or {"host": "?", "pid": "?", "since": 0}

  def _create(self, replace):
    """Writes our lock; False when another process wrote one first."""
    text = json.dumps({**self._me, "renewed": time.time()})
    if self._object is not None:
      self._written = self._object.write(text, self._seen if replace else 0)
      return self._written is not None
    if not replace and not paths.is_url(self._path):
      # Exclusive creation, of a file already whole: of two runs starting at
      # once, one wins; and a signal that stops this one as its lock
      # appears finds the lock its own (to remove), never half written.
      temporary = f"{self._path}.{os.getpid()}.tmp"
      try:
        with open(temporary, "w") as f:
          f.write(text)
        _link_or_create(temporary, self._path, text)
      except FileExistsError:
        return False
      finally:
        with contextlib.suppress(FileNotFoundError):
          os.unlink(temporary)
    else:
      temporary = self._path.parent / f"{LOCK_FILE}.{os.getpid()}.tmp"
      temporary.write_text(text)
      temporary.replace(self._path)
    return self._held_by_me()

  def _read(self):
    try:
      if self._object is not None:
        text, self._seen = self._object.read()
        return None if text is None else json.loads(text)
      return json.loads(self._path.read_text())
    except FileNotFoundError:
      return None
    except ValueError:  # Half written by a holder killed mid-write.
      return {"host": "?", "pid": -1, "since": 0, "renewed": 0}

  def _wait_out(self, holder):
    """Sleeps until the lease of `holder`, another host's, has lapsed."""
    until = holder.get("renewed", 0) + LEASE_SECONDS + 1
    print(f"{self._path.parent} is held by process {holder.get('pid')} on "
          f"host {holder.get('host')}, whose lease lapses at "
          f"{time.ctime(until)} unless it is renewed: waiting for that (a "
          f"run restarted elsewhere finds its dead predecessor's lock)",
          file=sys.stderr, flush=True)
    time.sleep(max(0.0, until - time.time()))

  def _stale(self, holder):
    if holder.get("host") == self._me["host"] and isinstance(
        holder.get("pid"), int):
      # Our own pid in a lock we did not write: a dead process's, reused.
      return (holder["pid"] == self._me["pid"]
              or not _process_exists(holder["pid"]))
    return time.time() - holder.get("renewed", 0) > LEASE_SECONDS

  def _held_by_me(self):
    holder = self._read() or {}
    return (holder.get("host"), holder.get("pid"), holder.get("since")) == (
        self._me["host"], self._me["pid"], self._me["since"])

  def _renew(self):
    while not self._stop.wait(RENEW_SECONDS):
      if self._object is not None:
        # Ours only while its generation is the one we wrote.
        text = json.dumps({**self._me, "renewed": time.time()})
        self._written = self._object.write(text, self._written)
        if self._written is None:
          return
      elif self._held_by_me():
        temporary = self._path.parent / f"{LOCK_FILE}.{os.getpid()}.tmp"
        temporary.write_text(json.dumps({**self._me, "renewed": time.time()}))
        temporary.replace(self._path)


class _BucketObject:
  """The lock's object in a bucket, written and removed only on the
  condition that its generation is the one given: Cloud Storage's
  compare-and-swap."""

  def __init__(self, url):
    bucket, _, name = url[len("gs://"):].partition("/")
    self._bucket = paths.storage_client()[0].bucket(bucket)
    self._name = name

  def read(self):
    """(its text, its generation), or (None, 0) where there is none."""
    from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
    blob = self._bucket.blob(self._name)
    try:
      # One request: the text, and the generation it is (a header).
      return blob.download_as_text(), blob.generation
    except exceptions.NotFound:
      return None, 0

  def write(self, text, generation):
    """The generation written, or None where the object's generation is
    not `generation` (0: where there is an object)."""
    from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
    blob = self._bucket.blob(self._name)
    try:
      blob.upload_from_string(text, content_type="application/json",
                              if_generation_match=generation)
    except exceptions.PreconditionFailed:
      return None
    return blob.generation

  def delete(self, generation):
    """Removes it if its generation is still `generation`."""
    from google.api_core import exceptions  # pylint: disable=g-import-not-at-top
    with contextlib.suppress(exceptions.NotFound,
                             exceptions.PreconditionFailed):
      self._bucket.blob(self._name).delete(if_generation_match=generation)


def _link_or_create(whole, path, text):
  """`path` made a link to the written file `whole`; where the file system
  has no hard links (a FUSE mount of a bucket), created exclusively and
  written. FileExistsError if `path` exists."""
  try:
    os.link(whole, path)
  except FileExistsError:
    raise
  except OSError:
    with open(path, "x") as f:
      f.write(text)


def _process_exists(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # Another user's: it exists.
    return True
  return True
