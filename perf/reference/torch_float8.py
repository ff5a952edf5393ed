"""Float8 linear layers on torch._scaled_mm, the PyTorch reference for meshtrain's FP8 recipe
(issue 35; torchao is not installed on the GPU machine, so this stands in for its Float8Linear
with dynamic tensorwise scaling).

The recipe, the same as meshtrain's `--train.precision fp8 --fp8.recipe tensorwise`
(kernels/linear_fp8.hpp):
  - current (dynamic) tensorwise scaling: scale = finfo(fp8).max / amax(|t|) of the tensor being
    cast, taken at the cast; values saturate at the format's largest finite value;
  - activations and weights in E4M3 (max 448), output gradients in E5M2 (max 57344);
  - the three GEMMs of a linear in FP8 with fp32 accumulation and a bf16 output:
      forward   y[N,O]  = x[N,K]  . w[O,K]^T
      dgrad     dx[N,K] = dy[N,O] . w[O,K]
      wgrad     dw[O,K] = dy^T[O,N] . x[N,K]
  - the weight is cast from its fp32 master copy (torchao casts the bf16 autocast copy; both
    round to the same E4M3 grid up to double rounding).
torch._scaled_mm wants its first operand row-major and its second column-major, both with the
contraction dimension a multiple of 16, and takes the dequantisation factors (1 / scale).

    from torch_float8 import float8_linears
    float8_linears(model, lambda name, m: "layers." in name)  # swaps nn.Linear in place
"""
import torch
import torch.nn as nn

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def cast_tensorwise(t, dtype):
    """(t cast to dtype with current tensorwise scaling, the dequantisation factor 1 / scale)."""
    fmax = torch.finfo(dtype).max
    amax = t.detach().abs().amax().float().clamp(min=1e-12)
    scale = fmax / amax
    q = (t.float() * scale).clamp(-fmax, fmax).to(dtype)
    return q, scale.reciprocal()


def col_major(t):
    """The same matrix laid out column-major (what _scaled_mm's second operand must be)."""
    return t.t().contiguous().t()


class _Float8Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, wgrad_bf16):
        xq, xs = cast_tensorwise(x, E4M3)
        wq, ws = cast_tensorwise(w, E4M3)
        ctx.wgrad_bf16 = wgrad_bf16
        ctx.save_for_backward(xq, xs, wq, ws, x if wgrad_bf16 else None)
        # wq is row-major [O, K]: its transpose is the column-major [K, O] operand.
        return torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16)

    @staticmethod
    def backward(ctx, dy):
        xq, xs, wq, ws, x = ctx.saved_tensors
        dyq, dys = cast_tensorwise(dy, E5M2)
        dx = torch._scaled_mm(dyq, col_major(wq), scale_a=dys, scale_b=ws,
                              out_dtype=torch.bfloat16)
        if ctx.wgrad_bf16:
            dw = dy.t().to(torch.bfloat16) @ x.to(torch.bfloat16)
        else:
            dw = torch._scaled_mm(dyq.t().contiguous(), col_major(xq), scale_a=dys, scale_b=xs,
                                  out_dtype=torch.bfloat16)
        return dx, dw.to(torch.float32), None


class Float8Linear(nn.Linear):
    """nn.Linear whose GEMMs run in FP8. A bias (GPT-2's linears) is added in bf16 after the
    GEMM, as meshtrain's FP8 linears add it (its gradient is dy's column sums, through autograd)."""

    wgrad_bf16 = False

    def forward(self, x):
        shape = x.shape
        y = _Float8Matmul.apply(x.reshape(-1, shape[-1]).to(torch.bfloat16), self.weight,
                                self.wgrad_bf16)
        if self.bias is not None:
            y = y + self.bias.to(torch.bfloat16)
        return y.view(*shape[:-1], y.shape[-1])


def float8_linears(model, choose, wgrad_bf16=False):
    """Turns every nn.Linear of `model` for which choose(name, module) holds into a
    Float8Linear (same parameters, in place). Returns how many."""
    n = 0
    for name, m in model.named_modules():
        if type(m) is nn.Linear and choose(name, m):
            m.__class__ = Float8Linear
            m.wgrad_bf16 = wgrad_bf16
            n += 1
    return n


def self_check(device="cuda"):
    """The FP8 matmul against an fp32 matmul of the dequantised operands (forward and both
    gradients), and its relative error against bf16. Prints one line; raises on a mismatch."""
    torch.manual_seed(0)
    x = torch.randn(256, 512, device=device, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(384, 512, device=device, dtype=torch.float32, requires_grad=True)
    y = _Float8Matmul.apply(x, w, False)
    dy = torch.randn_like(y)
    y.backward(dy)
    xq, xs = cast_tensorwise(x, E4M3)
    wq, ws = cast_tensorwise(w, E4M3)
    dq, ds = cast_tensorwise(dy, E5M2)
    xd, wd, dd = xq.float() * xs, wq.float() * ws, dq.float() * ds
    want = (xd @ wd.t(), dd @ wd, dd.t() @ xd)
    got = (y.float(), x.grad.float(), w.grad.float())
    for what, g, r in zip(("forward", "dgrad", "wgrad"), got, want):
        err = ((g - r).norm() / r.norm()).item()
        if err > 1e-2:  # bf16 output rounding only
            raise AssertionError(f"float8 {what}: relative error {err:.3g} against the "
                                 f"dequantised fp32 GEMM")
    exact = x.float() @ w.t()
    print(f"float8 self-check: forward/dgrad/wgrad equal the dequantised fp32 GEMMs; forward "
          f"error against fp32 {((y.float() - exact).norm() / exact.norm()).item():.3g}",
          flush=True)


if __name__ == "__main__":
    self_check()
