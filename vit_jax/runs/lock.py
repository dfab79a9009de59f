"""One writer per workdir: the run that trains in it holds WORKDIR/lock.json.

A second run on a held workdir stops before it writes anything, naming the
holder. A lock is stale, and taken over, when its holder is gone: on the
same host, when its process no longer exists (a kill -9, a crash); from
another host (a pod's other slice, a workdir on GCS), when its holder has
not renewed it for LEASE_SECONDS. The holder renews it every
RENEW_SECONDS from a thread of its own. On a pod, process 0 holds the lock
for the run's processes and tells them whether it got it.
"""

import contextlib
import json
import os
import socket
import threading
import time

import jax
from etils import epath
from jax.experimental import multihost_utils

from vit_jax import errors, paths

LOCK_FILE = "lock.json"
LEASE_SECONDS = 600
RENEW_SECONDS = 60


class WorkdirLock:
  """`with WorkdirLock(workdir):` holds the workdir while the block runs."""

  def __init__(self, workdir):
    self._path = epath.Path(workdir) / LOCK_FILE
    self._me = {"host": socket.gethostname(), "pid": os.getpid(),
                "since": time.time()}
    self._stop = threading.Event()
    self._renewer = None

  def __enter__(self):
    try:
      return self._enter()
    except BaseException:
      # A signal (cli.Stopped) or an error after our lock was written but
      # before `with` could call __exit__: the lock goes all the same.
      self._stop.set()
      if jax.process_index() == 0 and self._held_by_me():
        self._path.unlink(missing_ok=True)
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
        self._path.unlink(missing_ok=True)
    return False

  def _acquire(self):
    """None when this process now holds the lock, else its live holder."""
    self._path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(3):  # Another run may take it over at the same moment.
      holder = self._read()
      if holder is not None and not self._stale(holder):
        return holder
      if self._create(replace=holder is not None):
        return None
    return self._read() or {"host": "?", "pid": "?", "since": 0}

  def _create(self, replace):
    """Writes our lock; False when another process wrote one first."""
    text = json.dumps({**self._me, "renewed": time.time()})
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
      return json.loads(self._path.read_text())
    except FileNotFoundError:
      return None
    except ValueError:  # Half written by a holder killed mid-write.
      return {"host": "?", "pid": -1, "since": 0, "renewed": 0}

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
      if self._held_by_me():
        temporary = self._path.parent / f"{LOCK_FILE}.{os.getpid()}.tmp"
        temporary.write_text(json.dumps({**self._me, "renewed": time.time()}))
        temporary.replace(self._path)


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
