"""The all-gather and adaptive compressors' mathematics, on the codecs the DDP hooks run (executor/methods/),
with simulated ranks in one process (tests/compression_sim.py; the gloo runs are in
test_compression_executor.py):
- quantizers are unbiased (seeded Monte-Carlo mean within 5 standard errors per coordinate)
  and their variance is the analytic sum (l_{j+1} - r)(r - l_j) ||v||^2 and within the paper's
  bound; ALQ/AMQ's fitted levels beat fixed uniform/exponential levels on a skewed gradient;
- error feedback conserves mass exactly; Accordion's rule on hand-made norm sequences;
- convergence on a learnable low-rank least-squares problem against DDP, and the broken variant
  (top-k at 0.1% without error feedback) outside the same tolerance.
"""

from __future__ import annotations

import math

import pytest
import torch
from compression_sim import exchange, run_ranks

from meshplan import compression_wire, dp_methods
from meshplan.executor.methods import levels
from meshplan.executor.methods.accordion import AccordionPowerSGD, AccordionTopK, Regimes, critical
from meshplan.executor.methods.alq import ALQ
from meshplan.executor.methods.amq import AMQ
from meshplan.executor.methods.nuqsgd import NUQSGD
from meshplan.executor.methods.qsgd import QSGD
from meshplan.executor.methods.quantize import normalise
from meshplan.executor.methods.topk import TopK

QUANTIZERS = {"qsgd": QSGD, "nuqsgd": NUQSGD, "alq": ALQ, "amq": AMQ}


def params(name: str, **given) -> dict:
    return dp_methods.method("compression", name).resolve(given, name)


def roundtrip(codec, v: torch.Tensor, key: int = 0) -> torch.Tensor:
    """One rank's decoded Q(v) (its own payload, no averaging)."""
    return codec.decode(key, codec.encode(key, v), v.numel())[0]


def analytic_variance(v: torch.Tensor, lv: torch.Tensor, d: int) -> float:
    """E||Q(v) - v||^2 = sum_i (l_{j+1} - r_i)(r_i - l_j) ||v_bucket||^2."""
    r, norms = normalise(v, d)
    per = torch.stack([torch.tensor(levels.variance(lv, row, torch.ones_like(row))) for row in r])
    return float((per * norms.double() ** 2).sum())


# --- quantizers -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_quantizers_are_unbiased_and_their_variance_is_the_analytic_one(name):
    d, draws = 256, 3000
    v = torch.randn(d, generator=torch.Generator().manual_seed(1))
    codec = QUANTIZERS[name](params(name, bucket_size=d), 1, 0)
    # one tensor of `draws` copies of v, one bucket each: `draws` independent quantizations of v
    samples = roundtrip(codec, v.repeat(draws)).view(draws, d)  # (draws, d)
    lv = codec.levels_for(0)
    r, norm = normalise(v, d)
    j = (torch.searchsorted(lv, r[0], right=True) - 1).clamp(0, lv.numel() - 2)
    var_i = ((lv[j + 1] - r[0]) * (r[0] - lv[j])).clamp(min=0) * norm[0] ** 2  # (d,)
    stderr = (var_i / draws).sqrt() + 1e-7
    assert float(((samples.mean(0) - v).abs() / stderr).max()) < 5.0  # 5 sigma per coordinate
    empirical = float(((samples - v) ** 2).sum(1).mean())
    assert empirical == pytest.approx(analytic_variance(v, lv, d), rel=0.05)


def test_qsgd_variance_is_within_its_lemma_bound():
    # Alistarh et al. 2017 Lemma 3.1: E||Q_s(v) - v||^2 <= min(d / s^2, sqrt(d) / s) ||v||^2
    d = 512
    v = torch.randn(4 * d, generator=torch.Generator().manual_seed(2))
    for bits in (2, 3, 4, 8):
        s = compression_wire.magnitude_levels(bits) - 1
        bound = min(d / s**2, math.sqrt(d) / s) * float((v.view(-1, d) ** 2).sum())
        assert analytic_variance(v, levels.uniform(s + 1), d) <= bound


