"""Independent references and comparisons for the Python package's tests.

`ieee_adamw_` is torch.optim.AdamW's default CPU step (torch 2.15,
_single_tensor_adam), op for op with torch's own ops, except that sqrt(v) is
correctly rounded (computed in float64, rounded once): what the daemon's
kernel computes (docs/exactness.md). torch's own sqrt comes from MKL on x86
and rounds about 17% of elements 1 ulp differently, which moves p (never m
or v) by at most an ulp or so of p per step.
"""
import torch


def correctly_rounded_sqrt(v):
    """sqrt of float32 v, rounded once (float64's sqrt is exact enough to round correctly)."""
    return v.double().sqrt().float()


def ieee_adamw_(p, g, m, v, step, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                sqrt=correctly_rounded_sqrt):
    """One AdamW step in place on float32 tensors p, m, v for gradient g at `step` (1, 2, ...).
    `sqrt=torch.sqrt` makes it torch.optim.AdamW's step itself, sqrt included."""
    beta1, beta2 = betas
    p.mul_(1 - lr * weight_decay)
    m.lerp_(g, 1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    bias_correction1 = 1 - beta1 ** step
    bias_correction2 = 1 - beta2 ** step
    step_size = lr / bias_correction1
    denom = (sqrt(v) / bias_correction2 ** 0.5).add_(eps)
    p.addcdiv_(m, denom, value=-step_size)


def _ordered(x):
    """float32 bits as integers ordered like the floats (-0 and +0 equal)."""
    i = x.detach().float().contiguous().view(torch.int32).to(torch.int64)
    return torch.where(i < 0, -(i & 0x7FFFFFFF), i)


def ulp_distance(a, b):
    """Per element, how many float32 values lie between a and b."""
    return (_ordered(a) - _ordered(b)).abs()


def bits_equal(a, b):
    """Whether two tensors hold the same bits (same dtype and shape)."""
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    return bool(torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))


def compare(label, actual, expected, max_ulp=0):
    """Asserts float32 `actual` within `max_ulp` of `expected` everywhere; prints and returns
    the fraction of bit-equal elements."""
    assert actual.shape == expected.shape, (label, actual.shape, expected.shape)
    d = ulp_distance(actual, expected)
    fraction = (d == 0).double().mean().item()
    print(f"{label}: {fraction:.4%} of {d.numel()} elements bit-equal, max {int(d.max())} ulp")
    assert int(d.max()) <= max_ulp, (
        f"{label}: {int((d > max_ulp).sum())} elements differ by more than {max_ulp} ulp "
        f"(max {int(d.max())})")
    return fraction


def torch_sqrt_differs(v):
    """Where torch's own sqrt of float32 v is not the correctly rounded one."""
    return v.sqrt() != v.double().sqrt().float()


def compare_to_torch_step(label, actual, expected, before, v, quiet=False):
    """One step from the same state: `actual` (the daemon's params) against `expected`
    (torch.optim.AdamW's), `before` the params both started from, `v` the (equal)
    exp_avg_sq after the step. Asserts bit equality wherever torch's sqrt(v) is correctly
    rounded; where it is not, the update's denominator differs by 1 ulp, which moves the
    update by 2**-23 of itself, and with the rounding of the quotient and of p the two may
    differ by 1 ulp of p plus 2**-22 of the update (more than 1 ulp only where p is not
    much larger than its update). `quiet`: no printing. Prints and
    returns the fraction of bit-equal elements."""
    differs = torch_sqrt_differs(v)
    unequal = ulp_distance(actual, expected) != 0
    assert not bool((unequal & ~differs).any()), (
        f"{label}: {int((unequal & ~differs).sum())} elements differ where torch's sqrt is "
        "correctly rounded")
    update = (expected.double() - before.double()).abs()
    gap = (actual.double() - expected.double()).abs()
    magnitude = expected.abs()
    ulp = (torch.nextafter(magnitude, torch.tensor(float("inf"))) - magnitude).double()
    within = gap <= ulp + update * 2.0 ** -22
    assert bool(within.all()), (
        f"{label}: {int((~within).sum())} elements differ by more than the sqrt's rounding "
        f"allows (largest gap {float(gap.max()):.3g})")
    fraction = 1.0 - unequal.double().mean().item()
    if not quiet:
        print(f"{label}: {fraction:.4%} of {actual.numel()} elements bit-equal to "
              f"torch.optim.AdamW (torch's sqrt not correctly rounded at {int(differs.sum())})")
    return fraction
