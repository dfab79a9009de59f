"""Distillation: a frozen teacher's outputs as the student's targets.

config.distill.teacher names any source that init_from takes (a workdir
of ours, an .npz, an HF directory, a timm file, hf://ORG/NAME). It is read
once, when the run is resolved, and taken on its own input: its mean and
std are folded into its patch embedding (weights/exports.py), so it sees
the student's [-1, 1] images. They are config.distill.teacher_mean and
teacher_std where given, else its source's (an HF directory's
preprocessor_config.json, a timm hub config); a timm file says none, so
they are assumed, and the log says what, naming those keys. Inside the train step it runs on the very
batch the student sees, after cropping, flipping, RandAugment and Mixup
("consistent" teaching, Beyer et al. 2022), resized to its own
resolution; its params are an argument of the step, sharded over the
run's mesh by the same rules as the student's (FSDP where the mesh has
it), never part of the train state, so checkpoints hold the student alone.

  soft   per example, T^2 KL(softmax(t / T) || softmax(s / T)) of the
         teacher's logits t and the student's s at temperature T (Hinton
         et al. 2015; at T = 1 and no label loss, the function matching of
         Beyer et al.).
  hard   per example, the cross-entropy of the student's s with the
         teacher's top class, argmax t (DeiT's hard distillation, Touvron
         et al. 2021); the temperature plays no part.

The loss is label_weight x the label loss + (1 - label_weight) x this
term. A student with a distillation token (config.model.distill_token,
DeiT's) learns the labels by its class head and the teacher by its
distillation head (s is that head's logits), so both shares must be
above 0; DeiT's recipe is kind hard with label_weight 0.5. Such a
student predicts with the mean of its heads.
"""

import dataclasses
import math
import numbers

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from absl import logging

from vit_jax import errors, sharding
from vit_jax.models import encoder, flops
from vit_jax.weights import exports, hub, pretrained
from vit_jax.weights.pytorch import files

KINDS = ("soft", "hard")
# What sets a teacher's input normalisation: named where its source says
# none, with what is assumed (exports.in_own_input).
SETTERS = files.Setters("--config.distill.teacher_mean",
                        "--config.distill.teacher_std",
                        "set those config keys")


@dataclasses.dataclass(frozen=True)
class Teacher:
  """A frozen model whose logits the student learns, with its params."""
  model: nn.Module  # in the student's compute dtype, taking vit_jax's
  #                    images in [-1, 1]
  params: dict  # numpy arrays, the model's tree
  image_size: int  # the resolution it runs at
  what: str  # where its params came from, for messages
  kind: str  # KINDS
  temperature: float
  label_weight: float

  @property
  def num_classes(self):
    return self.model.num_classes

  def on_mesh(self, mesh, fsdp_min_bytes=0):
    """The teacher laid out over `mesh` by sharding.py's rules, as the
    student's params are (OnMesh)."""
    images = jnp.zeros((1, self.image_size, self.image_size, 3), jnp.float32)
    return OnMesh(self, *sharding.sharded_shapes(
        jax.eval_shape(lambda: self.model.init(
            jax.random.key(0), images, train=False)["params"]),
        mesh, fsdp_min_bytes))

  def place(self, shapes):
    """The params (float32 already: pretrained.inference_of's) as arrays
    laid out as `shapes` says, each device given its own slice."""
    return jax.tree.map(
        lambda value, shape: jax.make_array_from_callback(
            shape.shape, shape.sharding, lambda index: value[index]),
        self.params, shapes)

  def logits(self, params, images):
    """The teacher's float32 logits [n, classes] on the student's images
    (uint8, or float in [-1, 1]), resized to its resolution; no gradient
    flows back through them."""
    images = encoder.unit_range(images)
    n, height, width, channels = images.shape
    if (height, width) != (self.image_size, self.image_size):
      images = jax.image.resize(
          images, (n, self.image_size, self.image_size, channels), "bilinear")
    return jax.lax.stop_gradient(
        self.model.apply({"params": params}, images, train=False))

  def loss(self, student_logits, teacher_logits):
    """Each example's distillation term [n] (the module docstring)."""
    if self.kind == "hard":
      return optax.softmax_cross_entropy_with_integer_labels(
          student_logits.astype(jnp.float32), teacher_logits.argmax(-1))
    t = self.temperature
    teacher = jax.nn.log_softmax(teacher_logits.astype(jnp.float32) / t)
    student = jax.nn.log_softmax(student_logits.astype(jnp.float32) / t)
    return t * t * (jnp.exp(teacher) * (teacher - student)).sum(axis=-1)


class OnMesh:
  """A teacher, its params' shapes carrying their shardings over a run's
  mesh, and the params placed so (at the first use: the train step and
  the evaluators share them)."""

  def __init__(self, teacher, shapes, shardings):
    self.teacher, self.shapes, self.shardings = teacher, shapes, shardings
    self._params = None

  def params(self):
    if self._params is None:
      self._params = self.teacher.place(self.shapes)
    return self._params


