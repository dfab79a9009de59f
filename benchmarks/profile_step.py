"""Where one train step's time goes, op by op, on this machine's CPU.

  python benchmarks/profile_step.py [--model=Ti/16] [--batch=32]
      [--dtype=float32] [--top=30]

Traces one step of the run's own train step (as benchmarks/train_step.py
builds it) with `jax.profiler`, and joins each XLA:CPU thunk of the trace to
its instruction in the compiled, optimised HLO. For each it counts the
matmul FLOPs of the dots and convolutions inside (so a dot reports its
GFLOP/s), and names it by the JAX op it came from, with the layer index
dropped so the same op of every block adds up. Prints the time per kind
(dense and attention matmuls, patch embedding, forward and backward
element-wise work, the optimizer) and the `--top` ops. Thunks run side by
side (each device's, and a device's independent ops), so their times add up
to more than the step. Not run by the tests.
"""

import collections
import glob
import gzip
import json
import math
import os
import re
import sys
import tempfile

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_step  # pylint: disable=g-import-not-at-top,wrong-import-position

flags.DEFINE_string("model", "Ti/16", "Model name.")
flags.DEFINE_integer("batch", 32, "Global batch size.")
flags.DEFINE_string("dtype", "float32", "Compute dtype.")
flags.DEFINE_integer("top", 30, "How many ops to list.")

_INSTRUCTION = re.compile(r"\s*(?:ROOT )?%(\S+) = (\S+) ([\w-]+)\((.*)")


def _dims(shape):
  """[3,4] from 'f32[3,4]{1,0}'; [] for a scalar or a tuple."""
  match = re.match(r"\w+\[([\d,]*)\]", shape)
  return [int(d) for d in match.group(1).split(",") if d] if match else []


def parse_hlo(text):
  """{computation: [instruction lines]} and {instruction: (shape, line)}."""
  computations, instructions, current = {}, {}, None
  for line in text.splitlines():
    header = re.match(r"^(?:ENTRY )?%(\S+) .*\{$", line)
    if header:
      current = computations.setdefault(header.group(1), [])
    elif line.startswith("}"):
      current = None
    elif current is not None:
      current.append(line)
      match = _INSTRUCTION.match(line)
      if match:
        instructions[match.group(1)] = (match.group(2), line)
  return computations, instructions


def instruction_flops(line, instructions):
  """FLOPs of one HLO line if it is a dot or a convolution, else 0."""
  match = _INSTRUCTION.match(line)
  if not match or match.group(3) not in ("dot", "convolution"):
    return 0
  out = _dims(match.group(2))
  operands = re.findall(r"%([\w.-]+)", match.group(4).split(")")[0])
  lhs, rhs = (_dims(instructions[name][0]) for name in operands[:2])
  if match.group(3) == "dot":
    contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", line)
    k = math.prod(lhs[int(d)] for d in contracting.group(1).split(",") if d)
    return 2 * math.prod(out) * k
  # Each output element sums kernel_size x input features products.
  kernel_labels = re.search(r"dim_labels=\w+_(\w+)->", line).group(1)
  return 2 * math.prod(out) * math.prod(rhs) // rhs[kernel_labels.index("o")]


def matmul_flops(line, computations, instructions):
  """FLOPs of the dots and convolutions that a thunk's HLO line runs: itself
  (an Eigen dot) or the computation it calls (a fusion)."""
  called = re.search(r"calls=%([\w.-]+)", line)
  if not called:
    return instruction_flops(line, instructions)
  return sum(instruction_flops(inner, instructions)
             for inner in computations.get(called.group(1), []))


def kind_of(op_name, flops):
  """A coarse kind for the summary, from the op's JAX name."""
  backward = "transpose(jvp(" in op_name
  if flops:
    if "embedding" in op_name:
      return "patch embedding (conv)"
    projection = re.search(r"/(query|key|value|out)/", op_name)
    if "MultiHeadDotProductAttention" in op_name and not projection:
      return "attention matmuls (q.k, weights.v)"
    return "dense matmuls"
  if "jvp(" in op_name:
    return "backward element-wise" if backward else "forward element-wise"
  return "optimizer, loss and other"


