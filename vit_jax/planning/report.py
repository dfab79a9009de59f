"""The plan in words: one slice's report, a comparison table, and what
would make a step that does not fit fit."""

from vit_jax import sharding
from vit_jax.planning.catalogue import EXPECTED_OVER_PLANNED, GENERATIONS, GiB
from vit_jax.training import fitting


def suggestions(keys, result):
  """What would bring the plan of the Settings `keys` that does not fit
  under the device's HBM, each with the estimate that makes it a
  candidate; `plan` again to be sure."""
  out = []
  args, temp = result.hbm_argument_bytes, result.hbm_temp_bytes
  mesh = result.mesh
  per_device_batch = keys.batch_size // (mesh["data"] * mesh["fsdp"])
  if mesh["fsdp"] == 1:
    fsdp = min(16, mesh["data"])
    out.append(
        f"--config.mesh.fsdp={fsdp}: params and optimizer state split "
        f"{fsdp} ways instead of copied on every device ({args / GiB:.1f} "
        f"GiB of arguments now, about {args / fsdp / GiB:.1f} GiB then)")
  if not keys.model.remat_policy:
    out.append(
        "--config.model.remat_policy=nothing_saveable: the backward pass "
        "recomputes each block, so only the blocks' inputs are kept "
        f"({temp / GiB:.1f} GiB of temporaries now; costs about a third "
        "more FLOPs); dots_with_no_batch_dims_saveable keeps the matmuls' "
        "outputs and recomputes less")
  if per_device_batch % (2 * keys.accum_steps) == 0:
    accum = 2 * keys.accum_steps
    out.append(
        f"--config.accum_steps={accum}: {per_device_batch // accum} images "
        f"per device at a time instead of "
        f"{per_device_batch // keys.accum_steps}, about halving the "
        "activations, at the same batch")
  if not keys.model.scan_layers:
    out.append("--config.model.scan_layers=True with a remat_policy: one "
               "compiled block for all layers, keeping what the policy saves "
               "(without remat, a scan keeps more than unrolled layers do)")
  slices = list(GENERATIONS[result.generation].slices)
  if result.topology in slices[:-1]:
    out.append(f"--topology={slices[slices.index(result.topology) + 1]}: "
               "fewer images per device")
  return out


def describe(config_name, result):
  """The plan as the lines a person reads."""
  mesh = sharding.describe_mesh(result.mesh)
  per_device = result.batch_size / result.devices
  capacity = result.hbm_capacity_bytes / GiB
  verdict = ("fits" if result.fits else
             "DOES NOT FIT (the compiler stopped at the temporaries)")
  lines = [
      f"{config_name} on TPU {result.description}: "
      f"{_plural(result.chips, 'chip')}"
      f" as {_plural(result.devices, 'device')}, "
      f"{_plural(result.hosts, 'host')}",
      f"  mesh          {mesh}; batch {result.batch_size}"
      + (f" sequences of up to {result.packing['slots']} images (about "
         f"{result.packing['images_per_sequence']:g} read for each)"
         if result.packing else "")
      + f", {per_device:g} per device"
      + (f", {result.accum_steps} micro-batches"
         if result.accum_steps > 1 else ""),
      f"  HBM           {result.hbm_argument_bytes / GiB:.2f} GiB arguments "
      f"+ {result.hbm_temp_bytes / GiB:.2f} GiB temporaries = "
      f"{result.hbm_bytes_per_device / GiB:.2f} GiB per device of "
      f"{capacity:.0f}: {verdict}"]
  if result.remat_tried:  # "auto" compiled it with more than one policy.
    lines.append(f"  remat         {result.remat_policy!r}, as 'auto' "
                 f"chose it ({fitting.describe_tried(result.remat_tried)})")
  if result.estimated_step_seconds is None:
    lines.append("  step time     no estimate until it fits")
  else:
    hours = result.predicted_chip_hours
    lines += [
        f"  FLOPs         {result.flops_per_device_per_step:.3g} per device "
        f"per step (compiler's count); the model's matmuls "
        f"{result.model_flops_per_device_per_step:.3g}",
        f"  step time     {result.estimated_step_seconds:.4g} s (compiler's "
        f"estimate{' + DCN' if result.dcn_seconds_per_step else ''}): "
        f"MFU {result.mfu:.1%} of "
        f"{result.peak_flops_per_device / 1e12:.1f} TFLOP/s per device",
        *_kernel_lines(result),
        *_bound_lines(result),
        *_dcn_lines(result),
        *_work_lines(result),
        f"  steps         {result.total_steps:,}",
        f"  chip-hours    {_number(result.train_chip_hours)} training + "
        f"{result.overhead:.0%} for evaluation, checkpoints and restarts = "
        f"{_number(hours)} ({_number(hours / result.chips)} hours on "
        f"{result.chips} chips)",
        _expected_line(result)]
    if result.predicted_core_days is not None:
      lines.append(f"  core-days     {_number(result.predicted_core_days)} "
                   "TPUv3-core-days (the paper's unit)")
  lines.append(
      f"  compiled in   {result.compile_seconds:.0f} s" + (
          f", and {result.cost_compile_seconds:.0f} s for the estimate "
          "(its twins without loops)" if result.cost_compile_seconds
          else ""))
  if result.suggestions:
    lines.append("  to make it fit, try:")
    lines.extend(f"    {s}" for s in result.suggestions)
  return "\n".join(lines)


