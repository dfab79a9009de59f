"""Records Meta's DINOv2 loss modules, and DINOv3's Gram loss, on seeded
random arrays, for tests/test_dino_losses.py.

Run by hand, in a virtual environment of its own with torch (never the
project's), with checkouts of facebookresearch/dinov2 and dinov3, whose
dinov2/loss/*.py and dinov3/loss/gram_loss.py files are imported alone
(they need torch only):

  /work/torchvenv/bin/python benchmarks/record_dinov2_losses.py \
      --dinov2=CHECKOUT --dinov3=CHECKOUT --out=tests/fixtures/dinov2_losses

It writes inputs.safetensors (the arrays), outputs.safetensors (what the
modules return on them, each named as README.md there says) and
versions.json (torch, the checkout's commit). Inputs are float64; the
modules run on them as given (Sinkhorn-Knopp casts to float32 itself, as
Meta's code does). A one-process gloo group is started because
iBOTPatchLoss's Sinkhorn-Knopp all-reduces unconditionally. Written twice,
the files are the same bytes.
"""

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import tempfile

import numpy as np

SEED = 20261129
# Small sizes, odd so that no axis is confused with another.
CROPS_STUDENT, CROPS_TEACHER, BATCH, PROTOTYPES = 3, 2, 6, 17
PATCHES, FEATURES = 7, 8
TEMPERATURES = {"student": 0.1, "student_other": 0.2,
                "teacher": 0.07, "teacher_warm": 0.04}