def test_nuqsgd_levels_are_the_papers_exponential_grid():
    """NUQSGD (Ramezani-Kebrya et al. 2021) quantizes onto {0, 2^-s, ..., 1/2, 1}: the codec's
    own level set, written out here (not from levels.py), doubling from 2^-s up to 1."""
    for bits in (2, 3, 4, 6):
        count = 2 ** (bits - 1)  # one sign bit; 0 and 1 included
        want = torch.tensor([0.0] + [2.0**-j for j in range(count - 2, -1, -1)])
        got = NUQSGD(params("nuqsgd", bits=bits, bucket_size=64), 1, 0).levels_for(0)
        assert torch.equal(got, want), (bits, got)
        assert torch.equal(got[2:] / got[1:-1], torch.full((count - 2,), 2.0))


def nuqsgd_bound(d: int, s: int) -> float:
    """NUQSGD's variance bound in units of ||v||^2 (the form of Ramezani-Kebrya et al. 2021
    Thm 2, recomputed): on [a, 2a] (2a - r)(r - a) <= r^2 / 8; on [0, 2^-s]
    (2^-s - r) r <= min(2^-s r, 4^-s / 4); with sum r_i <= sqrt(d) and sum r_i^2 = 1 per bucket,
    E||Q(v) - v||^2 <= (1/8 + min(2^-s sqrt(d), d 4^-s / 4)) ||v||^2."""
    return 1 / 8 + min(2.0**-s * math.sqrt(d), d * 4.0**-s / 4)


def test_nuqsgd_variance_is_within_its_own_bound():
    """The codec's measured variance (Monte-Carlo over its own stochastic rounding) against
    NUQSGD's bound, far below QSGD's min(d / s^2, sqrt(d) / s) at the same bits: uniform levels
    in the NUQSGD codec (variance ~ sqrt(d) / s on Gaussian data) fail this, QSGD's bound not."""
    d, draws = 512, 400
    v = torch.randn(4 * d, generator=torch.Generator().manual_seed(3))
    for bits in (3, 4, 6):
        s = compression_wire.magnitude_levels(bits) - 2  # nonzero levels below 1
        codec = NUQSGD(params("nuqsgd", bits=bits, bucket_size=d), 1, 0)
        samples = roundtrip(codec, v.repeat(draws)).view(draws, -1)
        empirical = float(((samples - v) ** 2).sum(1).mean())
        assert empirical <= nuqsgd_bound(d, s) * float((v**2).sum()), (bits, empirical)


def test_adapted_levels_beat_fixed_levels_on_a_skewed_gradient():
    # heavy-tailed magnitudes (log-normal, sigma 2): most normalised coordinates near 0, a few large
    gen = torch.Generator().manual_seed(4)
    d, bits = 512, 3
    v = torch.exp(2 * torch.randn(8 * d, generator=gen)) * torch.sign(torch.randn(8 * d, generator=gen))
    fitted = {}
    for name in ("alq", "amq"):
        codec = QUANTIZERS[name](params(name, bits=bits, bucket_size=d), 1, 0)
        codec.refit(0, codec.decode(0, codec.encode(0, v), v.numel())[1])
        fitted[name] = codec.levels_for(0)
    count = compression_wire.magnitude_levels(bits)
    fixed = min(analytic_variance(v, levels.uniform(count), d), analytic_variance(v, levels.exponential(count), d))
    assert analytic_variance(v, fitted["alq"], d) < 0.9 * fixed
    assert analytic_variance(v, fitted["amq"], d) < fixed


def test_quantize_false_and_density_one_send_the_exact_average():
    grads = [[torch.randn(6, 10), torch.randn(7)] for _ in range(3)]
    mean = [sum(g[i] for g in grads) / 3 for i in range(2)]
    for codec_cls, p in ((QSGD, params("qsgd", quantize=False)), (TopK, params("topk", density=1.0))):
        out = exchange([codec_cls(p, 3, r) for r in range(3)], grads)
        for rank in out:
            for got, want in zip(rank, mean):
                assert torch.allclose(got, want, rtol=0, atol=1e-6)


def test_every_rank_decodes_the_same_average():
    grads = [[torch.randn(40, 9)] for _ in range(4)]
    for name, cls in [*QUANTIZERS.items(), ("topk", TopK)]:
        out = exchange([cls(params(name), 4, r) for r in range(4)], grads)
        assert all(torch.equal(o[0], out[0][0]) for o in out), name


# --- error feedback, DGC --------------------------------------------------------------------