def _expected_line(result):
  """The chip-hours to budget for: the compiler's figure is a lower bound."""
  low, high = result.expected_chip_hours
  least, most = EXPECTED_OVER_PLANNED
  return (f"  expected      {_number(low)}-{_number(high)} chip-hours: the "
          f"compiler's figure is a lower bound, and published runs took "
          f"{least:.2f}-{most:.2f} times it (docs/plan.md)")


def _kernel_lines(result):
  """What the compiler's figures leave out of the step's Pallas kernels."""
  if not result.pallas_kernels:
    return []
  flops = result.kernel_flops_per_device_per_step
  return [
      f"  kernels       {result.pallas_kernels} Pallas kernels (splash "
      "attention): the compiler prices them without seeing their work and",
      f"                leaves their {flops:.3g} FLOPs out of its count "
      f"(at peak, at least {flops / result.peak_flops_per_device:.3g} s)"]


def _bound_lines(result):
  """Which of HBM traffic and FLOPs takes longer at the data sheet's
  rates: libtpu's step time adds up each instruction's larger one
  (docs/plan.md)."""
  memory, compute = result.hbm_seconds, result.flops_seconds
  bound = "HBM" if memory > compute else "FLOPs"
  lines = [
      f"  bound by      {bound}: "
      f"{result.bytes_accessed_per_device_per_step / GiB:.3g} GiB read and "
      f"written per device per step take {memory:.4g} s at "
      f"{result.hbm_bandwidth_per_device / 1e9:,.0f} GB/s; its FLOPs "
      f"{compute:.4g} s at peak"]
  if bound == "HBM":
    lines.append(
        "                the weights, gradients and optimizer state are read "
        "and written once a step, whatever the batch: more images per "
        "device (a smaller slice) raise the MFU (docs/plan.md)")
  return lines


def _dcn_lines(result):
  """What crosses between slices, and how long it takes; none on one."""
  if result.slices == 1:
    return []
  return [
      f"  DCN           {result.dcn_bytes_per_device_per_step / 2**20:.4g} "
      f"MiB sent per device per step between slices: "
      f"{result.dcn_seconds_per_step:.4g} s at "
      f"{result.dcn_bits_per_chip / 1e9:g} Gbit/s per chip, added to the "
      "compiler's estimate (not overlapped: at most)"]


def _work_lines(result):
  """The step's estimated cycles by kind of work, largest first."""
  if not result.work_shares:
    return []
  kinds = sorted(result.work_shares.items(), key=lambda kv: -kv[1])
  return ["  work          " + ", ".join(
      f"{kind} {share:.0%}" for kind, share in kinds if share >= 0.005)
          + " of the instructions' estimated cycles"]


def describe_comparison(config_name, results, cheapest=None, left_out=()):
  """Plans of one config on several slices as one table; `cheapest`: the
  index of the row to mark as the one of fewest expected chip-hours;
  `left_out`: "NAME: why" of each slice not planned (cost.cheapest's)."""
  header = ("slice", "chips", "hosts", "mesh", "per device",
            "HBM per device", "MFU", "step time", "chip-hours",
            "expected chip-hours", "TPUv3-core-days")
  rows = [header]
  for i, r in enumerate(results):
    estimated = r.estimated_step_seconds is not None
    rows.append((
        r.description + (" *" if i == cheapest else ""), f"{r.chips:,}",
        f"{r.hosts:,}", "x".join(str(n) for n in r.mesh.values()),
        f"{r.batch_size / r.devices:g}" + (
            f" in {r.accum_steps} micro-batches" if r.accum_steps > 1
            else ""),
        f"{r.hbm_bytes_per_device / GiB:.1f} of "
        f"{r.hbm_capacity_bytes / GiB:.0f} GiB"
        + (f" (remat {r.remat_policy})" if r.remat_tried else "")
        + ("" if r.fits else " DOES NOT FIT"),
        f"{r.mfu:.0%}" if estimated else "-",
        f"{r.estimated_step_seconds:.3g} s" if estimated else "-",
        _number(r.predicted_chip_hours) if estimated else "-",
        "-".join(_number(h) for h in r.expected_chip_hours) if estimated
        else "-",
        "-" if r.predicted_core_days is None
        else _number(r.predicted_core_days)))
  widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
  lines = [f"{config_name}: batch {results[0].batch_size}, "
           f"{results[0].total_steps:,} steps; mesh is data x fsdp x model; "
           f"chip-hours and core-days include "
           f"{results[0].overhead:.0%} for evaluation, checkpoints and "
           "restarts"]
  lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)
                      ).rstrip() for row in rows]
  for r in results:
    if r.suggestions:
      lines.append(f"{r.description} does not fit; try: "
                   + "; ".join(s.split(":")[0] for s in r.suggestions))
  lines += describe_left_out(left_out)
  if cheapest is not None:
    low, high = results[cheapest].expected_chip_hours
    lines.append(f"* the fewest expected chip-hours: "
                 f"{results[cheapest].description}, {_number(low)}-"
                 f"{_number(high)}")
  return "\n".join(lines)


def describe_left_out(left_out):
  """A line per slice of the generation that was not planned, and why."""
  return [f"left out {line}" for line in left_out]


def _plural(n, noun):
  return f"{n:,} {noun}" + ("" if n == 1 else "s")


def _number(x):
  return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"