def profile(step, state, batch, top):
  """Prints the per-kind and per-op tables of one traced step."""
  import jax  # pylint: disable=g-import-not-at-top
  # Run the very program whose HLO is read, so that every thunk is found
  # (and the step compiles once, not twice).
  compiled = step.lower(state, batch).compile()
  numbers = step.numbers_on_devices()  # The schedule's, an argument.
  computations, instructions = parse_hlo(compiled.as_text())
  for _ in range(2):  # Warm up: first-touch allocations, thread pools.
    state, metrics = compiled(state, batch, numbers)
    jax.block_until_ready((state, metrics))
  with tempfile.TemporaryDirectory() as directory:
    jax.profiler.start_trace(directory, create_perfetto_trace=True)
    state, metrics = compiled(state, batch, numbers)
    jax.block_until_ready((state, metrics))
    jax.profiler.stop_trace()
    path, = glob.glob(f"{directory}/**/*.trace.json.gz", recursive=True)
    with gzip.open(path) as f:
      events = json.load(f)
  if isinstance(events, dict):
    events = events["traceEvents"]
  ops = collections.defaultdict(lambda: {"us": 0.0, "flops": 0, "calls": 0})
  wall = 0.0
  eigen_flops = 0  # Of plain dots, which Eigen runs; a library's are fusions.
  for event in events:
    name = event.get("name", "")
    if event.get("ph") != "X":
      continue
    if name.startswith("ThunkExecutor::Execute (wait"):
      wall = max(wall, event["dur"])
    if name not in instructions:
      continue
    shape, line = instructions[name]
    flops = matmul_flops(line, computations, instructions)
    if "calls=" not in line:
      eigen_flops += flops
    op_name = re.search(r'op_name="([^"]*)"', line)
    op_name = op_name.group(1) if op_name else "(unnamed)"
    op_name = re.sub(r"^jit\(\w+\)/", "", op_name)
    op_name = re.sub(r"encoderblock_\d+", "encoderblock_*", op_name)
    row = ops[(kind_of(op_name, flops), op_name, shape.split("{")[0])]
    row["us"] += event["dur"]
    row["flops"] += flops
    row["calls"] += 1
  total = sum(r["us"] for r in ops.values())
  kinds = collections.defaultdict(lambda: [0.0, 0])
  for (kind, _, _), row in ops.items():
    kinds[kind][0] += row["us"]
    kinds[kind][1] += row["flops"]
  print(f"step {wall / 1e3:.0f} ms (traced); thunks {total / 1e3:.0f} ms\n")
  # An Eigen dot's thunk returns once its work is queued on the thread pool,
  # so the trace times the hand-off, not the matmul. The time of the step's
  # threads (one per device) that no thunk covers is mostly theirs.
  untimed = wall * jax.device_count() - total
  if untimed > 0 and eigen_flops:
    print(f"not in any thunk: {untimed / 1e3:.0f} ms of the devices' "
          f"threads; as the time of Eigen's dots, "
          f"{eigen_flops / untimed / 1e3:.0f} GFLOP/s (they run "
          "asynchronously)\n")
  print("| kind | ms | share | GFLOP/s |\n|---|---|---|---|")
  for kind, (us, flops) in sorted(kinds.items(), key=lambda kv: -kv[1][0]):
    rate = f"{flops / us / 1e3:.0f}" if flops else ""
    print(f"| {kind} | {us / 1e3:.0f} | {100 * us / total:.0f}% | {rate} |")
  print(
      "\n| ms | calls | GFLOP/s | kind | op | shape |\n|---|---|---|---|---|---|"
  )
  rows = sorted(ops.items(), key=lambda kv: -kv[1]["us"])[:top]
  for (kind, op_name, shape), row in rows:
    rate = f"{row['flops'] / row['us'] / 1e3:.0f}" if row["flops"] else ""
    print(f"| {row['us'] / 1e3:.1f} | {row['calls']} | {rate} | {kind} "
          f"| {op_name} | {shape} |")


def main(argv):
  del argv
  f = flags.FLAGS
  config = train_step.config_for(f.model, f.batch, f.dtype, f.image_size)
  profile(*train_step.prepared_step(config), f.top)


if __name__ == "__main__":
  from vit_jax import runtime
  runtime.apply()
  app.run(main)