def load_module(checkout, name, package="dinov2"):
  path = os.path.join(checkout, package, "loss", f"{name}.py")
  spec = importlib.util.spec_from_file_location(f"meta_{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def softmax(x):
  e = np.exp(x - x.max(axis=-1, keepdims=True))
  return e / e.sum(axis=-1, keepdims=True)


def draw_inputs():
  rng = np.random.default_rng(SEED)
  normal = rng.standard_normal
  inputs = {
      "dino/student_logits": 3 * normal(
          (CROPS_STUDENT, BATCH, PROTOTYPES)),
      "dino/teacher_probs": softmax(2 * normal(
          (CROPS_TEACHER, BATCH, PROTOTYPES))),
      # Logits of a weight-normalised head: in [-1, 1] at its initial scale.
      "sinkhorn/teacher_logits": np.tanh(normal((2 * BATCH, PROTOTYPES))),
      "center/first_logits": normal((2 * BATCH, PROTOTYPES)),
      "center/second_logits": normal((2 * BATCH, PROTOTYPES)),
      "ibot/student_logits": 3 * normal((BATCH, PATCHES, PROTOTYPES)),
      "ibot/teacher_probs": softmax(2 * normal(
          (BATCH, PATCHES, PROTOTYPES))),
      "koleo/features": normal((3 * BATCH, FEATURES)),
  }
  masks = rng.random((BATCH, PATCHES)) < 0.4
  masks[0] = False  # An image with no masked patch counts as 0.
  masks[1, 0] = True
  inputs["ibot/masks"] = masks.astype(np.float64)
  # Patch features of a student and a Gram teacher (DINOv3), alike enough
  # that their similarities share signs, and unlike enough to differ.
  teacher = normal((BATCH, PATCHES, FEATURES))
  inputs["gram/teacher_features"] = teacher
  inputs["gram/student_features"] = teacher + normal(
      (BATCH, PATCHES, FEATURES))
  # Two equal rows: each one's nearest neighbour at distance 0, where
  # KoLeo's epsilons decide the value.
  inputs["koleo/features"][5] = inputs["koleo/features"][4]
  return inputs


def record_gram(checkout, inputs):
  """DINOv3's GramLoss under each of its settings."""
  import torch  # pylint: disable=g-import-not-at-top
  gram = load_module(checkout, "gram_loss", package="dinov3")
  student = torch.from_numpy(inputs["gram/student_features"])
  teacher = torch.from_numpy(inputs["gram/teacher_features"])
  settings = {
      "loss": {},  # GramLoss's defaults: normalised, negatives removed
      "loss_keep_negatives": dict(remove_neg=False),  # DINOv3's configs
      "loss_only_teacher_negatives": dict(remove_neg=False,
                                          remove_only_teacher_neg=True),
      "loss_unnormalised": dict(apply_norm=False, remove_neg=False)}
  out = {}
  with torch.no_grad():
    for name, kwargs in settings.items():
      out[f"gram/{name}"] = gram.GramLoss(**kwargs)(student, teacher)
    out["gram/loss_batch_level"] = gram.GramLoss(remove_neg=False)(
        student, teacher, img_level=False)
  return {key: np.asarray(value.numpy(), np.float64)
          for key, value in out.items()}


def record(checkout, inputs):
  import torch  # pylint: disable=g-import-not-at-top
  dino = load_module(checkout, "dino_clstoken_loss")
  ibot = load_module(checkout, "ibot_patch_loss")
  koleo = load_module(checkout, "koleo_loss")
  t = {key: torch.from_numpy(value) for key, value in inputs.items()}
  out = {}
  with torch.no_grad():
    student, teacher = t["dino/student_logits"], t["dino/teacher_probs"]
    for name in ("student", "student_other"):
      loss = dino.DINOLoss(PROTOTYPES, student_temp=TEMPERATURES[name])
      out[f"dino/loss_{name}"] = loss(list(student), list(teacher))

    loss = dino.DINOLoss(PROTOTYPES)
    for name in ("teacher", "teacher_warm"):
      out[f"sinkhorn/probs_{name}"] = loss.sinkhorn_knopp_teacher(
          t["sinkhorn/teacher_logits"], TEMPERATURES[name])
    out["sinkhorn/probs_one_iteration"] = loss.sinkhorn_knopp_teacher(
        t["sinkhorn/teacher_logits"], TEMPERATURES["teacher"],
        n_iterations=1)
    # iBOT's Sinkhorn-Knopp over the first 9 rows only (the masked
    # patches; the test pads the rest).
    patches = ibot.iBOTPatchLoss(PROTOTYPES)
    out["sinkhorn/ibot_probs_first9"] = patches.sinkhorn_knopp_teacher(
        t["sinkhorn/teacher_logits"][:9], TEMPERATURES["teacher"],
        n_masked_patches_tensor=torch.tensor(9))

    # DINO's running center: a first batch's softmax (center 0), its
    # update, then a second batch's softmax against the updated center.
    loss = dino.DINOLoss(PROTOTYPES)
    out["center/first_probs"] = loss.softmax_center_teacher(
        t["center/first_logits"], TEMPERATURES["teacher"])
    loss.update_center(t["center/first_logits"])
    out["center/second_probs"] = loss.softmax_center_teacher(
        t["center/second_logits"], TEMPERATURES["teacher"])
    out["center/center_after_first"] = loss.center[0].clone()

    patches = ibot.iBOTPatchLoss(PROTOTYPES)
    masks = t["ibot/masks"].bool()
    out["ibot/loss"] = patches(t["ibot/student_logits"],
                               t["ibot/teacher_probs"], masks)
    out["ibot/loss_masked"] = patches.forward_masked(
        t["ibot/student_logits"][masks], t["ibot/teacher_probs"][masks],
        masks)
    other = ibot.iBOTPatchLoss(PROTOTYPES,
                               student_temp=TEMPERATURES["student_other"])
    out["ibot/loss_student_other"] = other(
        t["ibot/student_logits"], t["ibot/teacher_probs"], masks)

    out["koleo/loss"] = koleo.KoLeoLoss()(t["koleo/features"])
    out["koleo/loss_first_half"] = koleo.KoLeoLoss()(
        t["koleo/features"][:BATCH + 3])
  return {key: np.asarray(value.numpy(), np.float64)
          for key, value in out.items()}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--dinov2", required=True,
                      help="a checkout of facebookresearch/dinov2")
  parser.add_argument("--dinov3", required=True,
                      help="a checkout of facebookresearch/dinov3 (its "
                      "dinov3/loss/gram_loss.py)")
  parser.add_argument("--out", required=True)
  args = parser.parse_args()
  import torch  # pylint: disable=g-import-not-at-top
  import torch.distributed as dist  # pylint: disable=g-import-not-at-top
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(1)
  torch.use_deterministic_algorithms(True)
  with tempfile.TemporaryDirectory() as scratch:
    dist.init_process_group("gloo", init_method=f"file://{scratch}/group",
                            rank=0, world_size=1)
    inputs = draw_inputs()
    outputs = {**record(args.dinov2, inputs),
               **record_gram(args.dinov3, inputs)}
    dist.destroy_process_group()
  os.makedirs(args.out, exist_ok=True)
  save_file(inputs, os.path.join(args.out, "inputs.safetensors"))
  save_file(outputs, os.path.join(args.out, "outputs.safetensors"))
  commits = {
      f"facebookresearch/{name}": subprocess.run(
          ["git", "-C", checkout, "rev-parse", "HEAD"], capture_output=True,
          text=True).stdout.strip() or None
      for name, checkout in (("dinov2", args.dinov2),
                             ("dinov3", args.dinov3))}
  with open(os.path.join(args.out, "versions.json"), "w") as f:
    json.dump({"python": platform.python_version(),
               "torch": torch.__version__, "numpy": np.__version__,
               **commits,
               "temperatures": TEMPERATURES}, f, indent=2, sort_keys=True)
    f.write("\n")
  print(f"wrote {args.out}: {len(outputs)} outputs")


if __name__ == "__main__":
  main()
