"""The user paths of the weights, data and analysis wings on gs://: each
read or written in a local Cloud Storage (tests/conftest.py's `gcs_bucket`)
gives what the same files give locally; what cannot work there is refused
in one line; a write that fails keeps the old file."""

import contextlib
import errno
import http.server
import json
import os
import pathlib
import signal
import socket
import threading
import time
import types

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf
from etils import epath
from safetensors.numpy import load_file, save_file

from tests.test_folder_dataset import CLASSES, make_folder, write_image
from tests.test_torch_interchange import (
  HEADS,
  hf_config,
  hf_shapes,
  random_tensors,
  timm_shapes,
  write_hf_dir,
)
from tests.util import call_tool, main_flags, randomize, stored_examples
from vit_jax import errors, models, paths
from vit_jax.analysis import attention as attention_lib
from vit_jax.cli import signals
from vit_jax.data import folder, image_files, random_access, sources
from vit_jax.weights import (
  exports,
  function_exports,
  npz as npz_lib,
  pretrained,
)
from vit_jax.weights.pytorch import files, hf


def upload(local, url):
  """Copies the files under the local folder `local` to `url`; returns
  `url`."""
  for path in sorted(pathlib.Path(local).rglob("*")):
    if path.is_file():
      epath.Path(path).copy(
          epath.Path(url) / path.relative_to(local).as_posix(), overwrite=True)
  return url


def objects(url):
  """The names of the files under `url`, relative to it."""
  from tests import gcs  # pylint: disable=g-import-not-at-top
  prefix = url[len("gs://"):].partition("/")[2].strip("/")
  prefix = prefix + "/" if prefix else ""
  # Less the empty "folder/" objects that tf.io.gfile's makedirs leaves.
  return [name[len(prefix):] for name in gcs.list_objects(url)
          if not name.endswith("/")]


def flat(params):
  return flax.traverse_util.flatten_dict(params, sep="/")


def assert_same_params(got, expected):
  got, expected = flat(got), flat(expected)
  assert sorted(got) == sorted(expected)
  for key, value in expected.items():
    np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(value),
                                  err_msg=key)


def assert_same_checkpoint(got, expected):
  assert_same_params(got.params, expected.params)
  assert (got.function, got.class_names) == (expected.function,
                                             expected.class_names)


