"""Isolation's median of the known values (one sort instead of np.nanmedian's loop per slice) gives np.nanmedian's
answer, NaN where a slice has no value at all."""

import warnings

import numpy as np

from sigma.controller.detect.isolation import _median


def test_median_of_known_values_matches_nanmedian_on_every_axis():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(6, 9, 5))
    a[rng.random(a.shape) < 0.3] = np.nan
    a[0, :, 1] = np.nan  # a slice with nothing known
    a[1, :4, 2] = np.nan  # an even count left
    for axis in range(3):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            want = np.nanmedian(a, axis=axis)
        np.testing.assert_allclose(_median(a, axis), want, equal_nan=True)
    assert np.isnan(_median(a, 1)[0, 1])
