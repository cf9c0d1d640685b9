"""The closed-form training step (`clusterlab.step_model`): exactly the α-β formulas of
`clusterlab.models` where there is no jitter, and close to the simulator it stands for."""

from __future__ import annotations

from dataclasses import replace

import pytest

from clusterlab import models
from clusterlab.schedule import ALLREDUCE_SCHEDULES
from clusterlab.sim import simulate_training
from clusterlab.step_model import (
    NODE_COUNTS,
    STEP_MODEL_ALGORITHMS,
    TrainingSetup,
    predict_step,
    predicted_curve,
)
from clusterlab.wire import HEADER_BYTES

pytestmark = pytest.mark.timeout(120)


def test_closed_form_is_the_models_formula_without_jitter():
    alpha, rate = 50e-6, 10e9
    beta = 8 / rate * (65536 + HEADER_BYTES) / 65536
    for algo, model in [("ring", models.ring_allreduce),
                        ("recursive_doubling", models.recursive_doubling_allreduce),
                        ("tree", models.tree_allreduce)]:
        # One bucket, no overlap: step = compute + one all-reduce.
        s = TrainingSetup(nodes=16, latency_us=50, jitter_us=0, bandwidth_gbit=10,
                          model_mib=1, bucket_mib=1, overlap=False, algorithm=algo)
        pred = predict_step(s)
        n = 2**20
        assert pred.step_s == pytest.approx(0.1 + model(16, n, alpha, beta), rel=1e-12), algo
        assert pred.efficiency == pytest.approx(0.1 / pred.step_s)
    hier = predict_step(replace(s, algorithm="hierarchical", procs_per_node=4))
    assert hier.step_s == pytest.approx(
        0.1 + models.hierarchical_allreduce(16, 4, n, 0, 0, alpha, beta), rel=1e-12)


@pytest.mark.parametrize("changes", [{}, {"latency_us": 1000, "jitter_us": 50},
                                     {"algorithm": "tree"}, {"procs_per_node": 4},
                                     {"overlap": False, "bandwidth_gbit": 10}])
def test_closed_form_agrees_with_the_simulator(changes):
    s = replace(TrainingSetup(nodes=16), **changes)
    sim = simulate_training(**s.sim_kwargs(5))
    assert predict_step(s).step_s == pytest.approx(sim.mean_step, rel=0.06)


def test_every_algorithm_it_offers_has_a_closed_form_and_others_are_refused():
    assert set(STEP_MODEL_ALGORITHMS) < set(ALLREDUCE_SCHEDULES)  # all of them replayable
    for algorithm in STEP_MODEL_ALGORITHMS:
        curve = predicted_curve(TrainingSetup(algorithm=algorithm))
        assert [c.nodes for c in curve] == list(NODE_COUNTS)
        assert all(0 < c.efficiency <= 1 for c in curve) and curve[0].efficiency == 1
    with pytest.raises(ValueError, match="no closed form .*'hierarchical_rail'"):
        predict_step(TrainingSetup(algorithm="hierarchical_rail"))
