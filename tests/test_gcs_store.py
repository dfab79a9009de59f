"""The local Cloud Storage of the tests (tests/gcs.py, the gcs_bucket
fixture): each client the project writes gs:// paths with writes there and
reads back what it wrote."""

import json
import os
import subprocess
import sys
import textwrap

from tests import gcs


def test_bucket_is_new_and_empty(gcs_bucket):
  assert gcs_bucket.startswith("gs://")
  assert gcs.list_objects(gcs_bucket) == []


def test_tf_gfile(gcs_bucket):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  gfile = tf.io.gfile
  root = f"{gcs_bucket}/gfile"
  gfile.makedirs(f"{root}/a/b")
  assert gfile.isdir(f"{root}/a/b")
  with gfile.GFile(f"{root}/a/one.txt", "w") as f:
    f.write("one")
  with gfile.GFile(f"{root}/a/empty", "wb") as f:
    f.write(b"")  # An empty upload: `Transfer-Encoding: identity`.
  assert gfile.exists(f"{root}/a/one.txt")
  assert not gfile.isdir(f"{root}/a/one.txt")
  with gfile.GFile(f"{root}/a/one.txt") as f:
    assert f.read() == "one"
  assert gfile.GFile(f"{root}/a/empty", "rb").read() == b""
  assert sorted(gfile.listdir(f"{root}/a")) == ["b/", "empty", "one.txt"]
  assert gfile.glob(f"{root}/a/*.txt") == [f"{root}/a/one.txt"]
  gfile.rename(f"{root}/a/one.txt", f"{root}/a/two.txt")
  assert not gfile.exists(f"{root}/a/one.txt")
  with gfile.GFile(f"{root}/a/two.txt") as f:
    assert f.read() == "one"
  with gfile.GFile(f"{root}/a/three.txt", "w") as f:
    f.write("three")
  gfile.rename(f"{root}/a/three.txt", f"{root}/a/two.txt", overwrite=True)
  with gfile.GFile(f"{root}/a/two.txt") as f:
    assert f.read() == "three"
  gfile.remove(f"{root}/a/empty")
  assert not gfile.exists(f"{root}/a/empty")
  assert gcs.list_objects(root) == [
      "gfile/", "gfile/a/", "gfile/a/b/", "gfile/a/two.txt"]
  gfile.rmtree(f"{root}/a")
  assert not gfile.exists(f"{root}/a")


def test_epath(gcs_bucket):
  from etils import epath  # pylint: disable=g-import-not-at-top
  root = epath.Path(gcs_bucket) / "epath"
  (root / "d").mkdir(parents=True)
  assert (root / "d").is_dir()
  (root / "d" / "x.txt").write_text("x")
  (root / "d" / "y.bin").write_bytes(b"y")
  assert (root / "d" / "x.txt").exists()
  assert (root / "d" / "x.txt").read_text() == "x"
  assert sorted(p.name for p in (root / "d").iterdir()) == ["x.txt", "y.bin"]
  assert [p.name for p in root.glob("d/*.txt")] == ["x.txt"]
  (root / "d" / "x.txt").rename(root / "d" / "z.txt")
  assert not (root / "d" / "x.txt").exists()
  (root / "d" / "y.bin").replace(root / "d" / "z.txt")
  assert (root / "d" / "z.txt").read_bytes() == b"y"
  assert os.fspath(root).startswith("gs://")
  assert gcs.list_objects(os.fspath(root)) == [
      "epath/", "epath/d/", "epath/d/z.txt"]


def test_google_cloud_storage(gcs_bucket):
  from google.cloud import storage  # pylint: disable=g-import-not-at-top
  client = storage.Client()
  bucket = client.bucket(gcs_bucket.removeprefix("gs://"))
  bucket.blob("g/small.txt").upload_from_string("small")
  # Over its chunk size: a resumable upload, in two requests.
  big = os.urandom(9 << 20)
  blob = bucket.blob("g/big.bin")
  blob.chunk_size = 8 << 20
  blob.upload_from_string(big)
  assert bucket.blob("g/small.txt").download_as_text() == "small"
  assert bucket.blob("g/big.bin").download_as_bytes() == big
  assert sorted(b.name for b in client.list_blobs(bucket, prefix="g/")) == [
      "g/big.bin", "g/small.txt"]
  assert gcs.list_objects(f"{gcs_bucket}/g") == ["g/big.bin", "g/small.txt"]


def test_list_objects(gcs_bucket):
  from google.cloud import storage  # pylint: disable=g-import-not-at-top
  bucket = storage.Client().bucket(gcs_bucket.removeprefix("gs://"))
  for name in ["x", "x/1", "x/2/3", "x2", "y"]:
    bucket.blob(name).upload_from_string(name)
  assert gcs.list_objects(f"{gcs_bucket}/x") == ["x", "x/1", "x/2/3"]
  assert gcs.list_objects(f"{gcs_bucket}/x/") == ["x", "x/1", "x/2/3"]
  assert gcs.list_objects(gcs_bucket) == ["x", "x/1", "x/2/3", "x2", "y"]


