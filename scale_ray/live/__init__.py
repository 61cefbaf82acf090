"""Live scheduling: agent-workflow primitives as Ray tasks placed by a Policy (docs/live.md).

Quick use::

    from scale_ray.live import primitive, LiveScheduler
    @primitive(compute_gflop=2.0, memory_gb=4.0)
    def fetch(url): ...
    with LiveScheduler(get_policy("eft")) as sched:   # after ray.init(...)
        handle = sched.submit(summarize.bind(fetch.bind("a"), fetch.bind("b")))
        print(handle.result())

A Ray DAG works as is: ``sched.submit(f.bind(g.bind(x)))`` (``raydag``). See docs/live.md.

Modules: ``config`` (LiveConfig, errors), ``workflow`` (primitives, DAGs), ``raydag`` (what
``submit`` accepts; Ray DAGs), ``handles`` (what a submission returns), ``executors`` (how a
primitive runs on Ray), ``discovery`` (servers from the cluster: scale nodes or what Ray
reports), ``nodes`` (the node set, server actors), ``refusals`` (why a submit is refused),
``tasks`` (the scheduler's records), ``journal`` (durable records: ``LiveConfig.storage``,
``attempt()``), ``durability`` (the scheduler's side of it: resume, idempotent keys),
``admission`` (workflows and node changes entering the scheduler), ``scheduler`` (LiveScheduler), ``ray_default`` (Ray's own
placement), ``cluster`` (scale node capacities, a local cluster), ``localcluster`` (``scale-ray
cluster up|down``), ``runner`` (streams of workflows), ``raylocal`` (a fresh machine's Ray
directories and token). Imports point down:
envs, policies and this package. ``ray`` is imported inside the functions that use it, so
configs, DAG files and handles import without it; everything else is imported at module level.
"""

from .cluster import LocalHeteroCluster, NodeInfo, live_nodes
from .config import (EXECUTORS, LiveConfig, NoServers, PlacementError, SchedulingError,
                     TaskLostError, Unschedulable, WorkflowQuarantined)
from .handles import WorkflowFailed, WorkflowHandle, summarize
from .journal import attempt
from .gateway import program
from .programs import EarlierStepFailed, Program, ProgramClosed, StepResult
from .ray_default import RayDefaultRunner
from .scheduler import LiveScheduler
from .raydag import as_collected
from .workflow import (Call, Primitive, WorkflowError, WorkflowTypeError, collect, from_spec,
                       load_dag_file, parse_dag, primitive)

__all__ = ["Call", "Primitive", "primitive", "collect", "from_spec", "load_dag_file", "parse_dag",
           "WorkflowError", "LiveConfig", "EXECUTORS", "LiveScheduler", "RayDefaultRunner",
           "WorkflowHandle", "WorkflowFailed", "summarize", "TaskLostError", "PlacementError",
           "SchedulingError", "WorkflowQuarantined",
           "LocalHeteroCluster", "NodeInfo", "live_nodes", "NoServers", "Unschedulable",
           "WorkflowTypeError", "as_collected", "attempt", "Program", "ProgramClosed",
           "StepResult", "EarlierStepFailed", "program"]
