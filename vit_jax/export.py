"""python -m vit_jax.export --workdir=DIR [--step=N] --out=FILE.npz
python -m vit_jax.export --from=FILE.npz --out=FILE.npz

Writes params in the layout of the released vit_jax files, which the
released code and timm's .npz loader read: from a run's checkpoint (its
Polyak average when it kept one), or from an .npz of any layout that
`checkpoint.load_npz` reads (big_vision's, scanned, prefixed, bfloat16).
"""

if __name__ == "__main__":
  # First, before JAX, TF or any thread starts: may re-execute this command.
  from vit_jax import cli
  cli.prepare()

import os  # pylint: disable=g-import-not-at-top,wrong-import-position

from absl import flags

from vit_jax import checkpoint, cli, pretrained

flags.DEFINE_string("workdir", None, "A run's workdir.")
flags.DEFINE_integer("step", None, "Its checkpoint to export (default: the "
                     "newest).")
flags.DEFINE_string("from", None, "An .npz to convert instead of a run.")
flags.DEFINE_string("out", None, "The .npz to write.")
flags.mark_flag_as_required("out")
flags.register_multi_flags_validator(
    ["workdir", "from"], lambda f: bool(f["workdir"]) != bool(f["from"]),
    "give exactly one of --workdir and --from")


def main(argv):
  del argv  # cli.run refuses positional arguments.
  f = flags.FLAGS
  if f["from"].value:
    params, what = checkpoint.load_npz(f["from"].value), f["from"].value
  else:
    params, what = pretrained.load_run(f.workdir, f.step)
  checkpoint.save_npz(params, f.out)
  print(f"wrote {os.path.abspath(f.out)} from {what}")


if __name__ == "__main__":
  cli.run(main)
