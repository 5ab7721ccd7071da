"""Inputs whose results have a closed form, and counting the elements a backend got wrong.

Every input element is a small integer that depends on the rank and on its position, so a
result taken from the wrong rank or the wrong offset is detected, and every sum, product,
minimum or maximum over ranks is exact in every dtype the bench offers (bfloat16 included,
up to 19 ranks for sums and 15 for products in float16).
"""

import torch
import torch.distributed as dist

# Relative tolerance per dtype: only AVG can round (its division), by an ulp or so.
_RTOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5, torch.float64: 1e-12}


def pattern(rank: int, start: int, length: int, redop, device) -> torch.Tensor:
    """Rank `rank`'s input values at positions start..start+length, in float64."""
    position = torch.arange(start, start + length, dtype=torch.float64, device=device)
    if redop == dist.ReduceOp.PRODUCT:
        # 1s and 2s: a product over n ranks is at most 2**n, still exact.
        return torch.remainder(position + rank, 2) + 1
    # 1..13; 5 and 13 are coprime, so ranks fewer than 13 apart differ at every position.
    return torch.remainder(3 * position + 5 * rank, 13) + 1


def reduced(world_size: int, start: int, length: int, redop, device) -> torch.Tensor:
    """The reduction over every rank's pattern at positions start..start+length, in float64."""
    total = pattern(0, start, length, redop, device)
    for rank in range(1, world_size):
        values = pattern(rank, start, length, redop, device)
        if redop == dist.ReduceOp.PRODUCT:
            total.mul_(values)
        elif redop == dist.ReduceOp.MIN:
            torch.minimum(total, values, out=total)
        elif redop == dist.ReduceOp.MAX:
            torch.maximum(total, values, out=total)
        else:  # SUM and AVG
            total.add_(values)
    if redop == dist.ReduceOp.AVG:
        total.div_(world_size)
    return total


def count_wrong(result: torch.Tensor, expected: torch.Tensor) -> int:
    """Elements of `result` that differ from `expected` (float64, exact values) once
    `expected` is rounded to the result's dtype."""
    want = expected.to(result.dtype).to(torch.float64)
    got = result.to(torch.float64)
    if result.dtype.is_floating_point:
        same = torch.isclose(got, want, rtol=_RTOL[result.dtype], atol=0.0)
    else:
        same = got == want
    return int((~same).sum().item())
