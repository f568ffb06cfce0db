"""Plain NumPy references the tests compare kvq against, in float64, and the data they draw."""

import numpy as np


def key_like(rng, n, d):
    """n x d float32 vectors like attention keys: non-zero channel means and 4 outlier channels 10-50x the rest
    (the shape of kvq's key_like_profile)."""
    scale = np.ones(d)
    scale[rng.choice(d, 4, replace=False)] = rng.uniform(10, 50, 4)
    mean = rng.normal(0, 0.5, d) * scale
    return (mean + rng.standard_normal((n, d)) * scale).astype(np.float32)


def tokens(rng, n, heads, d, outliers=True):
    """Keys (key-like or Gaussian) and Gaussian values, float32 [n, heads, d] each."""
    keys = key_like(rng, n * heads, d) if outliers else rng.standard_normal((n * heads, d)).astype(np.float32)
    values = rng.standard_normal((n * heads, d)).astype(np.float32)
    return keys.reshape(n, heads, d), values.reshape(n, heads, d)


class Attention:
    """Softmax attention of query rows in float64 with what bounds an fp32 implementation's error, per row
    (tests/attention_test_util.hpp): magnitude = sum_t p_t ||v_t|| and condition = max_t scale * sum_j |q_j k_tj|."""

    def __init__(self, rows, d):
        self.out = np.zeros((rows, d))
        self.magnitude = np.zeros(rows)
        self.condition = np.zeros(rows)

    def row(self, r, q, keys, values, scale):
        """Row r: query q (d) over keys and values (n x d); no token gives zeros."""
        if len(keys) == 0:
            return
        q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, keys, values))
        s = scale * (k @ q)
        p = np.exp(s - s.max())
        p /= p.sum()
        self.out[r] = p @ v
        self.magnitude[r] = p @ np.linalg.norm(v, axis=1)
        self.condition[r] = scale * (np.abs(k) @ np.abs(q)).max()

    def worst(self, got, tol=1e-5, score_rounding=True, want=None):
        """max over rows of |got - want| / ((tol + sqrt(d) 2^-24 condition) magnitude): within the bound at <= 1.
        want: the reference's output, or another implementation's measured against the same bound."""
        got = np.asarray(got, dtype=np.float64).reshape(self.out.shape)
        want = self.out if want is None else np.asarray(want, dtype=np.float64).reshape(self.out.shape)
        d = self.out.shape[1]
        err = np.linalg.norm(got - want, axis=1)
        allowance = np.sqrt(d) * 2.0**-24 * self.condition if score_rounding else 0.0
        bound = (tol + allowance) * self.magnitude
        # A row that sees no token must be exactly zero.
        return max((e / b if b > 0 else (0.0 if e == 0 else np.inf) for e, b in zip(err, bound)), default=0.0)
