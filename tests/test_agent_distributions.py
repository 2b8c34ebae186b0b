"""Exact masked cases, sampling, special functions and numerics of lib.learners."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.learners.distributions import (
    MaskedCategorical,
    MaskedDirichlet,
    digamma,
    lgamma,
    trigamma,
)
from lib.learners.nn import (
    Adam,
    AdamConfig,
    clip_by_global_norm,
    masked_softmax_forward,
    orthogonal_init,
)
from lib.learners.normalize import RunningMeanStd

EULER = 0.5772156649015329

# --------------------------------------------------------------------------
# Masked categorical


def test_categorical_two_of_three_allowed_is_exactly_half_half():
    d = MaskedCategorical(np.array([0.0, 0.0, 0.0]), np.array([1, 1, 0], dtype=bool))
    np.testing.assert_array_equal(d.probs, [[0.5, 0.5, 0.0]])
    assert d.entropy()[0] == pytest.approx(math.log(2), abs=1e-15)
    assert d.log_prob(np.array([1]))[0] == pytest.approx(-math.log(2), abs=1e-15)


def test_categorical_masked_entry_gets_zero_even_with_a_huge_logit():
    logits = np.array([[0.0, 1e6, math.log(3.0)]])
    d = MaskedCategorical(logits, np.array([[True, False, True]]))
    np.testing.assert_allclose(d.probs, [[0.25, 0.0, 0.75]], rtol=0, atol=1e-15)
    assert d.probs[0, 1] == 0.0
    expected = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert d.entropy()[0] == pytest.approx(expected, abs=1e-14)
    assert d.mode()[0] == 2


def test_categorical_single_allowed_option_has_zero_entropy():
    d = MaskedCategorical(np.array([[3.0, -2.0, 5.0]]),
                          np.array([[False, True, False]]))
    np.testing.assert_array_equal(d.probs, [[0.0, 1.0, 0.0]])
    assert d.entropy()[0] == 0.0
    assert d.log_prob(np.array([1]))[0] == 0.0


def test_categorical_samples_avoid_masked_and_match_probs():
    rng = np.random.default_rng(0)
    n = 40_000
    logits = np.tile([0.0, 1.0, 2.0, 0.5], (n, 1))
    mask = np.tile([True, False, True, True], (n, 1))
    d = MaskedCategorical(logits, mask)
    a = d.sample(rng)
    assert not np.any(a == 1)
    freq = np.bincount(a, minlength=4) / n
    se = np.sqrt(d.probs[0] * (1 - d.probs[0]) / n)
    assert np.all(np.abs(freq - d.probs[0]) < 5 * se + 1e-12)


def test_categorical_rejects_a_row_with_nothing_allowed():
    with pytest.raises(ValueError, match=r"allows nothing in row\(s\) \[1\]"):
        MaskedCategorical(np.zeros((2, 3)), np.array([[1, 0, 0], [0, 0, 0]], bool))


def test_masked_softmax_zero_where_masked():
    p, _ = masked_softmax_forward(np.array([[5.0, 1e3, 5.0]]),
                                  np.array([[True, False, True]]))
    np.testing.assert_array_equal(p, [[0.5, 0.0, 0.5]])


# --------------------------------------------------------------------------
# Masked Dirichlet


def test_dirichlet_beta_case_matches_closed_form():
    # Beta(2, 3) at 0.4: x (1 - x)^2 / B(2, 3) = 0.4 * 0.36 * 12 = 1.728.
    d = MaskedDirichlet(np.array([2.0, 7.0, 3.0]), np.array([True, False, True]))
    x = np.array([[0.4, 0.0, 0.6]])
    assert d.log_prob(x)[0] == pytest.approx(math.log(1.728), abs=1e-13)
    np.testing.assert_allclose(d.mean, [[0.4, 0.0, 0.6]], rtol=1e-15)


def test_dirichlet_flat_entropies():
    # Dirichlet(1, ..., 1) over K devices is uniform on a simplex of volume
    # 1 / (K - 1)!, so its entropy is -log (K - 1)!.
    for k in (2, 3, 5):
        d = MaskedDirichlet(np.ones((1, 6)), np.arange(6)[None] < k)
        assert d.entropy()[0] == pytest.approx(-math.lgamma(k), abs=1e-12)


def test_dirichlet_single_usable_device_is_a_point_mass():
    d = MaskedDirichlet(np.array([[2.0, 0.7, 5.0]]), np.array([[False, True, False]]))
    x = d.sample(np.random.default_rng(0))
    np.testing.assert_array_equal(x, [[0.0, 1.0, 0.0]])
    assert d.log_prob(x)[0] == 0.0
    assert d.entropy()[0] == pytest.approx(0.0, abs=1e-15)


def test_dirichlet_sample_mean_and_masked_shares():
    rng = np.random.default_rng(7)
    n = 20_000
    alpha = np.array([0.8, 5.0, 2.0, 3.0])
    mask = np.array([True, False, True, True])
    d = MaskedDirichlet(np.tile(alpha, (n, 1)), np.tile(mask, (n, 1)))
    x = d.sample(rng)
    assert np.all(x[:, 1] == 0.0)
    np.testing.assert_allclose(x.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    a = np.where(mask, alpha, 0.0)
    a0 = a.sum()
    mean = a / a0
    var = mean * (1 - mean) / (a0 + 1)
    assert np.all(np.abs(x.mean(axis=0) - mean) < 5 * np.sqrt(var / n) + 1e-15)
    np.testing.assert_allclose(d.mean[0], mean, rtol=1e-15)


def test_dirichlet_rejects_non_positive_usable_concentration():
    with pytest.raises(ValueError, match="device 1"):
        MaskedDirichlet(np.array([[1.0, 0.0, 2.0]]))
    # ... but a masked device may hold anything.
    MaskedDirichlet(np.array([[1.0, 0.0, 2.0]]), np.array([[True, False, True]]))


# --------------------------------------------------------------------------
# Special functions


@pytest.mark.parametrize(("x", "value"), [
    (1.0, -EULER),
    (0.5, -1.9635100260214235),
    (2.0, 1.0 - EULER),
    (10.0, 2.251752589066721),
    (1e-3, -1000.5755719318103),
    (1e6, 13.815510057964274),
])
def test_digamma_known_values(x, value):
    assert float(digamma(x)) == pytest.approx(value, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize(("x", "value"), [
    (1.0, math.pi**2 / 6),
    (0.5, math.pi**2 / 2),
    (2.0, math.pi**2 / 6 - 1.0),
    (3.0, math.pi**2 / 6 - 1.25),
])
def test_trigamma_known_values(x, value):
    assert float(trigamma(x)) == pytest.approx(value, rel=1e-12)


def test_special_functions_are_nan_outside_the_domain():
    assert np.isnan(digamma(0.0)) and np.isnan(trigamma(-1.0))


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=1e-3, max_value=1e3))
def test_digamma_and_trigamma_recurrences(x):
    assert float(digamma(x + 1)) == pytest.approx(float(digamma(x)) + 1 / x,
                                                  rel=1e-11, abs=1e-11)
    assert float(trigamma(x)) == pytest.approx(float(trigamma(x + 1)) + 1 / x**2,
                                               rel=1e-11)


def test_lgamma_is_vectorised_math_lgamma():
    x = np.array([[0.1, 1.0], [4.5, 100.0]])
    np.testing.assert_array_equal(lgamma(x), np.vectorize(math.lgamma)(x))


# --------------------------------------------------------------------------
# Small numerics


def test_orthogonal_init_is_orthogonal():
    rng = np.random.default_rng(0)
    w = orthogonal_init((6, 4), 2.0, rng)
    np.testing.assert_allclose(w.T @ w, 4.0 * np.eye(4), atol=1e-12)
    w = orthogonal_init((3, 5), 1.0, rng)
    np.testing.assert_allclose(w @ w.T, np.eye(3), atol=1e-12)


def test_clip_by_global_norm():
    grads = {"a": np.array([3.0]), "b": np.array([4.0])}
    clipped, norm = clip_by_global_norm(grads, 1.0)
    assert norm == 5.0
    np.testing.assert_allclose([clipped["a"][0], clipped["b"][0]], [0.6, 0.8])
    same, _ = clip_by_global_norm(grads, 10.0)
    assert same["a"][0] == 3.0


def test_adam_minimises_a_quadratic():
    params = {"x": np.array([5.0, -3.0])}
    opt = Adam(params, AdamConfig(lr=0.1))
    for _ in range(500):
        opt.step({"x": 2.0 * (params["x"] - np.array([1.0, 2.0]))})
    np.testing.assert_allclose(params["x"], [1.0, 2.0], atol=1e-2)


def test_adam_first_step_has_the_learning_rate_as_size():
    params = {"x": np.array([0.0, 0.0])}
    Adam(params, AdamConfig(lr=0.01)).step({"x": np.array([0.5, -50.0])})
    np.testing.assert_allclose(params["x"], [-0.01, 0.01], rtol=1e-4)


def test_running_mean_std_matches_the_whole_data():
    rng = np.random.default_rng(3)
    data = rng.normal(2.0, 3.0, size=(1000, 3))
    rms = RunningMeanStd(3)
    for part in np.array_split(data, 7):
        rms.update(part)
    np.testing.assert_allclose(rms.mean, data.mean(axis=0), rtol=1e-7)
    np.testing.assert_allclose(rms.var, data.var(axis=0), rtol=1e-6)
    z = rms.normalize(data)
    np.testing.assert_allclose(z.mean(axis=0), 0.0, atol=1e-6)
    again = RunningMeanStd.from_json(rms.to_json())
    np.testing.assert_array_equal(again.mean, rms.mean)
