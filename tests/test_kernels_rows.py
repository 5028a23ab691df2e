"""copy_rows (gpunn.kernels.rows) against its reference: gathers and scatters of float64 and float32 rows at odd
widths, the rows not named left as they were (poisoned with NaN), and bad operands refused."""

import numpy as np
import pytest
from numba import cuda

from gpunn.kernels.rows import copy_rows, copy_rows_reference


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_copy_rows_gathers_and_scatters(dtype):
    rng = np.random.default_rng(7)
    src = rng.normal(size=(9, 37)).astype(dtype)
    dst = np.full((6, 37), np.nan, dtype=dtype)
    src_idx, dst_idx = np.array([8, 0, 3, 3], np.int32), np.array([5, 1, 0, 2], np.int32)
    d_dst = cuda.to_device(dst)
    copy_rows(cuda.to_device(src), cuda.to_device(src_idx), d_dst, cuda.to_device(dst_idx))
    got = d_dst.copy_to_host()
    want = copy_rows_reference(src, src_idx, dst, dst_idx)
    np.testing.assert_array_equal(got, want)
    assert np.isnan(got[[3, 4]]).all() and not np.isnan(got[[0, 1, 2, 5]]).any()


def test_copy_rows_refuses_mismatched_operands():
    src, at = cuda.to_device(np.zeros((3, 4))), cuda.to_device(np.arange(2, dtype=np.int32))
    with pytest.raises(ValueError, match="one width"):
        copy_rows(src, at, cuda.device_array((3, 5)), at)
    with pytest.raises(ValueError, match="dst must be float64"):
        copy_rows(src, at, cuda.device_array((3, 4), dtype=np.float32), at)