def test_error_feedback_conserves_mass_exactly():
    codec = TopK(params("topk", density=0.05), 1, 0)
    gen = torch.Generator().manual_seed(5)
    sent_total, grad_total, residual = torch.zeros(300), torch.zeros(300), torch.zeros(300)
    for _ in range(20):
        g = torch.randint(-8, 9, (300,), generator=gen).float()  # integers: every sum below is exact
        acc = g + residual
        item = [(0, g.clone(), (300,))]
        run_ranks(1, lambda rank, comm, item=item: codec.exchange(comm, item))
        sent, residual = item[0][1], codec.feedback.residual[0]
        assert torch.equal(sent + residual, acc)  # this step: sent + kept = g + e
        assert int((sent != 0).sum()) <= compression_wire.topk_k(300, 0.05)
        sent_total += sent
        grad_total += g
    assert torch.equal(sent_total + residual, grad_total)  # the run: nothing lost, nothing made


def test_dgc_warmup_density_and_masking():
    assert compression_wire.dgc_density(0, 0.001, 4) == 0.25
    assert compression_wire.dgc_density(2, 0.001, 4) == pytest.approx(0.25 * (0.001 / 0.25) ** 0.5)
    assert compression_wire.dgc_density(4, 0.001, 4) == 0.001
    codec = TopK(params("topk", density=0.1, momentum_correction=True), 1, 0)
    item = [(0, torch.arange(1.0, 21.0), (20,))]
    run_ranks(1, lambda rank, comm: codec.exchange(comm, item))
    sent = item[0][1] != 0
    assert torch.equal(codec.velocity[0][sent], torch.zeros(int(sent.sum())))  # momentum factor masking
    assert torch.equal(codec.velocity[0][~sent], torch.arange(1.0, 21.0)[~sent])


def _executor_optimizer(compression_params: dict, optimizer: str = "sgd"):
    """The optimizer the executor builds for a one-rank top-k plan over a 20-element parameter."""
    from types import SimpleNamespace

    from executor_plans import make_plan

    from meshplan.executor.data_parallel import build_optimizer

    plan = make_plan(compression="topk", compression_params=compression_params, validate=False)
    w = torch.nn.Parameter(torch.zeros(20))
    part = torch.nn.Module()
    part.w = w
    return w, build_optimizer(part, SimpleNamespace(dp_degree=1), plan, optimizer, 0.1, 0.0)


def test_dgc_momentum_correction_is_applied_by_momentum_free_sgd():
    """DGC's update is w -= lr * sparse(v): the executor's SGD keeps no momentum of its own (its
    state holds no momentum buffer) and each step moves w by exactly lr x what was sent, while
    the codec's velocity carries the momentum; without momentum correction SGD keeps 0.9."""
    dgc = dict(density=0.1, momentum_correction=True, momentum=0.9)
    w, opt = _executor_optimizer(dgc)
    assert opt.param_groups[0]["momentum"] == 0.0
    codec = TopK(params("topk", **dgc), 1, 0)
    for _ in range(3):
        before = w.detach().clone()
        item = [(0, torch.arange(1.0, 21.0), (20,))]
        run_ranks(1, lambda rank, comm, item=item: codec.exchange(comm, item))
        w.grad = item[0][1].clone()
        opt.step()
        assert opt.state[w].get("momentum_buffer") is None
        assert torch.equal(w.detach(), before - 0.1 * item[0][1])
    assert float(codec.velocity[0].abs().sum()) > 0  # the momentum lives in the codec
    _, plain = _executor_optimizer(dict(density=0.1))
    assert plain.param_groups[0]["momentum"] == 0.9


def test_dgc_momentum_correction_refuses_adamw_with_one_line():
    from meshplan.errors import MeshplanError

    with pytest.raises(MeshplanError, match="--optimizer sgd") as err:
        _executor_optimizer(dict(density=0.1, momentum_correction=True), "adamw")
    assert "\n" not in str(err.value)


