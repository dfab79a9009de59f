"""python -m vit_jax.figures --workdir=DIR | --from=SOURCE [--images=PATH,...] [--out=DIR]
python -m vit_jax.figures ... --max_num_patches=N [IMAGES]

What a ViT has learned, as in Section 4.5 of the paper (Figures 6 and 7),
and a run's training curves. Writes PNGs into --out (default DIR/figures):

  embedding_filters.png        principal components of the patch-embedding
                               filters, as RGB patches (Fig. 7, left); none
                               for a hybrid
  position_embedding_similarity.png
                               cosine similarity of each patch's position
                               embedding with every other's (Fig. 7,
                               centre); none for posemb "none"
  mean_attention_distance.png  per layer and head, how far in pixels the
                               attention reaches (Fig. 7, right)
  attention_rollout.png        what the class token attends to, through all
                               layers, over sample images (Fig. 6); a
                               model's registers are left out of it and
                               of the distances
  patch_components.png         the first three principal components of the
                               patch features over those images, as red,
                               green and blue (DINOv2's figures); square
                               images only
  training_curves.png          loss, learning rate, accuracy, throughput and
                               core-days from a run's metrics.jsonl
  reconstructions.png          a masked autoencoder's run (objective mae):
                               images, their visible patches and the
                               decoder's reconstruction of the rest

The attention figures look at --images, or else the first images of a
dataset split (--dataset, default the run's dataset; --split): square at
the model's resolution, or with --max_num_patches=N each at its own
aspect ratio, at the largest grid of at most N patches (NaFlex; the maps
and distances then follow each image's grid), and with --native_size at
its own size, shrunk only to fit. A NaFlex or packed run is read as its
evaluation read its images without those flags; each given overrides.
vit_jax/analysis/attention.py computes the numbers and
vit_jax/analysis/plots.py draws them.
"""


if __name__ == "__main__":
  # First, before JAX, TF or any thread starts: may re-execute this command.
  from vit_jax import cli
  cli.prepare()

from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position

from vit_jax import cli, paths
from vit_jax.analysis import attention as attention_lib
from vit_jax.cli import shared_flags
from vit_jax.data import image_files
from vit_jax.runs import workdir

shared_flags.define_model_source("inspect")
shared_flags.define_images()
flags.DEFINE_string("split", "test", "Without --images: the split of "
                    "--dataset whose first images to look at.")
flags.DEFINE_integer("num_images", 64, "Images the mean attention distance "
                     "is averaged over.", lower_bound=1)
flags.DEFINE_integer("rollout_images", 8, "Images shown with their "
                     "attention rollout.", lower_bound=1)
flags.DEFINE_string("out", None, "Where to write the PNGs (default: "
                    "WORKDIR/figures).")
flags.register_multi_flags_validator(
    ["out", "from"], lambda v: bool(v["out"]) or not v["from"],
    "--out is needed with --from")


def main(argv):
  f = flags.FLAGS
  paths.check_reachable(f.out, "--out", writes=True)
  for given, flag in ((f.images + argv[1:], "--images"),
                      (f.data_dir, "--data_dir")):
    paths.check_reachable(given, flag)
  if f.out:
    workdir.check_output(f.out, "--out")
  # Headless sources too (a DINOv3, a SigLIP tower): the figures read no
  # head.
  inference = shared_flags.model_from_flags(features=True)
  dataset, data_dir = inference.data(f.dataset, f.data_dir)
  samples = attention_lib.sample_images(inference, f.images + argv[1:],
                                        f.num_images, dataset, f.split,
                                        data_dir, shared_flags.naflex_budget(
                                            inference))
  names = image_files.name_classes(f.labels, dataset, data_dir,
                                   inference.model.num_classes)
  out = f.out or workdir.Workdir(f.workdir).figures
  for written in attention_lib.write_all(inference, out, samples, names,
                                    f.rollout_images, f.workdir):
    print(f"wrote {written}")


if __name__ == "__main__":
  cli.run(main, positional=True)
