"""The compiled goodput kernels (``specpolicy.core.compiled_policy``) against the numpy code they
replaced (``GoodputPolicy._refresh``'s tables, ``_plan``'s last step and ``AcceptanceCalibration``'s
counting and estimates, restated here as they were),
bit for bit, on random and tie-heavy inputs; and FailFast's host-side threshold against the tensor
comparison it replaced."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specpolicy.core.calibration import CONFIDENCE_EDGES, AcceptanceCalibration
from specpolicy.core.compiled_policy import goodput_best, goodput_table_size, goodput_table_views, goodput_tables
from specpolicy.policies.failfast import FailFastPolicy


def numpy_tables(
    unseen, first_tokens, first_passes, later_tokens, later_passes, token_ms, draft_ms, pass_ms, step, first_pass, lam
):
    """``GoodputPolicy._refresh``'s numpy tables before the kernel (the same expressions)."""
    H = unseen.size
    positions = np.arange(1, H + 1)
    suffixes = np.arange(H)[:, None] + np.arange(H)
    gain = np.cumsum(np.cumprod(np.append(unseen, np.ones(H))[suffixes], axis=1), axis=1)
    beyond = np.arange(H + 1)
    chunks = np.ceil(beyond / max(later_tokens, 1.0))
    first_chunks = np.ceil(np.maximum(beyond - max(first_tokens, 1.0), 0.0) / max(later_tokens, 1.0))
    passes_later = later_passes * chunks[np.maximum(beyond[None, 1:] - beyond[:, None], 0)]
    passes_first = np.where(beyond[1:] > 0, first_passes, 0.0) + later_passes * first_chunks[1:]
    verify = positions * token_ms
    cost_later = lam * (verify[None, :] + passes_later * pass_ms)
    cost_first = lam * (verify + step + passes_first * pass_ms + first_pass)
    drafting = positions * draft_ms
    probe_later = lam * (drafting[None, :] + passes_later * pass_ms)
    probe_first = lam * (drafting + passes_first * pass_ms + first_pass)
    return gain, cost_later, cost_first, probe_later, probe_first


def numpy_best(gain, cost, survival, m):
    """``_plan``'s last step before the kernel: ``(argmax, value > 0)`` of the first ``m`` values."""
    value = (gain * survival - cost)[:m]
    best = int(value.argmax())
    return best, bool(value[best] > 0.0)


def _cases(rng):
    for H in (1, 2, 7, 60):
        for _ in range(20):
            unseen = rng.uniform(0.0, 1.0, H)
            if rng.random() < 0.5:  # tie-heavy: a few distinct values, exact 0 and 1
                unseen = rng.choice(np.array([0.0, 0.25, 0.5, 1.0]), H)
            scalars = [
                float(rng.choice([rng.uniform(0.2, 8.0), 1.0, 0.5, 16.0])),  # first chunk's tokens
                float(rng.choice([rng.uniform(0.5, 3.0), 1.0])),  # its passes
                float(rng.choice([rng.uniform(0.2, 8.0), 1.0, 15.0])),
                float(rng.choice([rng.uniform(0.5, 3.0), 1.0])),
                float(rng.choice([rng.uniform(0.0, 2.0), 0.0])),  # token_ms
                float(rng.choice([rng.uniform(0.0, 1.0), 0.0])),  # draft ms per token
                float(rng.uniform(0.01, 10.0)),  # pass ms
                float(rng.choice([rng.uniform(0.0, 3.0), 0.0])),  # verify step
                float(rng.uniform(-1.0, 3.0)),  # first pass beyond a later one
                float(rng.uniform(0.01, 2.0)),  # lambda
            ]
            yield unseen, scalars


def tables(unseen, scalars):
    """``goodput_tables``' views, the buffer filled (and whether its ``go_on`` rows are exact)."""
    out = np.full(goodput_table_size(unseen.size), np.nan)
    exact = goodput_tables(unseen, *scalars, out)
    return goodput_table_views(out, unseen.size), exact


def test_goodput_tables_match_numpy_bit_for_bit():
    rng = np.random.default_rng(0)
    for unseen, scalars in _cases(rng):
        got_tables, exact = tables(unseen, scalars)
        assert exact
        for got, want in zip(got_tables, numpy_tables(unseen, *scalars)):
            assert got.shape == want.shape
            np.testing.assert_array_equal(got, want)  # exact, not approximate


def _survivals(rng, threshold):
    """Survivals to try against a row's ``go_on``: the threshold and its float neighbours, random ones,
    0 and 1."""
    near = (
        [threshold, np.nextafter(threshold, -np.inf), np.nextafter(threshold, np.inf)] if np.isfinite(threshold) else []
    )
    return [s for s in near + [0.0, 1.0, float(rng.uniform()), float(rng.uniform(0.0, 1e-3))] if s >= 0.0]


