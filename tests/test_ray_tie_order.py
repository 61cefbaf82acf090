"""Ray default's twin knows the live cluster's tie order (issue 46, item 6).

Ray's hybrid policy ranks nodes by score and breaks ties by ``scheduling::NodeID`` (the signed
std::hash of the binary node id); below the spread threshold every node scores 0, and with top
k = 1 (fewer than 10 nodes) Ray takes the first node in that order. ``ray_node_order``
(policies/heuristics.py) computes the order from the node ids, so the simulator's Ray default can
replay a live cluster's choices (scale_ray/bench/agents_live.py). Here, on a real cluster: a
head without CPUs and four identical 4-CPU nodes, the first task of an idle cluster lands on the
first node of that order, and so do most tasks sent one at a time.
"""

from __future__ import annotations

import collections
import shutil

import pytest
import ray
from processes import cpuless_head_cluster

from policies.heuristics import ray_node_order


@ray.remote(num_cpus=1)
def where() -> str:
    return ray.get_runtime_context().get_node_id()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ray_places_on_the_first_node_of_ray_node_order():
    c, tmp = cpuless_head_cluster("sct_")
    try:
        ids = [c.add_node(num_cpus=4, object_store_memory=100 * 10 ** 6).node_id
               for _ in range(4)]
        c.wait_for_nodes()
        ray.init(address=c.address, include_dashboard=False, log_to_driver=False)
        first = ids[ray_node_order(ids)[0]]
        got = [ray.get(where.remote(), timeout=120) for _ in range(6)]
        assert got[0] == first, (got, ids)
        # later ones may spill down the order while earlier leases are still held
        assert collections.Counter(got).most_common(1)[0][0] == first, (got, ids)
    finally:
        ray.shutdown()
        c.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
