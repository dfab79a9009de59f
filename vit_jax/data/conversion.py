"""A prepared TFRecord dataset rewritten as ArrayRecord, to be read at random.

TFDS's own `tfds convert_format` runs on Apache Beam, which vit_jax does not
install; this does the same for one dataset version on one machine: each
record file is copied record by record, in order, into an ArrayRecord file
of the same shard (one record per group, as TFDS writes them, so that any
record is read alone), and the metadata is copied with its file format
changed. Record i of a split is the same example in both copies, so
evaluation and the broken records' indices agree across them.

The copy is written into a temporary folder beside its destination and
renamed into place when complete: a conversion that fails (a full disk) or
is stopped removes it, one killed leaves nothing that TFDS would take for a
prepared dataset, and running it again starts over.

The TFRecord copy is read through tf.io.gfile, so its data_dir may be a URL
(`gs://`); the ArrayRecord copy is written to a local folder only (the
array_record library writes and reads local files), refused by name
otherwise.
"""

import json
import os
import shutil

import tensorflow_datasets as tfds
from array_record.python import array_record_module

from vit_jax import errors, paths
from vit_jax.data.lazy_tensorflow import tf

# One record per chunk: reading record i decodes nothing else (TFDS's
# setting for the ArrayRecord files it writes).
WRITER_OPTIONS = "group_size:1"
INFO_FILE = "dataset_info.json"


def destination(builder, out_data_dir):
  """Where the ArrayRecord copy of `builder`'s version goes: the same
  name/config/version folders under out_data_dir."""
  relative = paths.path(builder.data_dir).relative_to(
      paths.path(builder.data_dir_root))
  return paths.join(out_data_dir, relative)


def convert(builder, out_data_dir, progress=print):
  """Writes `builder`'s prepared TFRecord files as ArrayRecord under
  out_data_dir; returns (the new version folder, bytes before, bytes
  after). `progress(line)` is told of each file."""
  fmt = builder.info.file_format
  if fmt == tfds.core.FileFormat.ARRAY_RECORD:
    raise errors.InputError(
        f"{builder.name} in {builder.data_dir} is ArrayRecord already: set "
        f"config.data_dir to {builder.data_dir_root}")
  if fmt != tfds.core.FileFormat.TFRECORD:
    raise errors.InputError(
        f"{builder.name} is stored as {fmt.value}; only TFRecord is converted")
  if paths.is_url(out_data_dir):
    raise errors.InputError(
        f"--out_data_dir={out_data_dir}: ArrayRecord files are written to "
        f"and read from local paths only; use a local disk or a mounted "
        f"bucket (gcsfuse)")
  if paths.shown(out_data_dir) == paths.shown(builder.data_dir_root):
    raise errors.InputError(
        f"--out_data_dir={out_data_dir} is where {builder.name} is prepared "
        f"as TFRecord: give another folder for the ArrayRecord copy (the "
        f"TFRecord one is kept)")
  # From here on out_data_dir is local (refused above otherwise), as the
  # ArrayRecord writer needs: os and shutil act on local folders only.
  target = destination(builder, out_data_dir)
  if os.path.exists(os.path.join(target, INFO_FILE)):
    raise errors.InputError(
        f"{target} already holds a prepared dataset: remove it to convert "
        f"again, or set config.data_dir to {out_data_dir}")
  partial = target + ".incomplete"
  shutil.rmtree(partial, ignore_errors=True)
  # tf.io.gfile: the TFRecord copy may be in a bucket.
  names = [name for name in sorted(tf.io.gfile.listdir(builder.data_dir))
           if not tf.io.gfile.isdir(paths.join(builder.data_dir, name))]
  records = [name for name in names if f".{fmt.value}-" in name]
  before = sum(tf.io.gfile.stat(paths.join(builder.data_dir, name)).length
               for name in records)
  after = 0
  try:
    os.makedirs(partial)
    for name in names:
      path = paths.join(builder.data_dir, name)
      if name in records:
        out = os.path.join(partial, array_record_name(name, fmt.value))
        progress(f"  {name} -> {os.path.basename(out)}")
        _copy_records(path, out)
        after += os.path.getsize(out)
      elif name == INFO_FILE:
        _write_info(path, paths.join(partial, name))
      else:  # features.json, label names: unchanged.
        tf.io.gfile.copy(path, paths.join(partial, name))
  except BaseException as e:  # A signal too: no partial copy is left.
    shutil.rmtree(partial, ignore_errors=True)
    cause = paths.storage_failure(e)
    if cause is None or not isinstance(e, Exception):
      raise
    raise errors.InputError(
        f"could not write {target}: {cause} (the copy needs about "
        f"{paths.describe_bytes(before)}, as its TFRecord files; "
        f"{paths.describe_bytes(paths.free_bytes(out_data_dir))} are free). "
        "The partial copy was removed: free space, or give another "
        "--out_data_dir, and run the same command again") from e
  os.replace(partial, target)
  return target, before, after


def array_record_name(name, old_format):
  """A record file's name in the converted copy: its format token changed,
  as TFDS's file name template writes it ({FILEFORMAT})."""
  return name.replace(f".{old_format}-", f".{tfds.core.FileFormat.ARRAY_RECORD.value}-", 1)


def _copy_records(source, target):
  writer = array_record_module.ArrayRecordWriter(target, WRITER_OPTIONS)
  try:
    for record in tf.data.TFRecordDataset(source).as_numpy_iterator():
      writer.write(record)
  finally:
    writer.close()


def _write_info(source, target):
  info = json.loads(paths.path(source).read_text())
  info["fileFormat"] = tfds.core.FileFormat.ARRAY_RECORD.value
  paths.path(target).write_text(json.dumps(info, indent=2))
