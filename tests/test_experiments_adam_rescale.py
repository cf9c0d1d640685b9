"""Notebook 07's check that Adam does not cancel a gradient scale that switches mid-run."""

from __future__ import annotations

import numpy as np
import pytest

from clusterlab.experiments import gradient_scaling


def test_sgd_follows_a_rescaled_gradient_at_once_and_adam_only_slowly():
    sgd = gradient_scaling.rescaled_midway(factor=0.75, before=1000, optimizer="sgd")
    adam = gradient_scaling.rescaled_midway(factor=0.75, before=1000, optimizer="adam")
    assert np.allclose(sgd["ratio"], 0.75) and sgd["betas"] is None
    assert adam["betas"] == (0.9, 0.999)
    r = dict(zip(adam["probes"], adam["ratio"]))
    # m adapts within ~10 steps, v within ~1000: the step shrinks, then recovers
    assert r[1] > 0.95 and r[100] < 0.8 and r[3000] > 0.95


def test_unknown_optimizer_is_refused():
    with pytest.raises(ValueError):
        gradient_scaling.rescaled_midway(optimizer="lamb")