def test_hf_directories_and_timm_files_in_a_bucket_load_as_locally(
    tmp_path, gcs_bucket):
  tensors = random_tensors(hf_shapes())
  local = write_hf_dir(tmp_path / "hf", tensors, hf_config())
  url = upload(local, f"{gcs_bucket}/hf")
  assert hf.is_hf_dir(url)
  assert_same_checkpoint(pretrained.load(url), pretrained.load(local))

  # Shards listed in an index.
  names = sorted(tensors)
  shards = {"model-00001-of-00002.safetensors": names[:len(names) // 2],
            "model-00002-of-00002.safetensors": names[len(names) // 2:]}
  sharded = tmp_path / "sharded"
  write_hf_dir(sharded, {}, hf_config())
  os.remove(sharded / "model.safetensors")
  for shard, keys in shards.items():
    save_file({key: tensors[key] for key in keys}, str(sharded / shard))
  (sharded / "model.safetensors.index.json").write_text(json.dumps(
      {"weight_map": {key: shard for shard, keys in shards.items()
                      for key in keys}}))
  url = upload(sharded, f"{gcs_bucket}/sharded")
  assert_same_checkpoint(pretrained.load(url), pretrained.load(local))

  timm = tmp_path / "timm" / "timm.safetensors"
  timm.parent.mkdir()
  save_file(random_tensors(timm_shapes()), str(timm))
  url = upload(timm.parent, f"{gcs_bucket}/timm") + "/timm.safetensors"
  assert_same_checkpoint(pretrained.load(url, HEADS),
                         pretrained.load(str(timm), HEADS))


def test_what_a_bucket_does_not_hold_is_named(tmp_path, gcs_bucket):
  pickled = tmp_path / "pickled"
  pickled.mkdir()
  (pickled / "config.json").write_text(json.dumps(hf_config()))
  (pickled / "pytorch_model.bin").write_bytes(b"\x80\x02not to be unpickled")
  url = upload(pickled, f"{gcs_bucket}/pickled")
  with pytest.raises(errors.InputError, match="never loads") as raised:
    pretrained.load(url)
  assert f"{url}/pytorch_model.bin" in str(raised.value)
  missing = f"{gcs_bucket}/none.safetensors"
  with pytest.raises(errors.InputError, match=f"{missing} does not exist"):
    pretrained.load(missing, HEADS)


def model_params(seed=0):
  model = models.create("Ti/4", num_classes=3, hidden_size=16, num_layers=2,
                        mlp_dim=32, num_heads=2)
  return randomize(nn.meta.unbox(model.init(
      jax.random.key(seed), jnp.zeros((1, 8, 8, 3)), train=False)["params"]),
                   seed)


def test_save_npz_to_a_bucket_round_trips(gcs_bucket):
  params = model_params()
  url = f"{gcs_bucket}/weights/model.npz"
  npz_lib.save_npz(params, url)
  assert objects(gcs_bucket) == ["weights/model.npz"]  # Nothing beside it.
  assert_same_params(npz_lib.load_npz(url), params)
  npz_lib.save_npz(model_params(seed=1), url)  # Replaced whole.
  assert_same_params(npz_lib.load_npz(url), model_params(seed=1))


def test_hf_and_timm_exports_to_a_bucket_load_back(tmp_path, gcs_bucket):
  source = write_hf_dir(tmp_path / "hf", random_tensors(hf_shapes()),
                        hf_config("gelu_pytorch_tanh", 1e-6))
  loaded = pretrained.load(source)

  url = f"{gcs_bucket}/export/hf"
  how = exports.write(loaded, "hf", url)
  assert objects(url) == ["config.json", "model.safetensors"]
  assert f"gsutil -m cp -r {url} ." in how and "from_pretrained('hf')" in how
  assert_same_checkpoint(pretrained.load(url), loaded)
  local = str(tmp_path / "hf_local")
  exports.write(loaded, "hf", local)
  for name in ("config.json", "model.safetensors"):
    assert epath.Path(url, name).read_bytes() == (
        pathlib.Path(local, name).read_bytes()), name

  url = f"{gcs_bucket}/export/timm.safetensors"
  how = exports.write(loaded, "timm", url)
  assert f"gsutil cp {url} ." in how and "load_file('timm.safetensors')" in how
  local = str(tmp_path / "timm.safetensors")
  exports.write(loaded, "timm", local)
  assert epath.Path(url).read_bytes() == pathlib.Path(local).read_bytes()
  again = pretrained.load(url, HEADS)
  assert_same_params(again.params, pretrained.load(local, HEADS).params)
  for key, value in load_file(local).items():
    np.testing.assert_array_equal(files.read_safetensors(url)[key],
                                  value)

  # The standalone serving.py reads local files: the hint copies first,
  # and vit_jax's own loader reads the bucket.
  url = f"{gcs_bucket}/export/model.stablehlo"
  how = exports.write(loaded, "stablehlo", url)
  assert (f"gsutil cp {url} ." in how
          and "serving.load('model.stablehlo')" in how
          and f"--from={url} " in how), how
  local = str(tmp_path / "model.stablehlo")
  exports.write(loaded, "stablehlo", local)
  assert (function_exports.load_stablehlo(url).signature
          == function_exports.load_stablehlo(local).signature)


def write_pngs(directory, count=3):
  rng = np.random.default_rng(0)
  directory.mkdir(parents=True, exist_ok=True)
  for i in range(count):
    pixels = rng.integers(0, 256, (10 + i, 12, 3), np.uint8)
    (directory / f"{i}.png").write_bytes(tf.io.encode_png(pixels).numpy())
  (directory / "notes.txt").write_text("not an image")


def test_images_and_labels_from_a_bucket_are_read_as_locally(tmp_path,
                                                             gcs_bucket):
  local = tmp_path / "images"
  write_pngs(local)
  (tmp_path / "labels.txt").write_text("cat\n\ndog\n  bird \n")
  upload(tmp_path, gcs_bucket)
  url = f"{gcs_bucket}/images"

  files = image_files.expand([url])
  assert files == [f"{url}/{i}.png" for i in range(3)]
  assert image_files.expand([f"{url}/1.png", f"{url}/*.png"]) == (
      [f"{url}/1.png"] + files)
  np.testing.assert_array_equal(
      image_files.from_files(files, 8, 0.875),
      image_files.from_files(image_files.expand([str(local)]), 8, 0.875))
  assert image_files.name_classes(f"{gcs_bucket}/labels.txt") == (
      image_files.name_classes(str(tmp_path / "labels.txt"))) == [
          "cat", "dog", "bird"]
  with pytest.raises(errors.InputError, match="no image at"):
    image_files.expand([f"{gcs_bucket}/nothing/*.png"])
  with pytest.raises(errors.InputError, match="labels.txt does not exist"):
    image_files.name_classes(f"{gcs_bucket}/nothing/labels.txt")


def test_a_folder_dataset_in_a_bucket_reads_as_its_local_copy(
    tmp_path, gcs_bucket):
  local = str(tmp_path / "fruit")
  make_folder(local)
  # Ignored in a bucket as locally: a hidden file, another extension.
  write_image(os.path.join(local, "train", "apple", ".hidden.png"), 0,
              (2, 2), "rgb")
  pathlib.Path(local, "test", "cherry", "notes.txt").write_text("ignored")
  # A file that does not decode: left out and listed, as locally.
  pathlib.Path(local, "train", "banana", "broken.png").write_bytes(b"\x89PNG")
  url = upload(local, f"{gcs_bucket}/images/fruit")
  data_dir = str(tmp_path / "data")

  remote = sources.get_builder(folder.PREFIX + url, data_dir)
  here = sources.get_builder(folder.PREFIX + local, data_dir)
  assert remote.builder_config.root == url  # As given: no local path.
  assert remote.builder_config.name.startswith("fruit-")
  assert remote.info.features["label"].names == CLASSES == (
      here.info.features["label"].names)
  for split in ("train", "test"):
    assert remote.info.splits[split].num_examples == (
        here.info.splits[split].num_examples)
    assert sorted((example["image"], example["label"]) for example in
                  stored_examples(remote, split)) == sorted(
                      (example["image"], example["label"])
                      for example in stored_examples(here, split))
  assert folder.broken_files(remote) == folder.broken_files(here) != []
  assert folder.broken_files(remote)[0][0] == "train/banana/broken.png"

  with pytest.raises(errors.InputError, match="not a directory"):
    sources.get_builder(folder.PREFIX + f"{gcs_bucket}/absent", data_dir)


def test_digits_prepared_into_a_bucket_is_refused_in_one_line(gcs_bucket):
  data_dir = f"{gcs_bucket}/tensorflow_datasets"
  for dataset in ("digits", "digits/0to4"):
    with pytest.raises(errors.InputError) as raised:
      sources.get_builder(dataset, data_dir)
    message = str(raised.value)
    assert "\n" not in message
    assert f"data_dir {data_dir}:" in message and "ArrayRecord" in message
  assert objects(gcs_bucket) == []  # Nothing half written.


def test_a_folder_prepared_into_a_bucket_is_refused_in_one_line(tmp_path,
                                                                gcs_bucket):
  local = str(tmp_path / "fruit")
  make_folder(local, single_split=True)
  data_dir = f"{gcs_bucket}/tensorflow_datasets"
  with pytest.raises(errors.InputError, match=f"data_dir {data_dir}: "):
    sources.get_builder(folder.PREFIX + local, data_dir)
  assert objects(gcs_bucket) == []


def test_a_dataset_prepared_in_a_bucket_reads_as_locally(
    gcs_bucket, digits_tfrecord_data_dir, digits_data_dir):
  """A data_dir in a bucket holding a prepared copy (as `gsutil -m cp -r`
  puts one there): TFRecord is read, the same examples as locally;
  ArrayRecord is refused by name (array_record reads local files only)."""
  data_dir = upload(digits_tfrecord_data_dir, f"{gcs_bucket}/tfrecord")
  remote = sources.get_builder("digits", data_dir)
  assert remote.data_dir.startswith(data_dir)
  here = sources.get_builder("digits", digits_tfrecord_data_dir)
  for split in ("train", "test"):
    got = stored_examples(remote, split)
    assert len(got) == here.info.splits[split].num_examples
    for example, expected in zip(got, stored_examples(here, split),
                                 strict=True):
      assert (example["image"], example["label"]) == (expected["image"],
                                                      expected["label"])
  data_dir = upload(digits_data_dir, f"{gcs_bucket}/array_record")
  source = sources.lookup("digits", data_dir)
  with pytest.raises(errors.InputError, match="local paths only"):
    random_access.Records(source, "train")


def test_figures_written_to_a_bucket_land_there(tmp_path, gcs_bucket):
  model = models.create("B/8", num_classes=3, hidden_size=24, num_layers=2,
                        mlp_dim=48, num_heads=3)
  params = randomize(model.init(jax.random.key(0), jnp.zeros((1, 16, 16, 3)),
                                train=False)["params"])
  npz_lib.save_npz(params, tmp_path / "model.npz")
  inference = pretrained.for_inference(str(tmp_path / "model.npz"))
  images = np.random.default_rng(0).integers(0, 256, (2, 16, 16, 3),
                                             np.uint8)
  out = f"{gcs_bucket}/run/figures"
  written = attention_lib.write_all(inference, out, (images, None, "noise"),
                                    rollout_images=2)
  names = ["attention_rollout.png", "embedding_filters.png",
           "mean_attention_distance.png", "patch_components.png",
           "position_embedding_similarity.png"]
  assert sorted(written) == [f"{out}/{name}" for name in names]
  assert objects(out) == names
  for path in written:
    image = tf.io.decode_png(epath.Path(path).read_bytes())
    assert image.shape[0] > 100, path


def half_a_file_then_a_full_disk(target):
  """Writes part of a file to `target` (a name or a file object), then
  fails as a full disk does."""
  if isinstance(target, (str, os.PathLike)):
    with open(target, "wb") as f:
      f.write(b"half a file")
  else:
    target.write(b"half a file")
  raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("writer", ["npz", "timm"])
def test_a_write_that_fails_keeps_the_old_file_whole(tmp_path, monkeypatch,
                                                     writer):
  if writer == "npz":
    path = str(tmp_path / "model.npz")
    npz_lib.save_npz(model_params(), path)
    monkeypatch.setattr(np, "savez",
                        lambda f, **_: half_a_file_then_a_full_disk(f))

    def write():
      npz_lib.save_npz(model_params(seed=1), path)
  else:
    path = str(tmp_path / "model.safetensors")
    tensors = random_tensors(timm_shapes())
    files.write_safetensors(tensors, path)
    monkeypatch.setattr(
        files.safetensors.numpy, "save_file",
        lambda _, name, metadata=None: half_a_file_then_a_full_disk(name))

    def write():
      files.write_safetensors(random_tensors(timm_shapes(), seed=1),
                              path)
  before = pathlib.Path(path).read_bytes()
  with pytest.raises(OSError) as raised:
    write()
  assert raised.value.errno == errno.ENOSPC
  if writer == "npz":  # Named by the path given, as the tools print it.
    assert raised.value.filename == path
  assert pathlib.Path(path).read_bytes() == before
  assert os.listdir(tmp_path) == [os.path.basename(path)]  # No temporary.
  if writer == "npz":
    assert_same_params(npz_lib.load_npz(path), model_params())
  else:
    for key, value in load_file(path).items():
      np.testing.assert_array_equal(value, tensors[key])


def missing_bucket(gcs_bucket):
  """A bucket name of the local Cloud Storage that holds no bucket."""
  return f"{gcs_bucket}-not-created"


def test_a_missing_bucket_is_one_line_from_each_tool(gcs_bucket,
                                                     digits_data_dir,
                                                     digits_run):
  """TensorFlow's client would ask for the bucket for ever (`main`) or the
  write would end in a traceback (`export`): each tool asks once, first,
  and names the path and its bucket."""
  missing = missing_bucket(gcs_bucket)
  bucket = missing[len("gs://"):]
  run = digits_run[0]
  for tool, args, flag, given in (
      ("main", main_flags(f"{missing}/run", digits_data_dir),
       "--workdir", f"{missing}/run"),
      ("main", main_flags(run + "-resumed", f"{missing}/data"),
       "config.data_dir", f"{missing}/data"),
      ("export", [f"--workdir={run}", f"--out={missing}/x.npz"],
       "--out", f"{missing}/x.npz"),
      ("export", [f"--workdir={missing}/run", "--out=x.npz"],
       "--workdir", f"{missing}/run"),
      ("predict", [f"--workdir={run}", f"--images={missing}/images"],
       "--images", f"{missing}/images"),
      ("figures", [f"--workdir={run}", f"--out={missing}/figures"],
       "--out", f"{missing}/figures"),
      ("plan", ["--config=configs/digits.py",
                f"--config.data_dir={missing}/d"],
       "config.data_dir", f"{missing}/d"),
      ("convert_dataset", ["--dataset=digits", f"--data_dir={missing}/d",
                           "--out_data_dir=unused"],
       "--data_dir", f"{missing}/d"),
  ):
    status, stdout, stderr = call_tool(tool, *args)
    assert (status, stdout) == (2, ""), (tool, stderr[-2000:])
    assert stderr == (f"error: {flag}={given}: there is no bucket "
                      f"gs://{bucket}\n"), tool
  assert not os.path.exists(run + "-resumed")
  assert not os.path.exists("x.npz")


class _Stub(http.server.BaseHTTPRequestHandler):
  """Cloud Storage's JSON API over an empty bucket, answering every
  request with `status`, and where that is 200, granting `granted` to
  testIamPermissions (fake-gcs-server has no IAM, and answers no 5xx or
  403 of its own); each request's path appended to `requests`, a list,
  where one is given."""
  status, granted, requests = 200, (), None

  def do_GET(self):  # pylint: disable=invalid-name
    if self.requests is not None:
      self.requests.append(self.path)
    body = ({"error": {"code": self.status, "message": "injected"}}
            if self.status != 200 else
            {"permissions": list(self.granted)}
            if "/iam/testPermissions" in self.path else
            {"kind": "storage#objects"})
    data = json.dumps(body).encode()
    self.send_response(self.status)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)

  def log_message(self, *args):
    del args


@contextlib.contextmanager
def storage_stub(monkeypatch, **answers):
  """google-cloud-storage pointed at a _Stub with `answers`' attributes."""
  stub = type("Stub", (_Stub,), answers)
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), stub)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  monkeypatch.setenv("STORAGE_EMULATOR_HOST",
                     f"http://127.0.0.1:{server.server_address[1]}")
  try:
    yield
  finally:
    server.shutdown()
    server.server_close()