def check(keys):
  """ConfigErrors of config.distill's values alone, naming the key."""
  distill = keys.distill
  if not distill.teacher:
    return
  if distill.kind not in KINDS:
    raise errors.ConfigError(
        f"config.distill.kind must be one of {list(KINDS)}, got "
        f"{distill.kind!r}")
  if not distill.temperature > 0:
    raise errors.ConfigError(f"config.distill.temperature must be > 0, got "
                             f"{distill.temperature!r}")
  if keys.model.mpp:
    raise errors.ConfigError(
        "config.distill.teacher: masked patch prediction predicts patch "
        "colours, which no teacher gives; set config.model.mpp=False")
  if keys.naflex.max_num_patches:
    raise errors.ConfigError(
        "config.distill.teacher: a teacher reads square images, and NaFlex "
        "images differ in shape; set config.naflex.max_num_patches=0")
  _check_normalization(distill)


def _check_normalization(distill):
  """ConfigErrors of teacher_mean and teacher_std: both or neither, each
  3 numbers, the mean's in [0, 1] (of pixels / 255), the std's > 0."""
  given = [name for name in ("teacher_mean", "teacher_std")
           if getattr(distill, name)]
  if len(given) == 1:
    raise errors.ConfigError(
        f"config.distill.{given[0]}: give teacher_mean and teacher_std "
        "both, or neither")
  for name, fits, bounds in (
      ("teacher_mean", lambda v: 0 <= v <= 1, "in [0, 1] (of pixels / 255)"),
      ("teacher_std", lambda v: v > 0, "> 0")):
    values = getattr(distill, name)
    if values and not (len(values) == 3 and all(
        isinstance(v, numbers.Real) and not isinstance(v, bool) and
        math.isfinite(v) and fits(v) for v in values)):
      raise errors.ConfigError(
          f"config.distill.{name} takes 3 numbers {bounds}, R,G,B; got "
          f"{values!r}")


def normalization(keys):
  """The teacher's input (a files.Normalization) that
  config.distill.teacher_mean and teacher_std give, or None where they are
  unset: its source's own then, else assumed (exports.in_own_input)."""
  distill = keys.distill
  if not distill.teacher_mean:
    return None
  return files.Normalization(
      tuple(float(v) for v in distill.teacher_mean),
      tuple(float(v) for v in distill.teacher_std),
      "config.distill.teacher_mean and teacher_std")


def pinned(keys, recorded=None):
  """`keys` with a hub name of a teacher made the commit it resolves to,
  as the run records it; a resumed run's name of the same repository is
  the one its `recorded` Settings hold (hub.as_recorded), as for
  init_from."""
  teacher = keys.distill.teacher
  if not hub.is_name(teacher):
    return keys
  if recorded is not None:
    name = hub.as_recorded(teacher, recorded.distill.teacher)
  else:
    try:
      name = pretrained.local(teacher).name
    except (errors.InputError, OSError) as e:
      raise errors.ConfigError.of(e, "config.distill.teacher", teacher) from e
  return dataclasses.replace(
      keys, distill=dataclasses.replace(keys.distill, teacher=name))


def load(keys):
  """The Teacher that `keys` (a run's Settings) name, read to host memory,
  or None where they name none. A teacher that cannot be read, or has no
  classifier, is a ConfigError naming the key."""
  source = keys.distill.teacher
  if not source:
    return None
  try:
    loaded = exports.in_own_input(pretrained.load(source),
                                  normalization(keys), say=logging.warning,
                                  setters=SETTERS)
    inference = pretrained.inference_of(loaded)
  except (errors.InputError, OSError) as e:
    raise errors.ConfigError.of(e, "config.distill.teacher", source) from e
  logging.info("distill: teacher %s at %d px", inference.what,
               inference.image_size)
  # It computes as the student does (bfloat16 on TPUs, in the Table 2 and
  # ImageNet configs), its params staying float32.
  model = inference.model.clone(config=dataclasses.replace(
      inference.model.config, dtype=keys.model.dtype))
  return Teacher(model, inference.params, inference.image_size,
                 inference.what, keys.distill.kind, keys.distill.temperature,
                 keys.distill.label_weight)


def flops_per_image(teacher):
  """The FLOPs of the teacher's forward pass on one image at its
  resolution, which a distilling step adds to the student's; 0 without
  one."""
  if teacher is None:
    return 0
  return flops.flops_per_image(teacher.model, teacher.image_size,
                               num_classes=teacher.num_classes)


def check_classes(teacher, num_classes):
  """A ConfigError where the teacher's classes are not the dataset's."""
  if teacher is not None and teacher.num_classes != num_classes:
    raise errors.ConfigError(
        f"config.distill.teacher {teacher.what} predicts "
        f"{teacher.num_classes} classes, the dataset has {num_classes}: a "
        "teacher must classify the student's classes")


def check_student(keys, model):
  """A ConfigError where a student with a distillation token would leave
  one of its heads untaught (the module docstring)."""
  weight = keys.distill.label_weight
  if keys.distill.teacher and model.config.distill_token and not (
      0 < weight < 1):
    raise errors.ConfigError(
        f"config.distill.label_weight={weight!r}: a student with a "
        "distillation token learns the labels by its class head and the "
        "teacher by its distillation head; give each a share, 0 < "
        "label_weight < 1 (DeiT's: 0.5)")
