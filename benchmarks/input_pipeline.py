"""Training input pipeline throughput on ImageNet-sized JPEGs, per CPU core,
for both readers on the same records.

  python benchmarks/input_pipeline.py [--num_images=512] [--batches=40] [--rounds=3] [--randaugment=2,10] [--json]

Generates --num_images distinct JPEGs shaped like ImageNet's (500x375, one in
four 375x500; quality 90, 4:2:0; smooth random colours plus --noise, about
90 KB each) into a folder dataset (`folder:PATH`), prepared twice: as
ArrayRecord (read at random, vit_jax/data/random_access.py) and as TFRecord
(streamed). It then times the training stream of one v3-8 host with each:
`pipeline_lib.train_dataset` with augment "inception_crop,flip" at 224 px
and a per-host batch of 256 in 8 shares, one per TPU core. Reading the
records, decoding (only the crop: see `preprocess.decode_and_inception_crop`),
flipping, resizing and batching run on every core of this machine, as on a
TPU host. After --warmup_batches, --batches are timed, --rounds times per
reader, alternated: images per second over the cores TensorFlow may use
(the process's CPU affinity) is `*_img_per_sec_per_core`, the figure for a
quiet machine. `*_img_per_cpu_sec` divides by the CPU time the process got
instead: on a machine busy with other work it is what a free core would do.
`random_over_streamed` is the ratio of the two readers' figures, and
`*_record_bytes` what a record takes on disk in each format.

`baseline_img_per_sec_per_core` is a plain tf.data pipeline over the same
TFRecord records, written out here: full JPEG decode, inception crop,
resize, flip, batch of 256 in float32, one parallel map. The gap between it
and the streamed reader is the cost of the project's pipeline (8 seeded
shares, the per-host concat), less what decoding only the crop and
batching uint8 save.
"""

import contextlib
import json
import os
import sys
import tempfile
import time

import numpy as np
from absl import app, flags, logging

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

flags.DEFINE_integer("num_images", 512, "Distinct JPEGs generated.")
flags.DEFINE_integer("batches", 40, "Batches timed, after the warm-up.")
flags.DEFINE_integer("warmup_batches", 5, "Batches read before timing.")
flags.DEFINE_integer("batch_size", 256, "Per-host batch (a v3-8 host: 8 "
                     "cores of 32).")
flags.DEFINE_integer("num_shares", 8, "Input shares of the batch "
                     "(config.input_shares), all read by this process.")
flags.DEFINE_integer("image_size", 224, "Model resolution.")
flags.DEFINE_string("augment", "inception_crop,flip", "Augmentations.")
flags.DEFINE_string("randaugment", "", "Also time the stream with this "
                    "RandAugment ('N,M', e.g. the plain baseline's 2,10) "
                    "after the augmentations, on the same records.")
flags.DEFINE_float("noise", 16, "Standard deviation (of 255) of the noise on "
                   "the colour fields: it sets the JPEGs' size, and so the "
                   "decoding cost (16: about 90 KB; ImageNet's average is "
                   "about 110 KB).")
flags.DEFINE_bool("baseline", True, "Also time the plain tf.data pipeline.")
flags.DEFINE_string("data_dir", None, "Where the JPEGs and their TFDS copy "
                    "go, and are reused from (default: a temporary "
                    "directory, removed at the end).")
flags.DEFINE_list("grain_threads", [], "Also time the random-access work "
                  "in Grain's threads, with each of these thread counts.")
flags.DEFINE_integer("rounds", 3, "Timings of each reader, alternated; the "
                     "median is shown.")
flags.DEFINE_bool("json", False, "One JSON object instead of lines.")

FLAGS = flags.FLAGS
NUM_CLASSES = 10
LANDSCAPE, PORTRAIT = (375, 500), (500, 375)  # (height, width)
QUALITY = 90