class RetryClock:
  """The clock of google-api-core's retries in the thread that made it: a
  back-off moves it on at once, by as long as it was asked to sleep
  (recorded). Other threads keep the real one (google-cloud-storage asks
  for a bucket's metadata from a thread of its own, with retries of its
  own)."""

  def __init__(self):
    self.slept = []
    self._thread = threading.get_ident()

  def monotonic(self):
    if threading.get_ident() != self._thread:
      return time.monotonic()
    return sum(self.slept)

  def sleep(self, seconds):
    if threading.get_ident() != self._thread:
      time.sleep(seconds)
    else:
      self.slept.append(seconds)


@pytest.fixture
def retry_clock(monkeypatch):
  """google-api-core's retries on a RetryClock, and each back-off its
  longest (no jitter): a test counts the attempts that fit in
  paths.REACH_SECONDS without waiting them out."""
  from google.api_core.retry import retry_base, retry_unary  # pylint: disable=g-import-not-at-top
  clock = RetryClock()
  for module in (retry_base, retry_unary):
    monkeypatch.setattr(module, "time", clock)
  monkeypatch.setattr(retry_base, "random", types.SimpleNamespace(
      uniform=lambda low, high: high))
  return clock


@pytest.mark.parametrize("status, says", [
    (503, "Cloud Storage did not answer for gs://b within 30 s (503 GET "),
    (403, "these credentials may not list gs://b (403: GET "),
    (500, "Cloud Storage did not answer for gs://b within 30 s (500 GET "),
])
def test_storage_errors_are_named_transient_ones_after_bounded_retries(
    monkeypatch, capsys, retry_clock, status, says):
  """A server error: retried for paths.REACH_SECONDS, said once; a
  refusal: at once, asked once."""
  requests = []
  with storage_stub(monkeypatch, status=status, requests=requests), \
      pytest.raises(errors.InputError) as refused:
    paths.check_reachable("gs://b/run", "--workdir")
  assert str(refused.value).startswith(f"--workdir=gs://b/run: {says}")
  kind = {503: "ServiceUnavailable", 500: "InternalServerError"}.get(status)
  assert capsys.readouterr().err == ("" if status == 403 else (
      f"Cloud Storage did not answer for gs://b ({kind}); retrying for up "
      "to 30 s\n"))
  assert paths.REACH_SECONDS == 30
  listings = [r for r in requests if r.startswith("/storage/v1/b/b/o?")]
  if status == 403:
    assert len(listings) == 1 and not retry_clock.slept
  else:
    # Back-offs doubling from 1 s up to 8 s, as many as end within the
    # 30 s (the next would end at 31 s): an attempt before each and one
    # after the last.
    assert retry_clock.slept == [1, 2, 4, 8, 8]
    assert len(listings) == 6, requests


