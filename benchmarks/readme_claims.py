"""The accuracies the README and docs quote for the digits, measured: each
claim's commands run as the README gives them, at full length, for each
seed.

  python benchmarks/readme_claims.py [--seeds=3] [--claims=...] [--dir=DIR]

Claims (--claims, comma-separated; default all):
  digits     `make train`'s run (configs/digits.py): test accuracy at step
             250 and at the end (1,000 steps);
  finetune   that run exported as .npz and fine-tuned at 16 x 16 for 100
             steps ("Fine-tune a released checkpoint");
  transfer   `make transfer`: pre-train on 0-4, then on 5-9 fine-tune it and
             train the same model from scratch (configs/digits_transfer.py);
  distill    a student of half the width from that run (configs/distill/
             digits.py), soft and DeiT's, against the same student from the
             labels alone;
  mae        `make mae`: a masked autoencoder pre-trained without labels,
             fine-tuned from 10 labels a digit, against the same fine-tuning
             from scratch (configs/mae/digits.py), its linear probe from
             every label, and the pre-training's first and last training
             loss;
  dino       `make dino`: self-distillation without labels, its teacher's
             k-NN and 10-shot accuracy at the end against the initial
             model's (the same run for 2 steps at learning rate 0), its
             first and last DINO loss, then fine-tuned from 10 labels a
             digit against the same from scratch (configs/dino/digits.py);
  siglip     two towers on the digits captioned from templates: zero-shot
             test accuracy through unseen templates and through the
             training ones at step 500 and at the end, then its image
             tower fine-tuned from 10 labels a digit against the same from
             scratch (configs/siglip/digits.py).
The regularisation claim has its own benchmark, benchmarks/regularisation.py.

Each command runs in a process of its own (`python -m vit_jax.main ...`),
as typed, with `--config.seed=S` added for seed S (the digits run's seed
also seeds its fine-tune and its students' teacher). Prints a line per
claim: the values per seed, their mean, and the smallest gap a claim rests
on. On 360 test digits one image is 0.0028 of accuracy.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLAIMS = ("digits", "finetune", "transfer", "distill", "mae", "dino",
          "siglip")


def main_run(workdir, config, *overrides):
  """Runs `python -m vit_jax.main` and returns its metrics.jsonl rows."""
  command = [sys.executable, "-m", "vit_jax.main", f"--config={config}",
             f"--workdir={workdir}", *overrides]
  done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
  if done.returncode:
    sys.exit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def accuracy(rows, step=None):
  """test_accuracy at `step` (default: the last evaluation)."""
  scored = [row for row in rows if "test_accuracy" in row]
  if step is not None:
    scored = [row for row in scored if row["step"] == step]
  return scored[-1]["test_accuracy"]


def measure(claims, seed, scratch):
  """{name: accuracy} of `claims` for one seed."""
  here = os.path.join(scratch, f"seed{seed}")
  seeded = f"--config.seed={seed}"
  got = {}
  digits = os.path.join(here, "digits")
  if {"digits", "finetune", "distill"} & set(claims):
    rows = main_run(digits, "configs/digits.py", seeded)
    got.update(digits_250=accuracy(rows, 250), digits=accuracy(rows))
  if "finetune" in claims:
    npz = os.path.join(here, "digits.npz")
    subprocess.run([sys.executable, "-m", "vit_jax.export",
                    f"--workdir={digits}", f"--out={npz}"], cwd=REPO,
                   check=True, capture_output=True)
    got["finetune"] = accuracy(main_run(
        os.path.join(here, "digits16"), "configs/digits.py", seeded,
        f"--config.init_from={npz}", "--config.image_size=16",
        "--config.optimizer.name=sgd", "--config.optimizer.learning_rate=0.03",
        "--config.optimizer.weight_decay=0",
        "--config.optimizer.warmup_steps=10", "--config.total_steps=100",
        "--config.model.dropout_rate=0"))
  if "transfer" in claims:
    for stage in ("pretrain", "finetune", "scratch", "probe"):
      got[f"transfer_{stage}"] = accuracy(main_run(
          os.path.join(here, "transfer", stage),
          f"configs/digits_transfer.py:{stage}", seeded,
          *([f"--config.init_from={os.path.join(here, 'transfer', 'pretrain')}"]
            if stage in ("finetune", "probe") else [])))
  if "distill" in claims:
    teacher = f"--config.distill.teacher={digits}"
    got["distill_labels"] = accuracy(main_run(
        os.path.join(here, "labels"), "configs/distill/digits.py", seeded,
        "--config.distill.teacher="))
    got["distill_soft"] = accuracy(main_run(
        os.path.join(here, "soft"), "configs/distill/digits.py", seeded,
        teacher))
    got["distill_deit"] = accuracy(main_run(
        os.path.join(here, "deit"), "configs/distill/digits.py:deit", seeded,
        teacher))
  if "mae" in claims:
    for stage in ("pretrain", "finetune", "scratch", "probe"):
      rows = main_run(
          os.path.join(here, "mae", stage), f"configs/mae/digits.py:{stage}",
          seeded,
          *([f"--config.init_from={os.path.join(here, 'mae', 'pretrain')}"]
            if stage in ("finetune", "probe") else []))
      if stage == "pretrain":
        losses = [row["train_loss"] for row in rows if "train_loss" in row]
        got.update(mae_first_loss=losses[0], mae_last_loss=losses[-1],
                   mae_fewshot=[row for row in rows if
                                "fewshot/digits_10shot" in row][-1][
                                    "fewshot/digits_10shot"])
      else:
        got[f"mae_{stage}"] = accuracy(rows)
  if "dino" in claims:
    pretrain = os.path.join(here, "dino", "pretrain")
    # The initialisation's: 2 steps at learning rate 0 (the teacher, an
    # average of the unmoved student, is the initial model), evaluated at
    # the end as every run is.
    init = main_run(os.path.join(here, "dino", "init"),
                    "configs/dino/digits.py:pretrain", seeded,
                    "--config.optimizer.learning_rate=0",
                    "--config.total_steps=2",
                    "--config.optimizer.warmup_steps=1")
    rows = main_run(pretrain, "configs/dino/digits.py:pretrain", seeded)
    for name, metric in (("knn", "knn/digits_20nn"),
                         ("fewshot", "fewshot/digits_10shot")):
      got[f"dino_{name}_init"] = [row for row in init if metric in row][
          -1][metric]
      got[f"dino_{name}"] = [row for row in rows if metric in row][-1][
          metric]
    losses = [row["dino_loss"] for row in rows if "dino_loss" in row]
    got.update(dino_first_loss=losses[0], dino_last_loss=losses[-1])
    for stage in ("finetune", "scratch"):
      got[f"dino_{stage}"] = accuracy(main_run(
          os.path.join(here, "dino", stage), f"configs/dino/digits.py:{stage}",
          seeded, *([f"--config.init_from={pretrain}"]
                    if stage == "finetune" else [])))
  if "siglip" in claims:
    pretrain = os.path.join(here, "siglip", "pretrain")
    rows = main_run(pretrain, "configs/siglip/digits.py", seeded)
    for name in ("zero_shot", "seen_templates"):
      metric = f"{name}/digits_accuracy"
      scored = {row["step"]: row[metric] for row in rows if metric in row}
      got[f"siglip_{name}_500"] = scored[500]
      got[f"siglip_{name}"] = scored[max(scored)]
    for stage in ("finetune", "scratch"):
      got[f"siglip_{stage}"] = accuracy(main_run(
          os.path.join(here, "siglip", stage),
          f"configs/siglip/digits.py:{stage}", seeded,
          *([f"--config.init_from={pretrain}"] if stage == "finetune"
            else [])))
  return got


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, default=1)
  parser.add_argument("--claims", default=",".join(CLAIMS))
  parser.add_argument("--dir", default=None,
                      help="where the runs go (default: a temporary folder)")
  args = parser.parse_args()
  claims = args.claims.split(",")
  unknown = set(claims) - set(CLAIMS)
  if unknown:
    parser.error(f"unknown claims {sorted(unknown)}; they are {CLAIMS}")
  scratch = args.dir or tempfile.mkdtemp(prefix="readme_claims_")
  results = [measure(claims, seed, scratch) for seed in range(args.seeds)]
  for name in results[0]:
    values = [result[name] for result in results]
    print(f"{name:18s} mean {statistics.mean(values):.4f} | seeds "
          + " ".join(f"{v:.4f}" for v in values))
  if "transfer" in claims:
    gaps = [r["transfer_finetune"] - r["transfer_scratch"] for r in results]
    print(f"transfer: fine-tune minus scratch, smallest {min(gaps):+.4f}")
  if "distill" in claims:
    for kind in ("soft", "deit"):
      gaps = [r[f"distill_{kind}"] - r["distill_labels"] for r in results]
      print(f"distill {kind} minus labels alone: "
            + " ".join(f"{g:+.4f}" for g in gaps))
  if "mae" in claims:
    gaps = [r["mae_finetune"] - r["mae_scratch"] for r in results]
    print(f"mae: fine-tune minus scratch, smallest {min(gaps):+.4f}, mean "
          f"{statistics.mean(gaps):+.4f}")
  if "dino" in claims:
    gaps = [r["dino_knn"] - r["dino_knn_init"] for r in results]
    print(f"dino: k-NN minus the initialisation's, smallest {min(gaps):+.4f}")
    gaps = [r["dino_finetune"] - r["dino_scratch"] for r in results]
    print(f"dino: fine-tune minus scratch, smallest {min(gaps):+.4f}, mean "
          f"{statistics.mean(gaps):+.4f}")
  if "siglip" in claims:
    print("siglip: zero-shot through unseen templates, smallest "
          f"{min(r['siglip_zero_shot'] for r in results):.4f}")
    gaps = [r["siglip_finetune"] - r["siglip_scratch"] for r in results]
    print(f"siglip: fine-tune minus scratch, smallest {min(gaps):+.4f}, "
          f"mean {statistics.mean(gaps):+.4f}")
  print(f"runs in {scratch}")


if __name__ == "__main__":
  main()
