"""The sharded jets' collectives on 3 CPU ranks (gloo): K directions of a parameter cut into
Shard(0) row chunks gathered whole, and an embedding's rows looked up from the ranks that hold them,
equal to the unsharded directions exactly. (The sharded Taylor forms themselves are checked against
one process in test_sharded.py and test_sharded_noise.py.)"""

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tiny_llm.curvature.sharded import shard_rows
from tiny_llm.curvature.sharded_taylor import gather_rows, lookup_rows


def _rows_rank(rank: int, size: int, store: str, out: str) -> None:
    """Each rank's directions of a (rows, 3) parameter gathered whole and looked up at its own ids."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=size)
    try:
        measured = {}
        for rows in (4, 7):  # 4 rows over 3 ranks: chunks of 2, the last rank holds none
            full = torch.randn(2, rows, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(rows))
            shard = shard_rows(list(full), rank, size).view(2, -1, 3)
            ids = torch.randint(0, rows, (2, 5), generator=torch.Generator().manual_seed(10 * rank + rows))
            measured[rows] = {"shard rows": shard.size(1), "gathered": gather_rows(shard, rows, size)}
            measured[rows] |= {"ids": ids, "looked up": lookup_rows(shard, rows, ids, rank, size), "full": full}
        torch.save(measured, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def test_directions_are_gathered_whole_or_looked_up_from_the_ranks_that_hold_their_rows(tmp_path):
    """The root's collectives on 3 ranks: the K directions gathered whole (the head's) and an
    embedding's lookup, each rank at its own token ids, its rows summed from their owners: both
    equal the unsharded directions exactly, also when a rank holds no rows."""
    mp.start_processes(_rows_rank, args=(3, str(tmp_path / "store"), str(tmp_path / "out")), nprocs=3)
    parts = [torch.load(tmp_path / f"out.{rank}", weights_only=True) for rank in range(3)]
    assert [part[4]["shard rows"] for part in parts] == [2, 2, 0]
    for part in parts:
        for measured in part.values():
            assert torch.equal(measured["gathered"], measured["full"])
            assert torch.equal(measured["looked up"], measured["full"][:, measured["ids"]])
