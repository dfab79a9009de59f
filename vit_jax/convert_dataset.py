r"""python -m vit_jax.convert_dataset: a TFRecord dataset copied as ArrayRecord.

  python -m vit_jax.convert_dataset --dataset=imagenet2012 \
      --data_dir=DATA_DIR --out_data_dir=OUT_DIR

Writes the dataset's prepared version under OUT_DIR (same folders, same
records in the same order) in ArrayRecord, which training reads at random:
each epoch a permutation of the whole split, resumed at any step without
reading up to it (docs/input_pipeline.md). Train with
--config.data_dir=OUT_DIR. The original is left as it is.
"""

if __name__ == "__main__":
  # First, before JAX, TF or any thread starts: may re-execute this command.
  from vit_jax import cli
  cli.prepare()

from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position

from vit_jax import cli, paths
from vit_jax.data import conversion, sources

flags.DEFINE_string("dataset", None, "The TFDS dataset, as config.dataset "
                    "names it (imagenet2012, imagenet2012:5.1.0, ...).",
                    required=True)
flags.DEFINE_string("data_dir", None, "Where it is prepared as TFRecord "
                    "(unset: TFDS's default).")
flags.DEFINE_string("out_data_dir", None, "Where the ArrayRecord copy goes.",
                    required=True)


def main(argv):
  del argv  # cli.run refuses positional arguments.
  f = flags.FLAGS
  paths.check_reachable(f.data_dir, "--data_dir")
  paths.check_reachable(f.out_data_dir, "--out_data_dir", writes=True)
  builder = sources.get_builder(f.dataset, f.data_dir)
  print(f"Converting {builder.name} {builder.version} in {builder.data_dir}")
  target, before, after = conversion.convert(builder, f.out_data_dir)
  print(f"written to {target}: {after / 1e6:,.1f} MB of ArrayRecord for "
        f"{before / 1e6:,.1f} MB of TFRecord; train with "
        f"--config.data_dir={f.out_data_dir}")


if __name__ == "__main__":
  cli.run(main)
