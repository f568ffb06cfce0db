"""torch tensors cross the binding through DLPack without a copy: inputs are read in place, out= is written in
place, and a tensor of the wrong kind (dtype, device, layout) raises TypeError. Skipped where torch is missing."""

import numpy as np
import pytest

import kvq
from reference import tokens

torch = pytest.importorskip("torch")


def test_tensors_in_and_out_without_copies(rng):
    keys, values = tokens(rng, 150, 2, 64)
    q = rng.standard_normal((1, 4, 64)).astype(np.float32)
    with_numpy = kvq.KVCache(1, 2, 64, capacity_pages=4, key_codec="int8", value_codec="int4")
    with_torch = kvq.KVCache(1, 2, 64, capacity_pages=4, key_codec="int8", value_codec="int4")
    with_numpy.append(with_numpy.add_sequence(), 0, keys, values)
    with_torch.append(with_torch.add_sequence(), 0, torch.from_numpy(keys), torch.from_numpy(values))
    out = torch.full((1, 4, 64), float("nan"))
    assert with_torch.decode_attention(0, [0], torch.from_numpy(q), out=out) is out
    np.testing.assert_array_equal(out.numpy(), with_numpy.decode_attention(0, [0], q))

    codec = kvq.Codec("int4", 64)
    x = torch.randn(10, 64, generator=torch.Generator().manual_seed(int(rng.integers(2**31))))
    np.testing.assert_array_equal(codec.encode(x), codec.encode(x.numpy()))
    # A view into a larger tensor is read where it lies.
    rows = torch.randn(20, 64)
    np.testing.assert_array_equal(codec.encode(rows[5:15]), codec.encode(rows[5:15].numpy().copy()))


def test_wrong_kinds_of_tensor_raise_type_errors():
    codec = kvq.Codec("int4", 64)
    with pytest.raises(TypeError, match="float32"):
        codec.encode(torch.zeros(4, 64, dtype=torch.float16))
    with pytest.raises(TypeError, match="float32"):
        codec.encode(torch.zeros(4, 64, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="C-contiguous"):
        codec.encode(torch.zeros(64, 4).t())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_tensors_are_refused_by_the_cpu_cache():
    codec = kvq.Codec("int4", 64)
    with pytest.raises(TypeError, match="CPU memory, got one on cuda"):
        codec.encode(torch.zeros(4, 64, device="cuda"))
