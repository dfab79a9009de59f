"""Where a compiled TPU step's time goes, by kind of work.

libtpu writes its cost model's estimate into each scheduled instruction of
the compiled program (`estimated_cycles` in its backend config), and JAX
names the operation it came from (`op_name`: the model's path and the
primitive, such as ".../MultiHeadDotProductAttention_1/dot_general"). The
cycles summed by kind, as shares of the whole, show what bounds a step: the
matmuls, or the memory-bound work around them. They are the compiler's
estimates of each instruction alone, each with a fixed cost that dominates
a tiny model's step (docs/plan.md); instructions that overlap count in
full, so the shares say where the work is, not how the step's time
divides exactly. Collectives carry no such estimate and are left out:
their time is in the step's estimate only (and DCN's in the plan's own
figure).
"""

import re

# In the order the plan reports them.
KINDS = (
    "matmuls",        # dot_general and convolutions, forward and backward
    "attention",      # the rest of attention: softmax, masks, dropout
    "norms",          # LayerNorm (a hybrid's GroupNorm)
    "elementwise",    # the rest of the model: GELU, residuals, dropout
    "update",         # outside the model: loss, optimizer, metrics
    "layout",         # copies and transposes the compiler adds
)

_CYCLES = re.compile(r'"estimated_cycles":"(\d+)"')
_OPCODE = re.compile(r"^\s*(?:ROOT )?%\S+ = .*?\s([a-z][a-z0-9-]*)\(")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_MATMULS = ("dot_general", "conv_general_dilated")


def kind(line):
  """The kind of work of one instruction of a compiled program's text."""
  opcode = _OPCODE.match(line)
  opcode = opcode.group(1) if opcode else ""
  op_name = _OP_NAME.search(line)
  op_name = op_name.group(1) if op_name else ""
  if opcode in ("dot", "convolution") or op_name.rsplit("/", 1)[-1] in (
      _MATMULS):
    return "matmuls"
  if "VisionTransformer" not in op_name:
    return "update" if op_name else "layout"
  if "MultiHeadDotProductAttention" in op_name or "MAPHead" in op_name:
    return "attention"
  if "LayerNorm" in op_name or "encoder_norm" in op_name or (
      "GroupNorm" in op_name):
    return "norms"
  return "elementwise"


def cycles(text):
  """{kind: estimated cycles} of a compiled program's text; every kind
  present, 0 where none."""
  total = dict.fromkeys(KINDS, 0)
  for line in text.splitlines():
    found = _CYCLES.search(line)
    if found:
      total[kind(line)] += int(found.group(1))
  return total


def shares(by_kind):
  """{kind: share of the cycles} ({} when there are none)."""
  whole = sum(by_kind.values())
  return {k: by_kind[k] / whole for k in KINDS} if whole else {}