def cores():
  """The CPUs TensorFlow's thread pools are sized for (affinity-aware)."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:
    return os.cpu_count()


def jpeg(index, noise):
  """Encoded JPEG number `index`: a smooth random colour field plus noise."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(index)
  height, width = PORTRAIT if index % 4 == 3 else LANDSCAPE
  coarse = rng.uniform(0, 255, (1, height // 25 + 2, width // 25 + 2, 3))
  field = tf.image.resize(coarse, (height, width), method="bicubic")[0]
  pixels = field.numpy() + rng.normal(0, noise, (height, width, 3))
  pixels = np.clip(np.round(pixels), 0, 255).astype(np.uint8)
  return tf.io.encode_jpeg(pixels, quality=QUALITY).numpy()


def write_images(data_dir, num_images, noise):
  """root/train/<class>/<i>.jpg under data_dir, made once; returns root."""
  root = os.path.join(data_dir,
                      f"input_pipeline_jpegs_{num_images}_noise{noise:g}")
  done = os.path.join(root, "complete")  # Not an image: the dataset skips it.
  if not os.path.exists(done):
    for index in range(num_images):
      folder = os.path.join(root, "train", f"class{index % NUM_CLASSES}")
      os.makedirs(folder, exist_ok=True)
      with open(os.path.join(folder, f"{index}.jpg"), "wb") as f:
        f.write(jpeg(index, noise))
    # Written last, and only at the root, which holds just the split folder.
    with open(done, "w") as f:
      f.write("")
  return root


def img_per_sec(batches, num_batches, warmup_batches):
  """(images per second, per CPU second) of a batch stream after a warm-up.

  Batches are read in numpy, as training reads them (`as_numpy_iterator`).
  Per CPU second counts the CPU time of all the process's threads: on a
  machine shared with other work it is the throughput a whole free core
  would give, where the wall-clock rate shows only the share it got.
  """
  iterator = batches.as_numpy_iterator()
  for _ in range(warmup_batches):
    next(iterator)
  images = 0
  start, start_cpu = time.perf_counter(), time.process_time()
  for _ in range(num_batches):
    images += len(next(iterator)["label"])
  return (images / (time.perf_counter() - start),
          images / (time.process_time() - start_cpu))


def baseline_batches(builder, batch_size, image_size):
  """A plain pipeline: decode, inception crop, resize, flip, batch."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  from vit_jax.data import preprocess

  def example(record):
    image = tf.io.decode_jpeg(record["image"], channels=3)
    begin, size, _ = tf.image.sample_distorted_bounding_box(
        tf.shape(image), tf.zeros([1, 0, 4]), min_object_covered=0.0,
        aspect_ratio_range=preprocess.INCEPTION_ASPECT_RATIO_RANGE,
        area_range=preprocess.INCEPTION_AREA_RANGE,
        use_image_if_no_bounding_boxes=True)
    image = tf.image.resize(tf.slice(image, begin, size),
                            (image_size, image_size)) / 127.5 - 1
    return {"image": tf.image.random_flip_left_right(image),
            "label": tf.cast(record["label"], tf.int32)}

  records = builder.as_dataset(
      split="train", shuffle_files=False,
      decoders={"image": tfds.decode.SkipDecoding()})
  options = tf.data.Options()
  # Its thread stalls a deleted iterator (see pipeline_lib._options).
  options.autotune.enabled = False
  return (records.repeat()
          .map(example, num_parallel_calls=cores())
          .batch(batch_size, drop_remainder=True)
          .prefetch(2).with_options(options))


def grain_batches(source, threads):
  """The random-access reader's work done in Grain's threads instead of
  tf.data's: each thread reads a record and runs the same TensorFlow
  decode and augmentation (one traced function per example), Grain batches.
  Not the project's reader: the alternative it was measured against."""
  import grain  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from vit_jax.data import preprocess, random_access
  records = random_access.Records(source, "train")
  order = random_access.Order(records.size, seed=0)
  names = preprocess.augmentation(FLAGS.augment).names

  @tf.function(input_signature=[tf.TensorSpec([], tf.string),
                                 tf.TensorSpec([], tf.int64)])
  def decode(record, position):
    example = records.parse(record)
    seed = tf.random.experimental.stateless_fold_in(
        tf.constant([0, -1], tf.int64), position)
    image = preprocess.decode_and_augment(example["image"], names, seed,
                                          FLAGS.image_size)
    return {"image": preprocess.resize(image, FLAGS.image_size),
            "label": source.label(example)}

  def example(position):
    record = records.read(order([position]))[0]
    return {k: v.numpy() for k, v in decode(record, position).items()}

  dataset = grain.MapDataset.range(0, 2**40).map(example).batch(
      FLAGS.batch_size, drop_remainder=True)
  iterator = dataset.to_iter_dataset(grain.ReadOptions(
      num_threads=threads, prefetch_buffer_size=2 * FLAGS.batch_size))

  class Batches:  # What img_per_sec reads.
    def as_numpy_iterator(self):
      return iter(iterator)
  return Batches()


def both_formats(data_dir):
  """{"random": Source, "streamed": Source} of the generated JPEGs as a
  folder dataset prepared as ArrayRecord and as TFRecord: the same records
  in the same order."""
  from vit_jax.data import sources
  root = write_images(data_dir, FLAGS.num_images, FLAGS.noise)
  dataset = sources.FOLDER_PREFIX + root
  found = {}
  for name, fmt in (("random", "array_record"), ("streamed", "tfrecord")):
    where = os.path.join(data_dir, fmt)
    with contextlib.redirect_stdout(sys.stderr):  # TFDS prints as it prepares.
      sources.get_builder(dataset, where, file_format=fmt)  # Prepare once.
    found[name] = sources.lookup(dataset, where)
  return found


def record_bytes(source):
  """Bytes of a split's record files, per record."""
  builder = source.builder
  names = [n for n in os.listdir(builder.data_dir) if "-train." in n]
  total = sum(os.path.getsize(os.path.join(builder.data_dir, n))
              for n in names)
  return total / source.num_examples("train")


def measure(data_dir):
  from vit_jax.data import pipeline as pipeline_lib, preprocess
  readers = both_formats(data_dir)
  root = write_images(data_dir, FLAGS.num_images, FLAGS.noise)
  sizes = [os.path.getsize(os.path.join(folder, name))
           for folder, _, names in os.walk(os.path.join(root, "train"))
           for name in names]

  def stream(reader, randaugment=""):
    return pipeline_lib.train_dataset(readers[reader], "train",
                                      batch_size=FLAGS.batch_size,
                                      image_size=FLAGS.image_size,
                                      augmentation=preprocess.augmentation(
                                          FLAGS.augment, randaugment),
                                      shares=tuple(range(FLAGS.num_shares)),
                                      num_shares=FLAGS.num_shares)

  result = {"cores": cores()}
  # Alternated, the median of --rounds each: drift on a shared machine hits
  # both readers alike.
  rates = {reader: [] for reader in ("streamed", "random")}
  for _ in range(FLAGS.rounds):
    for reader, measured in rates.items():
      measured.append(img_per_sec(stream(reader), FLAGS.batches,
                                  FLAGS.warmup_batches))
  for reader, measured in rates.items():
    rate, per_cpu_second = sorted(measured)[len(measured) // 2]
    result[f"{reader}_img_per_sec_per_core"] = rate / cores()
    result[f"{reader}_img_per_cpu_sec"] = per_cpu_second
    result[f"{reader}_record_bytes"] = record_bytes(readers[reader])
  result["random_over_streamed"] = (result["random_img_per_sec_per_core"] /
                                    result["streamed_img_per_sec_per_core"])
  for threads in map(int, FLAGS.grain_threads):
    rate, per_cpu_second = img_per_sec(grain_batches(readers["random"],
                                                     threads),
                                       FLAGS.batches, FLAGS.warmup_batches)
    result[f"grain_{threads}_threads_img_per_sec_per_core"] = rate / cores()
    result[f"grain_{threads}_threads_img_per_cpu_sec"] = per_cpu_second
  if FLAGS.randaugment:
    rate, per_cpu_second = img_per_sec(stream("random", FLAGS.randaugment),
                                       FLAGS.batches, FLAGS.warmup_batches)
    result["randaugment_img_per_sec_per_core"] = rate / cores()
    result["randaugment_img_per_cpu_sec"] = per_cpu_second
  if FLAGS.baseline:
    base, base_per_cpu_second = img_per_sec(
        baseline_batches(readers["streamed"].builder, FLAGS.batch_size,
                         FLAGS.image_size),
        FLAGS.batches, FLAGS.warmup_batches)
    result["baseline_img_per_sec_per_core"] = base / cores()
    result["baseline_img_per_cpu_sec"] = base_per_cpu_second
  result.update(
      batch_size=FLAGS.batch_size, num_shares=FLAGS.num_shares,
      image_size=FLAGS.image_size, augment=FLAGS.augment,
      randaugment=FLAGS.randaugment,
      batches=FLAGS.batches, num_images=FLAGS.num_images, noise=FLAGS.noise,
      mean_jpeg_kb=sum(sizes) / len(sizes) / 1e3,
      load_average_1min=os.getloadavg()[0])
  return result


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # TFDS narrates each share it opens.
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  tfds.disable_progress_bar()
  if FLAGS.data_dir:
    result = measure(FLAGS.data_dir)
  else:
    with tempfile.TemporaryDirectory() as data_dir:
      result = measure(data_dir)
  if FLAGS.json:
    print(json.dumps(result))
    return
  for key, value in result.items():
    print(f"{key} {value:.1f}" if isinstance(value, float) else
          f"{key} {value}")


if __name__ == "__main__":
  from vit_jax import runtime
  runtime.keep_freed_memory()  # As vit_jax.main does before it trains.
  app.run(main)
