"""The 19 VTAB-1k tasks: TFDS sources, 1k-example splits and labels.

VTAB-1k (Zhai et al., 2019, https://arxiv.org/abs/1910.04867) fine-tunes on
1,000 labelled examples per task: `train800` to train and `val200` to pick
hyper-parameters, then `train800val200` for the final run, scored on `test`.

The facts here follow google-research/task_adaptation (task_adaptation/data/
*.py and scripts/run_all_tasks.sh, which names the 19 task variants).  The
split offsets and TFDS versions agree with google-research/scenic's VTAB
sweep (scenic/projects/baselines/plainvit/configs/vtab_plainvit_config.py)
and its labels with scenic/dataset_lib/big_transfer/preprocessing/
vtab_ops.py; google-research/big_vision (at 0127fb6) has no VTAB configs or
label ops.

Where VTAB carves validation (and sometimes test) examples out of a TFDS
split, `val200` starts where VTAB's own "train" part ends, so that the 200
never overlap `train800`; those offsets are computed below from the split
sizes and percentages that VTAB uses.

Images are as TFDS stores them, not as VTAB hands them to a model:
dsprites and smallnorb are grayscale (one channel), and dsprites pixels are
0 or 1 (VTAB multiplies them by 255 and tiles them to three channels).
The input pipeline makes every image RGB, and a task's `image` function,
if any, fixes the encoded image first: dsprites' scales the pixels.
"""

import dataclasses
from typing import Callable, Optional

from vit_jax import errors
from vit_jax.data.lazy_tensorflow import tf

NATURAL, SPECIALIZED, STRUCTURED = "natural", "specialized", "structured"
GROUPS = (NATURAL, SPECIALIZED, STRUCTURED)

SPLIT_KEYS = ("train800", "val200", "train800val200", "test")
NUM_TRAIN = 800
NUM_VAL = 200


@dataclasses.dataclass(frozen=True)
class Task:
  """One VTAB task: where its examples come from and how they are labelled.

  Attributes:
    name: short id used on command lines, e.g. "clevr_count".
    title: the task's name in the paper's tables, e.g. "Clevr-Count".
    group: one of GROUPS.
    tfds_name: "name[/config]:version" as VTAB pins it; `tfds.builder`
      accepts it.
    num_classes: number of classes of the label.
    splits: TFDS split strings for "train800", "val200", "train800val200"
      and "test".
    image_key: the TFDS feature holding the image.
    label: example (dict of TFDS features; the image may be undecoded
      bytes) -> int32 scalar label, written with tf ops so that it runs in
      `tf.data.Dataset.map`; None means the "label" feature as is.
    image: encoded image -> encoded image, for images that need fixing
      before the pipeline decodes them; None: as stored.
  """
  name: str
  title: str
  group: str
  tfds_name: str
  num_classes: int
  splits: dict
  image_key: str = "image"
  label: Optional[Callable] = None
  image: Optional[Callable] = None


def _splits(train800, val200, test):
  return {
      "train800": train800,
      "val200": val200,
      "train800val200": f"{train800}+{val200}",
      "test": test,
  }


def _with_validation_split(test="test"):
  """Splits for datasets whose TFDS version has a "validation" split."""
  return _splits(f"train[:{NUM_TRAIN}]", f"validation[:{NUM_VAL}]", test)


def _held_out_of_train(train_examples, train_percent, test="test"):
  """Splits where VTAB holds out its validation part of TFDS's "train".

  VTAB's "train" part is the first `train_percent`% of TFDS's train split
  (rounded down); validation examples follow it.
  """
  start = train_percent * train_examples // 100
  if start + NUM_VAL > train_examples:
    raise errors.InputError(f"No {NUM_VAL} examples after {start} of "
                            f"{train_examples}.")
  return _splits(f"train[:{NUM_TRAIN}]", f"train[{start}:{start + NUM_VAL}]",
                 test)


def _bin(value, edges):
  """Index i of the bin edges[i] < value <= edges[i + 1], as int32.

  VTAB labels take `max(where(edges - value < 0))`: the last edge strictly
  below `value`; with increasing edges that is the count of such edges - 1.
  """
  edges = tf.constant(edges, dtype=value.dtype)
  below = tf.cast(edges < value, tf.int32)
  return tf.reduce_sum(below) - 1


def _feature(key):
  """Label = an integer feature other than "label", as int32."""
  def label(example):
    return tf.cast(example[key], tf.int32)
  label.__name__ = f"feature_{key}"
  return label


