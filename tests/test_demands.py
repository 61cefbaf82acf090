"""envs.demands against Ray's own option checks (ray/_common/ray_option_utils.py, the label rules
of ray/_private/label_utils.py, and the raylet's "GPU quantities > 1 must be whole"), on
generated options: we never accept options Ray refuses, and we refuse options Ray accepts only
for the reasons the module names (stricter on purpose)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envs.demands import (ACCEL_PREFIX, CPU, GPU, LABEL_PREFIX, MEMORY, SLOT, DemandError,
                          Request, parse_options, selector_matches)

ray_options = pytest.importorskip("ray._common.ray_option_utils")

AMOUNTS = st.one_of(st.integers(-2, 64), st.floats(-1.0, 64.0, allow_nan=False),
                    st.sampled_from([0.0, 1e-5, 9.9999e-5, 1e-4, 0.5, 1.5, 2.0, 0.00009999999999,
                                     math.nan, math.inf]), st.booleans())
NAMES = st.sampled_from(["custom", "é-tpu", "tpu-v4", "CPU", "GPU", "memory", "node:1.2.3.4",
                         "accelerator_type:A100", "label:x", "slot", "", "a\nb", "x" * 201,
                         "my.res/2"])
LABELS = st.sampled_from(["zone", "zoné", "ray.io/zone", "-bad", "a" * 64, "k8s.io/x",
                          "bad prefix/x", "a.b"])
EXPRS = st.sampled_from(["a", "!a", "in(a,b)", "!in(a, b)", "(a,b)", "in()", "", "a b", "é",
                         "notin(a)"])
OPTIONS = st.fixed_dictionaries({}, optional={
    "num_cpus": AMOUNTS, "num_gpus": AMOUNTS, "memory": AMOUNTS,
    "resources": st.dictionaries(NAMES, AMOUNTS, max_size=3),
    "accelerator_type": st.sampled_from(["A100", "H100-80GB", "weird name", ""]),
    "label_selector": st.dictionaries(LABELS, EXPRS, max_size=3)})


def ray_accepts(opts: dict) -> bool:
    """Ray's verdict: its option validation, then the raylet's whole-GPU rule."""
    try:
        ray_options.validate_task_options(opts, in_options=True)
    except Exception:  # noqa: BLE001 - Ray raises ValueError, TypeError, OverflowError
        return False
    g = opts.get("num_gpus")
    return not (isinstance(g, float) and g > 1 and not g.is_integer())


def stricter(opts: dict) -> bool:
    """Options we refuse on purpose although Ray takes them (envs/demands.py says why)."""
    amounts = [opts.get(k) for k in ("num_cpus", "num_gpus", "memory")]
    amounts += list((opts.get("resources") or {}).values())
    if any(isinstance(a, bool) for a in amounts):
        return True  # True is not an amount
    for k in opts.get("resources") or {}:
        if k == MEMORY or k == SLOT or not k or not k.isprintable() or len(k) > 200 \
                or k.startswith(("node:", ACCEL_PREFIX, LABEL_PREFIX)):
            return True
    if "accelerator_type" in opts and opts["accelerator_type"] not in ("A100", "H100-80GB"):
        return True  # an accelerator type is a Ray label value (it becomes a node label)
    if any(v == "" for v in (opts.get("label_selector") or {}).values()):
        return True  # an empty selector selects nothing
    return False


@settings(max_examples=400, deadline=None)
@given(OPTIONS)
def test_we_accept_what_ray_accepts_and_nothing_it_refuses(opts):
    try:
        parse_options(opts)
        ours = True
    except DemandError as e:
        ours = False
        assert "options." in str(e)  # the error names the option
    theirs = ray_accepts(opts)
    if ours:
        assert theirs, f"accepted options Ray refuses: {opts}"
    elif theirs:
        assert stricter(opts), f"refused options Ray accepts: {opts}"


def test_a_request_on_nodes_and_on_a_slot():
    r = parse_options({"num_gpus": 0.5, "memory": 3e9, "resources": {"é-tpu": 2},
                       "accelerator_type": "A100", "label_selector": {"zone": "in(a, b)"}})
    assert r.on_nodes() == ((CPU, 1.0), (GPU, 0.5), (ACCEL_PREFIX + "A100", 0.001),
                            ("label:zone=in(a, b)", 1.0), (MEMORY, 3.0), ("é-tpu", 2.0))
    assert dict(r.on_slot()) == {GPU: 0.5, ACCEL_PREFIX + "A100": 0.001,
                                 "label:zone=in(a, b)": 1.0, MEMORY: 3.0, "é-tpu": 2.0, SLOT: 1.0}
    assert Request(num_cpus=0.0).on_nodes() == ()  # num_cpus=0 holds no CPU, as in Ray
    assert parse_options(None, memory_gb=2.0).memory_gb == 2.0
    assert parse_options({"memory": 1e9}, memory_gb=2.0).memory_gb == 2.0  # the larger counts


@pytest.mark.parametrize("expr,labels,want", [
    ("a", {"zone": "a"}, True), ("a", {}, False), ("!a", {}, True), ("!a", {"zone": "a"}, False),
    ("in(a,b)", {"zone": "b"}, True), ("in(a, b)", {"zone": "c"}, False),
    ("!in(a,b)", {"zone": "c"}, True), ("(a,b)", {"zone": "a"}, True)])
def test_label_selectors_match_as_in_ray(expr, labels, want):
    assert selector_matches("zone", expr, labels) is want
