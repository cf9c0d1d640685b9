"""The input half of the faults bench: generated netem strings and bad public arguments."""

from __future__ import annotations

import pytest

from clusterlab.bench import faults_input as fi
from clusterlab.netem import Netem
from clusterlab.topology import Topology


def test_generation_is_deterministic_and_covers_the_grammar() -> None:
    a, b = fi.generate(300, seed=5), fi.generate(300, seed=5)
    assert a == b and a != fi.generate(300, seed=6)
    grammar = " ".join(text for text, from_grammar in fi.generate(2000) if from_grammar)
    for word in ("delay", "latency", "distribution", "loss", "drop", "state", "gemodel",
                 "random", "ecn", "duplicate", "corrupt", "reorder", "gap", "rate",
                 "limit", "seed", "%"):
        assert word in grammar, word


def test_fuzz_2000_strings_only_valid_or_named_value_errors() -> None:
    out = fi.fuzz_netem(2000)
    failures = {k: out[k] for k in fi.FAILURES if out[k]}
    assert not failures, out["examples"]
    assert out["grammar_rejected"] == 0, out["examples"]
    # both outcomes really occur: the mutations are not all harmless, nor all fatal
    assert out["valid"] > 500 and out["value_error"] > 500


@pytest.mark.parametrize("text", [
    "loss " + "1" * 20000 + "x",          # quadratic backtracking once made this a hang
    "delay 1e99999999999999999999ms",     # beyond Decimal's exponent: was InvalidOperation
    "limit " + "9" * 5000,                # beyond int()'s 4300 digits: message named nothing
    "rate 1\u212abit",                    # Kelvin sign: str.lower() made it "kbit"
])
def test_found_by_the_fuzz(text: str) -> None:
    assert fi.judge(text) == ("value_error", "")


def test_judge_flags_what_is_not_a_named_value_error() -> None:
    assert fi.names_a_token("netem: bad time '5x' after 'delay'", "delay 5x")
    assert not fi.names_a_token("Exceeds the limit (4300 digits)", "limit 99")
    assert fi.judge("delay 1ms 1ms distribution normal")[0] == "valid"


def test_tiny_exponents_read_as_zero_and_huge_as_too_large() -> None:
    assert Netem.parse("delay 1e-99999999999999999999s") == Netem()
    with pytest.raises(ValueError, match="too large"):
        Netem.parse("rate 1e99999999999999999999bit")


def test_netem_fields_and_dilation_check_types_and_ranges() -> None:
    for kwargs in ({"delay_ns": 1.5}, {"limit": "5"}, {"ecn": 1}, {"loss": 5},
                   {"duplicate": "1"}, {"gap": True}):
        with pytest.raises(TypeError, match=next(iter(kwargs))):
            Netem(**kwargs)
    for kwargs in ({"delay_ns": 2**63}, {"rate_bps": 2**70}, {"limit": 2**32},
                   {"packet_overhead": 2**31}, {"seed": 2**64}):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            Netem(**kwargs)
    with pytest.raises(ValueError, match="dilation"):
        Netem.parse("delay 1s").scaled(1e300)  # would overflow a float product
    with pytest.raises(ValueError, match="dilation"):
        Topology.build(2, nic="delay 1ms").scaled(float("nan"))


def test_topology_errors_name_the_argument() -> None:
    with pytest.raises(ValueError, match="^nic: netem: unknown keyword 'bogus'"):
        Topology.build(2, nic="bogus")
    with pytest.raises(TypeError, match="^intra: "):
        Topology.build(2, intra=5)
    with pytest.raises(TypeError, match="^links must"):
        Topology.build(2, links=5)
    with pytest.raises(TypeError, match=r"^links\[0->1\]: "):
        Topology.build(2, links={(0, 1): 5})
    with pytest.raises(ValueError, match="^CLUSTERLAB_NIC: "):
        Topology.from_env(2, {"CLUSTERLAB_NIC": "delay -1ms"})
    with pytest.raises(ValueError, match="^CLUSTERLAB_LINKS: "):
        Topology.from_env(2, {"CLUSTERLAB_LINKS": "0->5=delay 1ms"})


def test_bad_argument_rows_without_a_cluster() -> None:
    rows = fi.bad_arguments(run_cluster=False)
    assert len(rows) > 150
    by = {(r["target"], r["argument"], r["value"]): r for r in rows}
    assert by[("Topology.build", "nic", "'bogus 1'")]["ok"]
    assert by[("Netem.parse", "text", "None")]["error"] == "TypeError"
    assert all(r["leftover_processes"] == 0 and r["leftover_files"] == 0 for r in rows)
    # the table is honest: an accepted bad value is a row that is not ok
    assert all(not r["ok"] for r in rows if r["error"] is None)


def test_checks_shape() -> None:
    rows, checks = fi.checks(quick=True)
    assert rows[0]["kind"] == "netem_fuzz" and rows[0]["generated"] == fi.QUICK_COUNT
    assert all(set(c) == {"name", "target", "measured", "ok"} for c in checks)
    assert all(c["name"].startswith("input: ") for c in checks)
