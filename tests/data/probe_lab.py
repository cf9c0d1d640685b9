"""A lab for hostile submissions to the grader (tests/test_grade_sandbox.py), not the course.

Its notebooks import this file from their folder (a learner may ship a doctored copy there);
the grader imports it from here, and so do the tests.
"""

from clusterlab.labs import Fail, Lab

LAB = Lab("98_probe", "A lab for hostile submissions", follows="00_start_here")
SUM = LAB.exercise("probe_sum", needs=("add",), title="Add two numbers")
SEED = LAB.exercise("probe_seed", needs=("seed_guess",), title="Guess the grader's seed")


@SUM.check("adds small integers")
def _small(ctx):
    got = ctx.call(ctx.learner("add"), 2, 3)
    if got != 5:
        raise Fail(f"add(2, 3) returned {got!r}, not 5")


@SUM.check("adds random floats", hidden=True)
def _floats(ctx):
    a, b = ctx.rng.normal(size=2)
    got = ctx.call(ctx.learner("add"), a, b)
    if abs(got - (a + b)) > 1e-12:
        raise Fail(f"add({a:.3f}, {b:.3f}) returned {got!r}")


@SEED.check("names the grader's seed")
def _seed(ctx):
    got = ctx.call(ctx.learner("seed_guess"))
    if got != ctx.grader_seed:
        raise Fail(f"seed_guess() returned {got!r}, not the grader's seed")