def test_go_on_is_the_least_survival_at_which_the_plan_extends():
    """``go_on[k]`` against ``goodput_best`` on the row ``_plan(k, k)`` reads: extending (``positive``)
    iff the survival is at least ``go_on[k]``, at the threshold and one ulp either side; and the
    threshold is the least such float (one ulp below, or 0, does not extend)."""
    rng = np.random.default_rng(3)
    for unseen, scalars in _cases(rng):
        (gain, cost_later, _, _, _, go_on), exact = tables(unseen, scalars)
        assert exact
        H = unseen.size
        for k in range(H):
            threshold = float(go_on[k])
            assert threshold >= 0.0
            for survival in _survivals(rng, threshold):
                _, positive = goodput_best(gain[k], cost_later[0], survival, H - k)
                assert positive == (survival >= threshold), (k, survival, threshold)
            if np.isfinite(threshold) and threshold > 0.0:
                below = float(np.nextafter(threshold, -np.inf))
                assert not goodput_best(gain[k], cost_later[0], below, H - k)[1]


def test_go_on_on_hand_made_rows_ties_and_extremes():
    """Rows whose values are exact ties with 0 at a survival, a free length (cost 0), costs that no
    survival in [0, 1] pays, a negative cost and tiny ones: ``go_on`` decides as ``goodput_best``."""
    rng = np.random.default_rng(4)
    H = 6
    for _ in range(300):
        unseen = rng.choice(np.array([0.0, 0.25, 0.5, 1.0, 1e-300, 0.999999]), H)
        scalars = [1.0, 1.0, 1.0, 1.0]
        scalars += [float(rng.choice([0.0, 0.125, 1.0, 3.0, 1e-300]))]  # token_ms
        scalars += [0.0, float(rng.choice([0.0, 0.5, 2.0])), 0.0, float(rng.choice([-1.0, 0.0, 1.0]))]
        scalars += [float(rng.choice([0.5, 1.0, 1e-9, 7.0]))]  # lambda
        (gain, cost_later, _, _, _, go_on), exact = tables(unseen, scalars)
        assert exact
        for k in range(H):
            for survival in _survivals(rng, float(go_on[k])) + [0.25, 0.5, 0.125]:
                assert goodput_best(gain[k], cost_later[0], survival, H - k)[1] == (survival >= go_on[k])


def test_go_on_not_exact_with_a_nan_or_infinite_cost():
    unseen = np.full(4, 0.5)
    assert not tables(unseen, [1.0, 1.0, 1.0, 1.0, np.nan, 0.0, 1.0, 0.0, 0.0, 1.0])[1]
    assert not tables(unseen, [1.0, 1.0, 1.0, 1.0, np.inf, 0.0, 1.0, 0.0, 0.0, 1.0])[1]
    (gain, cost_later, *_, go_on), exact = tables(unseen, [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0])
    assert exact and 0.0 < go_on[1] < 1e-300  # free lengths: the least survival whose product is not 0
    assert goodput_best(gain[1], cost_later[0], float(go_on[1]), 3)[1]
    assert not goodput_best(gain[1], cost_later[0], float(np.nextafter(go_on[1], -1.0)), 3)[1]


def test_goodput_best_matches_numpy_argmax():
    rng = np.random.default_rng(1)
    for unseen, scalars in _cases(rng):
        (gain, cost_later, cost_first, _, _, _), _ = tables(unseen, scalars)
        H = unseen.size
        for survival in (0.0, 1.0, float(rng.uniform()), 0.5):
            for k in range(H):
                n = H - k
                for cost in (cost_first, cost_later[int(rng.integers(0, H + 1))]):
                    for m in {n, max(min(n, 8 - k), 1)}:
                        assert goodput_best(gain[k], cost, survival, m) == numpy_best(
                            gain[k, :n], cost[:n], survival, m
                        )


def test_goodput_best_ties_and_nan():
    gain = np.array([1.0, 2.0, 2.0, 3.0, 3.0])
    cost = np.array([0.5, 1.0, 1.0, 2.0, 2.0])  # values 0.5, 1, 1, 1, 1: the first maximum
    assert goodput_best(gain, cost, 1.0, 5) == numpy_best(gain, cost, 1.0, 5) == (1, True)
    assert goodput_best(gain, gain, 1.0, 5) == numpy_best(gain, gain, 1.0, 5) == (0, False)  # all 0: not > 0
    with_nan = np.array([0.1, np.nan, 5.0])
    zeros = np.zeros(3)
    assert goodput_best(with_nan, zeros, 1.0, 3) == numpy_best(with_nan, zeros, 1.0, 3) == (1, False)


