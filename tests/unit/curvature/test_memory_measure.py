"""The storage counter the memory model is fitted and checked with: each storage counted once while
it lives, views of older storages not at all."""

import torch

from tiny_llm.curvature.memory_measure import StoragePeak


def test_storage_peak_counts_each_storage_once_until_it_is_freed():
    with StoragePeak() as counter:
        x = torch.ones(1000, dtype=torch.float64)
        views = [x[:10], x.view(10, 100), x.t() if x.dim() == 2 else x[1:]]
        y = x * 2
        del x, views
        z = y + 1  # noqa: F841 (held: it is counted while alive)
        del y
    assert counter.peak == 3 * 8000 - 8000  # x and y, then y and z: never three at once
    assert counter.live == 8000  # z


def test_storage_peak_does_not_count_views_of_what_existed_before():
    before = torch.ones(1000, dtype=torch.float64)
    with StoragePeak() as counter:
        parts = before.split(100)  # views of a storage made before the block
        head = before[:10].t()
        before.mul_(2)  # in place
        new = parts[0] * 2  # noqa: F841 (held)
        del head
    assert counter.peak == 800  # only the product's storage
