"""Float8 matmuls for the encoder blocks' dense layers (`model.fp8`).

Each operand of a dense layer's matmul is rounded to float8 e4m3 and the
gradient of its product to float8 e5m2, every tensor by its own scale: its
absolute maximum, taken at this step, mapped to the largest finite float8
value ("current scaling": no amax history to keep, checkpoint or shard).
The forward and both backward matmuls multiply the float8 tensors
themselves and scale the product; the backward reuses the forward's float8
operands. The params, the
optimizer and every other op keep their dtypes.

On GPUs with float8 tensor cores (Hopper and later) XLA runs a matmul of
float8 operands as a cuBLASLt float8 GEMM; elsewhere (CPUs, TPUs before
v7) it computes the same numbers in a wider type, no faster.
"""

import functools
import math

import jax
import jax.numpy as jnp

FORWARD = jnp.float8_e4m3fn  # 3 mantissa bits, up to 448.
BACKWARD = jnp.float8_e5m2   # 2 mantissa bits, up to 57344: gradients' range.


def quantize(x, fp8_dtype):
  """(x / scale rounded to fp8_dtype, scale): the scale maps x's absolute
  maximum to fp8_dtype's largest value (1 for an all-zero x)."""
  largest = float(jnp.finfo(fp8_dtype).max)
  amax = jnp.max(jnp.abs(x)).astype(jnp.float32)
  scale = jnp.where(amax > 0, amax / largest, 1.0)
  scaled = jnp.clip(x.astype(jnp.float32) / scale, -largest, largest)
  return scaled.astype(fp8_dtype), scale


def _scaled_product(a, b, a_scale, b_scale, contracting, dtype, precision):
  """The [rows, columns] product of float8 matrices `a` and `b` contracted
  over `contracting` ((a's axis,), (b's axis,)), in `dtype`, scaled back.
  `precision` HIGHEST asks cuBLASLt not to accumulate fast (in its
  narrower accumulator) on Hopper."""
  out = jax.lax.dot_general(a, b, (contracting, ((), ())),
                            precision=precision,
                            preferred_element_type=dtype)
  return out * (a_scale * b_scale).astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _matmul(x, w, dtype):
  """x [M, K] @ w [K, N] with float8 operands, in `dtype`."""
  return _matmul_forward(x, w, dtype)[0]


def _matmul_forward(x, w, dtype):
  x8, x_scale = quantize(x, FORWARD)
  w8, w_scale = quantize(w, FORWARD)
  out = _scaled_product(x8, w8, x_scale, w_scale, ((1,), (0,)), dtype,
                        jax.lax.Precision.DEFAULT)
  return out, (x8, x_scale, w8, w_scale)


def _matmul_backward(dtype, residuals, gradient):
  x8, x_scale, w8, w_scale = residuals
  g8, g_scale = quantize(gradient, BACKWARD)
  # The weights' gradient sums over every token of the batch (50,000 at
  # B/16's batch 256), too many for fast float8 accumulation (a short run
  # with it fell 16 points behind bfloat16: docs/speed_on_gpu.md).
  highest = jax.lax.Precision.HIGHEST
  dx = _scaled_product(g8, w8, g_scale, w_scale, ((1,), (1,)), dtype, highest)
  dw = _scaled_product(x8, g8, x_scale, g_scale, ((0,), (0,)), dtype, highest)
  return dx, dw


_matmul.defvjp(_matmul_forward, _matmul_backward)


def dot_general(lhs, rhs, dimension_numbers, precision=None,
                preferred_element_type=None, **kwargs):
  """jax.lax.dot_general of a dense layer (lhs's trailing axes contracted
  with rhs's leading ones, no batch axes: what flax.linen's Dense and
  DenseGeneral ask) in float8; what `nn.Dense(dot_general=...)` takes.
  `precision` is float8's; other arguments are refused."""
  del precision
  (lhs_axes, rhs_axes), batch = dimension_numbers
  count = len(lhs_axes)
  if (kwargs or tuple(batch[0]) or tuple(batch[1])
      or tuple(lhs_axes) != tuple(range(lhs.ndim - count, lhs.ndim))
      or tuple(rhs_axes) != tuple(range(count))
      or lhs.dtype != rhs.dtype):
    raise ValueError(f"float8 dot_general takes a dense layer's product of "
                     f"one dtype, not {dimension_numbers} of {lhs.dtype} and "
                     f"{rhs.dtype} with {sorted(kwargs)}")
  rows, columns = lhs.shape[:lhs.ndim - count], rhs.shape[count:]
  depth = math.prod(rhs.shape[:count])
  out = _matmul(lhs.reshape(-1, depth),
                rhs.reshape(depth, math.prod(columns)),
                jnp.dtype(preferred_element_type or lhs.dtype))
  return out.reshape(*rows, *columns)