@pytest.mark.parametrize("tau", [0.6, 0.3, 0.1, 0.7, 1.0 / 3.0, 0.0, 1.0])
def test_failfast_host_threshold_decides_as_the_tensor_comparison(tau):
    """Confidences at tau's float32 neighbours (the tie-heavy case: tau = 0.6 rounds up in float32,
    1/3 down), random ones and NaN: the host read decides as ``(conf < tau).any()`` did."""
    policy = FailFastPolicy(n=2, tau=tau, n_max=16)
    t32 = torch.tensor(tau, dtype=torch.float32)
    near = [t32, torch.nextafter(t32, torch.tensor(-1.0)), torch.nextafter(t32, torch.tensor(2.0))]
    values = torch.stack(near + [torch.tensor(float("nan")), torch.rand(()), torch.tensor(1.0)]).float()
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        conf = values[torch.randint(0, values.numel(), (int(torch.randint(1, 5, (1,), generator=gen)),), generator=gen)]
        want = bool((conf < tau).any())
        got = any(p < policy._tau_in(conf.dtype) for p in conf.tolist())
        assert got == want, (conf, tau)


class NumpyCalibration(AcceptanceCalibration):
    """``AcceptanceCalibration`` with the numpy counting and estimates the compiled calls replaced."""

    def observe_many(self, drafts):
        confs, reached, accepted = [], [], []
        for conf, a in drafts:
            conf = np.asarray(conf, dtype=np.float64).reshape(-1)
            r = min(a + 1, conf.size)
            if r:
                confs.append(conf[:r])
                reached.append(r)
                accepted.append(a)
        if not reached:
            return
        lengths = np.array(reached)
        total = int(lengths.sum())
        conf = np.concatenate(confs)
        position = np.arange(1, total + 1) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        was_accepted = position <= np.repeat(np.array(accepted), lengths)
        longest = int(lengths.max())
        if longest > self._cells.size:
            self._cells = self.position_bin(np.arange(1, 2 * longest + 1)) * self.confidence_edges.size
        cells = self._cells[position - 1] + self.confidence_bin(conf)
        size, shape = self.reached.size, self.reached.shape
        self.reached += np.bincount(cells, minlength=size).reshape(shape)
        self.accepted += np.bincount(cells[was_accepted], minlength=size).reshape(shape)
        self.confidence_sum += np.bincount(cells, weights=conf, minlength=size).reshape(shape)
        self._table = self._unseen = None

    def table(self):
        s1 = self.position_strength
        return (self.accepted + s1 * self.pooled()[None, :]) / (self.reached + s1)

    def unseen(self):
        s0, s1 = self.prior_strength, self.position_strength
        overall = (self.accepted.sum() + s0 * self.prior_acceptance) / (self.reached.sum() + s0)
        return (self.accepted.sum(axis=1) + s1 * overall) / (self.reached.sum(axis=1) + s1)


def test_calibration_counts_and_estimates_match_numpy_bit_for_bit():
    """Random drafts and tie-heavy ones (confidences exactly at the bins' edges, 0, 1, NaN, drafts
    past ``MAX_POSITION``), in batches as goodput feeds them: the same counts and estimates."""
    rng = np.random.default_rng(2)
    edges = np.array(CONFIDENCE_EDGES)
    for prior in ((4.0, 8.0, 0.5), (0.5, 3.0, 0.9)):
        fast, slow = AcceptanceCalibration(*prior), NumpyCalibration(*prior)
        for _ in range(60):
            batch = []
            for _ in range(int(rng.integers(1, 9))):
                k = int(rng.choice([0, 1, 3, 8, 60, 300]))
                conf = rng.uniform(0.0, 1.0, k)
                if rng.random() < 0.5:
                    conf = rng.choice(np.append(edges, [1.0, np.nan, 0.985]), k)
                batch.append((tuple(conf.tolist()), int(rng.integers(0, k + 1))))
            fast.observe_many(batch)
            slow.observe_many(batch)
            for name in ("reached", "accepted", "confidence_sum"):
                np.testing.assert_array_equal(getattr(fast, name), getattr(slow, name))
            np.testing.assert_array_equal(fast.table(), slow.table())
            np.testing.assert_array_equal(fast.unseen(), slow.unseen())
    with pytest.raises(ValueError, match="accepted_length"):
        fast.observe_many([((0.5, 0.5), 3)])