def _regrouped(key, num_original, num_classes):
  """Label = integer feature `key` (0..num_original - 1) in num_classes groups.

  VTAB computes floor(value / (num_original / num_classes)) in float32; for
  integer values that equals this exact integer form.
  """
  def label(example):
    value = tf.cast(example[key], tf.int64)
    return tf.cast(value * num_classes // num_original, tf.int32)
  label.__name__ = f"regrouped_{key}"
  return label


# task_adaptation clevr.py: CLEVR scenes hold 3 to 10 objects.
_CLEVR_MIN_OBJECTS = 3
# task_adaptation clevr.py: bins of the closest object's depth (pixel_coords'
# third value), "uniformly spaced ... more or less balanced" classes.
_CLEVR_DEPTH_EDGES = (0.0, 8.0, 8.5, 9.0, 9.5, 10.0, 100.0)


def clevr_count(example):
  """Number of objects in the scene - 3: 0..7."""
  # task_adaptation clevr.py counts the entries of objects/size.
  num_objects = tf.size(example["objects"]["size"], out_type=tf.int32)
  return num_objects - _CLEVR_MIN_OBJECTS


def clevr_distance(example):
  """Depth of the closest object, binned: 0..5."""
  depth = example["objects"]["pixel_coords"][:, 2]
  return _bin(tf.reduce_min(depth), _CLEVR_DEPTH_EDGES)


# TFDS kitti: objects/type is a ClassLabel whose first three names are Car,
# Van, Truck; task_adaptation kitti.py counts `type < 3` as vehicles.
_KITTI_NUM_VEHICLE_TYPES = 3
# task_adaptation kitti.py: an image without vehicles gets this depth, so
# that it falls in the last bin, "no vehicle".
_KITTI_NO_VEHICLE_DEPTH = 1000.0
# task_adaptation kitti.py: bins of the closest vehicle's z (meters ahead of
# the camera): <= 8, 8..20, 20..999, and none.
_KITTI_DEPTH_EDGES = (-100.0, 8.0, 20.0, 999.0)


def kitti_distance(example):
  """Distance to the closest car, van or truck, binned; 3: no vehicle."""
  objects = example["objects"]
  # TFDS kitti: location is x, y, z in camera coordinates, in meters.
  depth = objects["location"][:, 2]
  is_vehicle = objects["type"] < _KITTI_NUM_VEHICLE_TYPES
  depths = tf.concat(
      [tf.boolean_mask(depth, is_vehicle),
       tf.constant([_KITTI_NO_VEHICLE_DEPTH], dtype=depth.dtype)], axis=0)
  return _bin(tf.reduce_min(depths), _KITTI_DEPTH_EDGES)


# TFDS dsprites: label_x_position has 32 values and label_orientation 40;
# run_all_tasks.sh asks for num_classes=16 for both.
_DSPRITES_X_POSITIONS = 32
_DSPRITES_ORIENTATIONS = 40
_DSPRITES_CLASSES = 16
def dsprites_image(encoded):
  """dsprites' 0/1 PNG pixels as 0/255, as VTAB feeds them."""
  return tf.io.encode_png(tf.io.decode_png(encoded) * 255)


dsprites_location = _regrouped(
    "label_x_position", _DSPRITES_X_POSITIONS, _DSPRITES_CLASSES)
dsprites_orientation = _regrouped(
    "label_orientation", _DSPRITES_ORIENTATIONS, _DSPRITES_CLASSES)

# TFDS smallnorb: label_azimuth is 0..17 (TFDS halves NORB's 0, 2, .., 34;
# 20 degrees apart) and label_elevation 0..8; VTAB takes them as they are.
smallnorb_azimuth = _feature("label_azimuth")
smallnorb_elevation = _feature("label_elevation")


_TASK_LIST = (
    # --- Natural.
    Task(
        name="caltech101", title="Caltech101", group=NATURAL,
        # task_adaptation caltech.py pins caltech101:3.*.*.
        tfds_name="caltech101:3.*.*",
        # TFDS caltech101: 101 categories + background.
        num_classes=102,
        # task_adaptation caltech.py: 90% of the 3,060 train examples (30 per
        # class) for training -> val200 starts at 2754.
        splits=_held_out_of_train(3060, 90)),
    Task(
        name="cifar100", title="CIFAR-100", group=NATURAL,
        # task_adaptation cifar.py pins cifar100:3.*.*.
        tfds_name="cifar100:3.*.*",
        num_classes=100,
        # task_adaptation cifar.py: 90% of the 50,000 train examples for
        # training -> val200 starts at 45000.
        splits=_held_out_of_train(50_000, 90)),
    Task(
        name="dtd", title="DTD", group=NATURAL,
        # task_adaptation dtd.py pins dtd:3.*.*.
        tfds_name="dtd:3.*.*",
        num_classes=47,
        # task_adaptation dtd.py: TFDS's train/validation/test (fold 1).
        splits=_with_validation_split()),
    Task(
        name="flowers102", title="Flowers102", group=NATURAL,
        # task_adaptation oxford_flowers102.py pins oxford_flowers102:2.*.*.
        tfds_name="oxford_flowers102:2.*.*",
        num_classes=102,
        # task_adaptation oxford_flowers102.py: TFDS's validation split.
        splits=_with_validation_split()),
    Task(
        name="pets", title="Pets", group=NATURAL,
        # task_adaptation oxford_iiit_pet.py pins 3.*.*, which TFDS 4.9 does
        # not build; 4.0.0 ("fix corrupt images", head boxes) has the same
        # 3,680 / 3,669 train / test examples.
        tfds_name="oxford_iiit_pet:4.*.*",
        num_classes=37,
        # task_adaptation oxford_iiit_pet.py: 80% of the 3,680 train
        # examples for training -> val200 starts at 2944.
        splits=_held_out_of_train(3680, 80)),
    Task(
        name="sun397", title="Sun397", group=NATURAL,
        # task_adaptation sun397.py pins the "tfds" config, sun397/tfds:4.*.*.
        tfds_name="sun397/tfds:4.*.*",
        num_classes=397,
        # task_adaptation sun397.py: the config's validation split.
        splits=_with_validation_split()),
    Task(
        name="svhn", title="SVHN", group=NATURAL,
        # task_adaptation svhn.py pins svhn_cropped:3.*.* (no "extra" split).
        tfds_name="svhn_cropped:3.*.*",
        num_classes=10,
        # task_adaptation svhn.py: 90% of the 73,257 train examples for
        # training -> val200 starts at 65931.
        splits=_held_out_of_train(73_257, 90)),
    # --- Specialized.
    Task(
        name="camelyon", title="Camelyon", group=SPECIALIZED,
        # task_adaptation patch_camelyon.py pins patch_camelyon:2.*.*.
        tfds_name="patch_camelyon:2.*.*",
        num_classes=2,
        # task_adaptation patch_camelyon.py: TFDS's validation split.
        splits=_with_validation_split()),
    Task(
        name="eurosat", title="EuroSAT", group=SPECIALIZED,
        # task_adaptation eurosat.py: the "rgb" config, eurosat/rgb:2.*.*.
        tfds_name="eurosat/rgb:2.*.*",
        num_classes=10,
        # task_adaptation eurosat.py: TFDS has only train, 27,000 examples;
        # 60% train (val200 at 16200), 20% val, last 20% test.
        splits=_held_out_of_train(27_000, 60, test="train[21600:]")),
    Task(
        name="resisc45", title="Resisc45", group=SPECIALIZED,
        # task_adaptation resisc45.py pins resisc45:3.*.*.
        tfds_name="resisc45:3.*.*",
        num_classes=45,
        # task_adaptation resisc45.py: TFDS has only train, 31,500 examples;
        # 60% train (val200 at 18900), 20% val, last 20% test.
        splits=_held_out_of_train(31_500, 60, test="train[25200:]")),
    Task(
        name="retinopathy", title="Retinopathy", group=SPECIALIZED,
        # task_adaptation diabetic_retinopathy.py: config btgraham-300 (as
        # run_all_tasks.sh asks), version 3.*.*; TFDS needs a manual download.
        tfds_name="diabetic_retinopathy_detection/btgraham-300:3.*.*",
        # TFDS: diabetic retinopathy grades 0..4.
        num_classes=5,
        # task_adaptation diabetic_retinopathy.py: TFDS's validation split.
        splits=_with_validation_split()),
    # --- Structured.
    Task(
        name="clevr_count", title="Clevr-Count", group=STRUCTURED,
        # task_adaptation clevr.py pins clevr:3.*.*.
        tfds_name="clevr:3.*.*",
        # task_adaptation clevr.py, task count_all: 8 classes (3..10 objects).
        num_classes=8,
        # task_adaptation clevr.py: 90% of the 70,000 train examples for
        # training -> val200 at 63000; TFDS's test split has no scenes, so
        # VTAB tests on TFDS's validation split.
        splits=_held_out_of_train(70_000, 90, test="validation"),
        label=clevr_count),
    Task(
        name="clevr_distance", title="Clevr-Dist", group=STRUCTURED,
        # task_adaptation clevr.py, as Clevr-Count.
        tfds_name="clevr:3.*.*",
        # task_adaptation clevr.py, task closest_object_distance: 6 classes.
        num_classes=6,
        # task_adaptation clevr.py, as Clevr-Count.
        splits=_held_out_of_train(70_000, 90, test="validation"),
        label=clevr_distance),
    Task(
        name="dmlab", title="DMLab", group=STRUCTURED,
        # task_adaptation dmlab.py pins exactly dmlab:2.0.1.
        tfds_name="dmlab:2.0.1",
        # TFDS dmlab: {close, far, very far} x {positive, negative reward}.
        num_classes=6,
        # task_adaptation dmlab.py: TFDS's validation split.
        splits=_with_validation_split()),
    Task(
        name="dsprites_location", title="dSprites-Loc", group=STRUCTURED,
        # task_adaptation dsprites.py pins dsprites:2.*.*; images 64x64x1.
        tfds_name="dsprites:2.*.*",
        # run_all_tasks.sh: label_x_position in 16 classes.
        num_classes=_DSPRITES_CLASSES,
        # task_adaptation dsprites.py: TFDS has only train, 737,280
        # examples; 80% train (val200 at 589824), 10% val, last 10% test.
        splits=_held_out_of_train(737_280, 80, test="train[663552:]"),
        label=dsprites_location, image=dsprites_image),
    Task(
        name="dsprites_orientation", title="dSprites-Ori", group=STRUCTURED,
        # task_adaptation dsprites.py, as dSprites-Loc.
        tfds_name="dsprites:2.*.*",
        # run_all_tasks.sh: label_orientation in 16 classes.
        num_classes=_DSPRITES_CLASSES,
        # task_adaptation dsprites.py, as dSprites-Loc.
        splits=_held_out_of_train(737_280, 80, test="train[663552:]"),
        label=dsprites_orientation, image=dsprites_image),
    Task(
        name="kitti_distance", title="KITTI-Dist", group=STRUCTURED,
        # task_adaptation kitti.py pins exactly kitti:3.1.0, a version TFDS
        # supports beside its default, 3.3.0.
        tfds_name="kitti:3.1.0",
        # task_adaptation kitti.py, task closest_vehicle_distance: 4 classes.
        num_classes=4,
        # task_adaptation kitti.py: TFDS's validation split (by video).
        splits=_with_validation_split(),
        label=kitti_distance),
    Task(
        name="smallnorb_azimuth", title="sNORB-Azim", group=STRUCTURED,
        # task_adaptation smallnorb.py pins smallnorb:2.*.*; images 96x96x1.
        tfds_name="smallnorb:2.*.*",
        # TFDS smallnorb: label_azimuth has 18 classes.
        num_classes=18,
        # task_adaptation smallnorb.py: validation is the first 50% of TFDS's
        # test split, test the second half.
        splits=_splits("train[:800]", "test[:200]", "test[50%:]"),
        label=smallnorb_azimuth),
    Task(
        name="smallnorb_elevation", title="sNORB-Elev", group=STRUCTURED,
        # task_adaptation smallnorb.py, as sNORB-Azim.
        tfds_name="smallnorb:2.*.*",
        # TFDS smallnorb: label_elevation has 9 classes.
        num_classes=9,
        # task_adaptation smallnorb.py, as sNORB-Azim.
        splits=_splits("train[:800]", "test[:200]", "test[50%:]"),
        label=smallnorb_elevation),
)

TASKS = {task.name: task for task in _TASK_LIST}


def get(name):
  """The task called `name`; an InputError naming the valid ones otherwise."""
  try:
    return TASKS[name]
  except KeyError:
    raise errors.InputError(f"Unknown VTAB task {name!r}; valid: "
                            f"{', '.join(TASKS)}.") from None


def by_group():
  """{group: [tasks in the paper's order]} for each of GROUPS, in order."""
  return {group: [task for task in TASKS.values() if task.group == group]
          for group in GROUPS}


def select(spec):
  """"natural,clevr_count" -> those Tasks, in the paper's order; "all" for
  the 19."""
  wanted = set()
  for part in (p.strip() for p in spec.split(",") if p.strip()):
    if part == "all":
      wanted |= set(TASKS)
    elif part in GROUPS:
      wanted |= {t.name for t in by_group()[part]}
    else:
      wanted.add(get(part).name)  # An InputError naming the tasks.
  if not wanted:
    raise errors.InputError("--tasks names no task")
  return [task for name, task in TASKS.items() if name in wanted]