def test_orbax_checkpoint_manager(gcs_bucket):
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  state = {"w": jnp.arange(12.0).reshape(3, 4), "b": jnp.ones(4),
           "step": jnp.array(7)}
  directory = f"{gcs_bucket}/checkpoints"
  with ocp.CheckpointManager(directory) as manager:
    manager.save(7, args=ocp.args.StandardSave(state))
    manager.wait_until_finished()
  with ocp.CheckpointManager(directory) as manager:
    assert manager.latest_step() == 7
    restored = manager.restore(7, args=ocp.args.StandardRestore(state))
  for name, value in state.items():
    np.testing.assert_array_equal(restored[name], value)
  assert any(n.startswith("checkpoints/7/")
             for n in gcs.list_objects(directory))


def test_tensorboard_writer(gcs_bucket):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from vit_jax.runs import writers  # pylint: disable=g-import-not-at-top
  logdir = f"{gcs_bucket}/tensorboard"
  writer = writers.TensorBoardWriter(logdir)
  writer.write_scalars(1, {"loss": 0.5})
  writer.write_scalars(2, {"loss": 0.25, "accuracy": 1.0})
  writer.flush()
  events = tf.io.gfile.glob(f"{logdir}/events.out.tfevents.*")
  assert len(events) == 1
  rows = []
  for record in tf.compat.v1.train.summary_iterator(events[0]):
    for value in record.summary.value:
      # As tf.summary.scalar writes them: TensorBoard's scalar dashboard
      # shows them.
      assert value.metadata.plugin_data.plugin_name == "scalars"
      rows.append((record.step, value.tag,
                   tf.make_ndarray(value.tensor).item()))
  assert rows == [(1, "loss", 0.5), (2, "loss", 0.25), (2, "accuracy", 1.0)]
  assert gcs.list_objects(logdir) == [
      "tensorboard/", events[0].removeprefix(f"{gcs_bucket}/")]


def test_paths(gcs_bucket):
  from vit_jax import paths  # pylint: disable=g-import-not-at-top
  target = f"{gcs_bucket}/run/results.json"
  paths.write_atomically(target, json.dumps({"a": 1}))
  paths.write_atomically(target, json.dumps({"a": 2}))
  paths.write_atomically(f"{gcs_bucket}/run/weights.bin", b"\0\1\2")
  with paths.local_copy(target) as local:
    assert not paths.is_url(local)
    with open(local) as f:
      assert json.load(f) == {"a": 2}
  with (paths.local_copy(f"{gcs_bucket}/run/weights.bin") as local,
        open(local, "rb") as f):
    assert f.read() == b"\0\1\2"
  assert not os.path.exists(local)
  assert "run/results.json" in gcs.list_objects(f"{gcs_bucket}/run")
  assert "run/weights.bin" in gcs.list_objects(f"{gcs_bucket}/run")


def test_processes_tests_start(gcs_bucket):
  """A process the test starts resolves Google's hosts to the front and
  trusts it, and reaches the emulator directly, with the environment it
  inherits (no TensorFlow here: starting it would take seconds)."""
  from google.cloud import storage  # pylint: disable=g-import-not-at-top
  bucket = gcs_bucket.removeprefix("gs://")
  storage.Client().bucket(bucket).blob("p/x").upload_from_string("from test")
  script = textwrap.dedent(f"""
      import os, ssl, urllib.request
      context = ssl.create_default_context(
          cafile=os.environ["CURL_CA_BUNDLE"])
      opener = urllib.request.build_opener(
          urllib.request.ProxyHandler({{}}),
          urllib.request.HTTPSHandler(context=context))
      # The media URL TensorFlow reads from, through the front.
      print(opener.open("https://storage.googleapis.com/{bucket}/p/x")
            .read().decode())
      # The JSON API TensorFlow writes with, through the front.
      request = urllib.request.Request(
          "https://www.googleapis.com/upload/storage/v1/b/{bucket}/o"
          "?uploadType=media&name=p/y", data=b"from child", method="POST")
      opener.open(request).read()
      # The emulator itself, as tensorstore and google-cloud-storage go.
      print(urllib.request.build_opener(urllib.request.ProxyHandler({{}}))
            .open(os.environ["STORAGE_EMULATOR_HOST"]
                  + "/storage/v1/b/{bucket}/o/p%2Fy?alt=media")
            .read().decode())
  """)
  # A process of its own: what a child of the test inherits is what is
  # tested (the session's mount namespace, the environment).
  output = subprocess.run([sys.executable, "-c", script], check=True,
                          capture_output=True, text=True).stdout
  assert output.split("\n")[:2] == ["from test", "from child"]
  assert gcs.list_objects(f"{gcs_bucket}/p") == ["p/x", "p/y"]