@pytest.mark.parametrize("granted, refused", [
    (("storage.objects.list",),
     "storage.objects.create, storage.objects.delete"),
    (("storage.objects.create",), "storage.objects.delete"),
    (("storage.objects.create", "storage.objects.delete"), None),
])
def test_a_bucket_that_may_not_be_written_is_refused_to_tools_that_write(
    monkeypatch, granted, refused):
  with storage_stub(monkeypatch, granted=granted):
    paths.check_reachable("gs://b/run", "--workdir")  # Reading: it may.
    if refused is None:
      paths.check_reachable("gs://b/run", "--workdir", writes=True)
    else:
      with pytest.raises(errors.InputError) as e:
        paths.check_reachable("gs://b/run", "--workdir", writes=True)
      assert str(e.value) == (f"--workdir=gs://b/run: these credentials may "
                              f"not write to gs://b (not granted {refused})")


# From SIGTERM to a tool's return, at most, when it waits for storage: 2 ms
# measured here; the rest is room for a loaded machine. A retry's back-off
# (up to 8 s) that held the signal back would pass it.
STOP_WAITING_SECONDS = 2


def test_sigterm_stops_a_run_waiting_for_storage_at_once(
    gcs_bucket, digits_data_dir, monkeypatch):
  """The retries for storage that does not answer (paths.REACH_SECONDS,
  30 s) do not hold back SIGTERM: sent 1 s into them, the run stops then,
  in one line, having written nothing."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
  # The signal 1 s after the tool's first failed attempt, into its
  # retries (a fixed time from the start would fall before it on a loaded
  # machine).
  from google.api_core import retry as retries  # pylint: disable=g-import-not-at-top
  failed, sent = threading.Event(), []

  class Observed(retries.Retry):

    def __init__(self, *args, on_error=None, **kwargs):
      def noted(error):
        if on_error is not None:
          on_error(error)
        if threading.current_thread() is threading.main_thread():
          failed.set()
      super().__init__(*args, on_error=noted, **kwargs)
  monkeypatch.setattr(retries, "Retry", Observed)

  def send():
    if failed.wait(120):
      time.sleep(1)
      sent.append(time.monotonic())
      os.kill(os.getpid(), signal.SIGTERM)
  # The handler that cli.prepare installs in a tool's own process (here,
  # in pytest's, call_tool leaves prepare out).
  before = signal.signal(signal.SIGTERM, signals.raise_stopped)
  try:
    sender = threading.Thread(target=send)
    sender.start()
    status, stdout, stderr = call_tool(
        "main", *main_flags(f"{gcs_bucket}/run", digits_data_dir))
    returned = time.monotonic()
    sender.join()
  finally:
    signal.signal(signal.SIGTERM, before)
  assert (status, stdout) == (128 + signal.SIGTERM, ""), stderr[-2000:]
  retrying, stopped = stderr.splitlines()
  assert retrying.startswith(f"Cloud Storage did not answer for {gcs_bucket}")
  assert stopped.startswith("error: stopped by SIGTERM")
  assert returned - sent[0] < STOP_WAITING_SECONDS


def test_storage_that_does_not_answer_is_named_after_bounded_retries(
    gcs_bucket, digits_data_dir, monkeypatch):
  """No network to Cloud Storage: retried for paths.REACH_SECONDS, said
  once, then one line."""
  monkeypatch.setattr(paths, "REACH_SECONDS", 2)
  # A local port where nothing listens: every connection is refused.
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
  workdir = f"{gcs_bucket}/run"
  status, stdout, stderr = call_tool(
      "main", *main_flags(workdir, digits_data_dir))
  assert (status, stdout) == (2, "")
  retrying, error = stderr.splitlines()
  assert retrying.startswith(f"Cloud Storage did not answer for "
                             f"{gcs_bucket} (")
  assert retrying.endswith("retrying for up to 2 s")
  assert error.startswith(f"error: --workdir={workdir}: Cloud Storage did "
                          f"not answer for {gcs_bucket} within 2 s (")
