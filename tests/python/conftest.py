"""Fresh random inputs on every run, as the C++ tests draw them (tests/test_seed.hpp): each test that takes `seed`
or `rng` gets a seed from the clock unless KVQ_TEST_SEED is set, and a failing test shows it to replay the draw."""

import itertools
import os
import time

import numpy as np
import pytest

_draws = itertools.count(1)

# The attention tests hold the exact kernels to 1e-5, as the C++ test binaries do
# (tests/exact_attention_environment.cpp); the library reads KVQ_ATTENTION at each call.
os.environ.setdefault("KVQ_ATTENTION", "exact")


@pytest.fixture
def seed():
    env = os.environ.get("KVQ_TEST_SEED")
    value = int(env) if env else (time.time_ns() + 7919 * next(_draws)) % 2**63
    print(f"replay with KVQ_TEST_SEED={value}")  # pytest shows a failing test's output
    return value


@pytest.fixture
def rng(seed):
    return np.random.default_rng(seed)
