"""Level sets for the quantizers (quantize.py) and the variance they give.

- qsgd: uniform {0, 1/s, ..., 1}, s = L - 1 (Alistarh et al. 2017)
- nuqsgd: exponential {0, 2^-(L-2), ..., 1/2, 1} (Ramezani-Kebrya et al. 2021)
- amq: {0, p^(L-2), ..., p, 1} with the multiplier p fitted (Faghri et al. 2020 Sec 3.2)
- alq: any 0 < l_1 < ... < l_{L-2} < 1, fitted by coordinate descent (Faghri et al. 2020 Sec 3.1)
The fitted objective is the expected variance of unbiased stochastic rounding,
  V(l) = sum_b w_b (l_{j+1} - c_b)(c_b - l_j),  l_j <= c_b < l_{j+1}
over the histogram of normalised magnitudes (compression_wire.HIST_BINS bins: weight w_b at the
bin's geometric centre c_b). This is the paper's objective on the empirical distribution the
ranks gathered, not on its truncated-normal fit (the paper's parametric model): no distribution
is assumed, and the statistics are 32 counts per tensor. ALQ starts from the best of uniform,
exponential, quantile and its previous levels, and each coordinate step only lowers V.
"""

from __future__ import annotations

import torch

from meshplan.compression_wire import HIST_BINS, HIST_LOG2_LOW


def uniform(count: int) -> torch.Tensor:
    return torch.linspace(0.0, 1.0, count)


def exponential(count: int, p: float = 0.5) -> torch.Tensor:
    """{0, p^(count-2), ..., p, 1}."""
    powers = torch.tensor([p**j for j in range(count - 2, -1, -1)], dtype=torch.float32)
    return torch.cat([torch.zeros(1), powers])


def hist_edges(device=None) -> torch.Tensor:
    """The HIST_BINS - 1 bin edges: 2^-15 ... 1 (log2-spaced); bucketize(right=True) -> bin."""
    return torch.exp2(torch.linspace(HIST_LOG2_LOW, 0.0, HIST_BINS - 1, device=device))


def hist_centres() -> torch.Tensor:
    e = hist_edges().double()
    inner = (e[:-1] * e[1:]).sqrt()
    return torch.cat([e[:1] / 2, inner, torch.ones(1, dtype=torch.float64)])


def variance(lv: torch.Tensor, c: torch.Tensor, w: torch.Tensor) -> float:
    """V(lv) over points c with weights w (module docstring), in units of ||v||^2."""
    lv = lv.double()
    j = (torch.searchsorted(lv, c.double(), right=True) - 1).clamp(0, lv.numel() - 2)
    return float((w.double() * (lv[j + 1] - c) * (c - lv[j])).clamp(min=0).sum())


def fit_amq(count: int, hist: torch.Tensor, previous: float = 0.5) -> tuple[float, torch.Tensor]:
    """(p, levels) minimising V over p in a grid on (0, 1) (and the previous p), refined once."""
    c = hist_centres()
    grid = [previous] + [i / 100 for i in range(2, 99, 2)]
    best = _best_multiplier(count, grid, c, hist)
    fine = [min(0.999, max(0.001, best + d / 1000)) for d in range(-20, 21)]
    best = _best_multiplier(count, fine, c, hist)
    return best, exponential(count, best)


def _best_multiplier(count: int, ps: list[float], c: torch.Tensor, hist: torch.Tensor) -> float:
    """The first p of `ps` with the lowest V (all candidates in one batched_variance call)."""
    options = torch.stack([exponential(count, p) for p in ps]).double()  # (K, L)
    return ps[int(batched_variance(options, c, hist).argmin())]


def quantile(count: int, hist: torch.Tensor) -> torch.Tensor:
    """Levels at equal-mass quantiles of the histogram (bin centres), made strictly increasing."""
    c, cdf = hist_centres(), hist.double().cumsum(0) / max(float(hist.sum()), 1.0)
    qs = torch.linspace(0, 1, count)[1:-1].double()
    inner = c[torch.searchsorted(cdf, qs).clamp(max=HIST_BINS - 1)]
    out = torch.cat([torch.zeros(1, dtype=torch.float64), inner, torch.ones(1, dtype=torch.float64)])
    for i in range(1, count):  # strictly increasing
        out[i] = max(out[i], out[i - 1] + 1e-6) if i < count - 1 else 1.0
    return out.clamp(max=1.0).float() if bool((out[1:] > out[:-1]).all()) else uniform(count)


def fit_alq(
    count: int, hist: torch.Tensor, previous: torch.Tensor | None = None, sweeps: int = 8, grid: int = 32
) -> torch.Tensor:
    """Coordinate descent on the interior levels (Faghri et al. 2020 Alg. 2): each l_j moved to
    the grid point of (l_{j-1}, l_{j+1}) with the lowest V; never worse than where it started."""
    c = hist_centres()
    starts = [uniform(count), exponential(count), quantile(count, hist)] + ([previous] if previous is not None else [])
    lv = min(starts, key=lambda s: variance(s, c, hist)).double().clone()
    best = variance(lv, c, hist)
    for _ in range(sweeps):
        before = best
        for j in range(1, count - 1):
            trial = torch.linspace(float(lv[j - 1]), float(lv[j + 1]), grid + 2, dtype=torch.float64)[1:-1]
            options = lv.repeat(grid, 1)  # (grid, L)
            options[:, j] = trial
            scores = batched_variance(options, c, hist)  # (grid,)
            i = int(scores.argmin())
            if float(scores[i]) < best:
                best, lv = float(scores[i]), options[i].clone()
        if best == before:  # a sweep that moved nothing: every later sweep repeats it
            break
    return lv.float()


def batched_variance(options: torch.Tensor, c: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """variance() of each row of `options` (K, L)."""
    cc = c.double().expand(options.shape[0], -1).contiguous()  # (K, C)
    j = (torch.searchsorted(options, cc, right=True) - 1).clamp(0, options.shape[1] - 2)
    lo, hi = options.gather(1, j), options.gather(1, j + 1)
    return (w.double() * (hi - cc) * (cc - lo)).clamp(min=0).sum(1)