def test_meshplan_run_refuses_dgc_under_adamw_before_launching(tmp_path, capsys):
    from executor_plans import make_plan

    from meshplan import schema
    from meshplan.cli import main

    path = tmp_path / "plan.json"
    plan = make_plan(dp=2, compression="topk", compression_params=dict(momentum_correction=True))
    path.write_text(schema.dumps(plan))
    capsys.readouterr()
    assert main(["run", str(path), "--print-launch"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "--optimizer sgd" in err[0], err
    assert main(["run", str(path), "--print-launch", "--optimizer", "sgd"]) == 0
    assert "--optimizer sgd" in capsys.readouterr().out


# --- Accordion ------------------------------------------------------------------------------


def test_accordion_rule_on_norm_sequences():
    assert critical(None, 3.0, 0.5)  # no previous window: start at low compression
    assert not critical(2.0, 2.0, 0.5)  # constant norm: high compression
    assert not critical(2.0, 1.2, 0.5)  # 40% change < eta
    assert critical(2.0, 3.2, 0.5)  # 60% jump >= eta
    assert critical(2.0, 1.0, 0.5)  # 50% drop == eta
    assert critical(2.0, 2.0, 0.5, lr_decayed=True)  # a learning-rate decay forces low compression


def test_accordion_regimes_switch_at_window_ends():
    reg = Regimes(window=2, eta=0.5)
    seen = []
    for step, scale in enumerate([1, 1, 1, 1, 3, 3, 3, 3, 3, 3]):
        seen.append(reg.is_critical(0))
        reg.observe(0, step, torch.full((4,), float(scale)))
    # windows: norms 4, 4 (change 0 -> high), 12 (change 2 -> critical), 12 (0 -> high), 12
    assert seen == [True, True, True, True, False, False, True, True, False, False]
    assert reg.steps == {True: 6, False: 4}


def test_a_learning_rate_decay_holds_the_critical_setting_for_a_window():
    """Agarwal et al. 2021: low compression after each decay. Constant norms settle in the high-
    compression setting; a decay at step 6 makes the next `window` (3) steps critical, a rise
    of the learning rate does nothing; then the norm rule decides again."""
    p = params("accordion", window=3, rank=1, critical_rank=2)
    codec = AccordionPowerSGD(p, 1, 0)
    grads = [torch.ones(16, 8)]
    seen = []
    for step in range(15):
        if step == 6:
            codec.lr_changed(0.1, 0.01)
        if step == 12:
            codec.lr_changed(0.01, 0.1)
        seen.append(codec.regimes.is_critical(0))
        exchange([codec], [grads])
    assert seen == [True] * 3 + [True] * 3 + [True] * 3 + [False] * 6
    # without the decay: critical for the first window only (no previous norm), then high
    plain, seen = AccordionPowerSGD(p, 1, 0), []
    for _ in range(9):
        seen.append(plain.regimes.is_critical(0))
        exchange([plain], [grads])
    assert seen == [True] * 6 + [False] * 3


def test_accordion_start_iter_sends_the_exact_average_dense_first():
    p = params("accordion", start_iter=2, window=10**6)
    codecs = [AccordionPowerSGD(p, 2, r) for r in range(2)]
    gen = torch.Generator().manual_seed(3)
    for step in range(3):
        grads = [[torch.randn(32, 24, generator=gen)] for _ in range(2)]
        out = exchange(codecs, grads)
        exact = (grads[0][0] + grads[1][0]) / 2
        assert torch.equal(out[0][0], exact) == (step < 2), step  # dense, then rank-2 PowerSGD
    assert codecs[0].notes() == [
        "accordion: 100.0% of tensor-steps at rank 2 (critical), 0.0% at rank 1; 2 tensor-steps dense before start_iter"
    ]


def test_accordion_decisions_agree_across_ranks_with_different_local_gradients():
    p = params("accordion_topk", window=1, density=0.1, critical_density=0.5)
    codecs = [AccordionTopK(p, 4, r) for r in range(4)]
    gen = torch.Generator().manual_seed(6)
    for step in range(4):
        grads = [[torch.randn(50, generator=gen) * (10 ** (step % 2)) * (r + 1)] for r in range(4)]
        exchange(codecs, grads)
        assert len({c.regimes.is_critical(0) for c in codecs}) == 1
    assert codecs[0].notes()[0].startswith("accordion: ")


def test_accordion_low_equals_high_is_static_powersgd():
    grads = [[torch.randn(32, 24, generator=torch.Generator().manual_seed(r))] for r in range(2)]
    both = [AccordionPowerSGD(params("accordion", rank=2, critical_rank=2, window=1), 2, r) for r in range(2)]
    static = [AccordionPowerSGD(params("accordion", rank=2, critical_rank=2, window=10**6), 2, r) for r in range(2)]
    for _ in range(3):
        a, b = exchange(both, grads), exchange(static, grads)
        assert torch.equal(a[0][0], b[0][0])


# --- convergence ----------------------------------------------------------------------------

WORLD, DIM, STEPS, LR, BATCH = 4, 64, 300, 0.03, 16
TOLERANCE = 1e-3
"""|loss - DDP's loss| after STEPS steps, as a fraction of the initial loss (~2)."""
CODECS = {"topk": TopK, "accordion": AccordionPowerSGD, "accordion_topk": AccordionTopK, **QUANTIZERS}


def least_squares(name: str | None, **given) -> tuple[float, float]:
    """(initial, final) test loss of y = W x + b fitted to a rank-2 teacher on WORLD ranks
    (plain SGD, each rank its own batches; name None = the exact average, DDP)."""
    gen = torch.Generator().manual_seed(0)
    teacher = torch.randn(DIM, 2, generator=gen) @ torch.randn(2, DIM, generator=gen) / DIM**0.5
    xs = torch.randn(WORLD, STEPS, BATCH, DIM, generator=gen)
    noise = 0.01 * torch.randn(WORLD, STEPS, BATCH, DIM, generator=gen)
    x_test = torch.randn(512, DIM, generator=gen)

    def test_loss(w, b) -> float:
        return float(((x_test @ w.T + b - x_test @ teacher.T) ** 2).mean())

    def rank_fn(rank, comm):
        w, b = torch.zeros(DIM, DIM), torch.zeros(DIM)
        codec = CODECS[name](params(name, **given), WORLD, rank) if name else None
        for t in range(STEPS):
            x = xs[rank, t]
            err = x @ w.T + b - (x @ teacher.T + noise[rank, t])  # (B, DIM)
            items = [(0, (2 * err.T @ x / BATCH).reshape(-1), (DIM, DIM)), (1, 2 * err.mean(0), (DIM,))]
            if codec is None:
                for item in items:
                    comm.all_reduce(item[1]).div_(WORLD)
            else:
                codec.exchange(comm, items)
            w -= LR * items[0][1].view(DIM, DIM)
            b -= LR * items[1][1]
        return test_loss(w, b)

    return test_loss(torch.zeros(DIM, DIM), torch.zeros(DIM)), run_ranks(WORLD, rank_fn)[0]


SETTINGS = {
    "topk": dict(density=0.1),
    "dgc": dict(density=0.1, momentum_correction=True, momentum=0.5, clip_norm=10.0, warmup_steps=20),
    "qsgd": {},
    "nuqsgd": {},
    "alq": dict(refit_every=50),
    "amq": dict(refit_every=50),
    "accordion": dict(window=20),
    "accordion_topk": dict(window=20),
}


@pytest.fixture(scope="module")
def ddp_loss():
    return least_squares(None)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(SETTINGS))
def test_each_method_converges_within_tolerance_of_ddp(ddp_loss, case):
    start, ddp = ddp_loss
    _, got = least_squares("topk" if case == "dgc" else case, **SETTINGS[case])
    assert abs(got - ddp) <= TOLERANCE * start, (case, got, ddp)


@pytest.mark.slow
def test_topk_at_a_tenth_of_a_percent_without_error_feedback_falls_outside(ddp_loss):
    start, ddp = ddp_loss
    _, got = least_squares("topk", density=0.001, error_feedback=False)
    assert abs(got - ddp) > 10 * TOLERANCE * start


@pytest.mark.parametrize("name", ["powersgd", "accordion"])
def test_low_rank_exchange_pays_a_second_round_latency(name, monkeypatch):
    """Q = M^T P needs the all-reduced P: PowerSGD and Accordion exchange in two all-reduces one
    after the other, so their sync is one all-reduce latency (the link fit's alpha) above the
    same bytes in one round; the quantizers' and top-k's single all-gather pays none."""
    import dataclasses

    from meshplan.planner import PlanRequest, estimate
    from meshplan.planner.cost.comm import collective_latency_s
    from meshplan.planner.methods import compression, compression_quant
    from meshplan.presets import local_cpu
    from meshplan.profiler import profile_model

    profile, cluster = profile_model("gpt-tiny", {}, device="meta"), local_cpu(4)
    req = PlanRequest(num_gpus=4, global_batch=16, precision="fp32", dp=4, tp=1, pp=1, microbatch=4, zero=0)
    req = dataclasses.replace(req, methods={"compression": (name, dp_methods.defaults_of("compression", name))})
    two = estimate(profile, cluster, req).prediction.breakdown["dp_comm"]
    cls = compression.PowerSGD if name == "powersgd" else compression_quant.Accordion
    monkeypatch.setattr(cls, "rounds", 1)
    one = estimate(profile, cluster, req).prediction.breakdown["dp_comm"]
    assert two - one == pytest.approx(collective_latency_s(cluster, "all_reduce", 4, "intra_node"), rel=1e-6)
    assert compression_quant.QSGD.rounds == compression_quant.TopK.rounds == 1
