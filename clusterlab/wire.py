"""TCP on the emulated wire: the numbers every timing model of clusterlab shares.

A message is cut into segments of `SEGMENT_BYTES` of payload (GSO-sized, as TCP sends them
over loopback), each carrying `HEADER_BYTES` of headers on the wire. A lost segment is
resent by fast retransmit once `DUPTHRESH` later segments got through, otherwise after a
retransmission timeout of at least `RTO_MIN_NS`, doubling up to `RTO_MAX_NS`; after
`MAX_RETRANSMISSIONS` lost retransmissions TCP gives up. The link model (`clusterlab.link`),
the collective schedules (`clusterlab.schedule`), the simulator, the backend, the closed
forms and the experiments all take these from here, and the wire β from `wire_beta`.
"""

from __future__ import annotations

SEGMENT_BYTES = 65536  # payload per segment: a GSO-sized segment, as TCP sends over loopback
HEADER_BYTES = 66  # Ethernet 14 + IPv4 20 + TCP 20 + TCP timestamp option 12, per segment
DUPTHRESH = 3  # later segments that must arrive before a hole counts as lost (fast retransmit)
RTO_MIN_NS = 200_000_000  # Linux TCP_RTO_MIN
RTO_MAX_NS = 120_000_000_000  # Linux TCP_RTO_MAX: the backoff stops doubling there
MAX_RETRANSMISSIONS = 15  # Linux net.ipv4.tcp_retries2: then the connection times out


def segment_count(nbytes: int, *, segment_bytes: int = SEGMENT_BYTES) -> int:
    """Segments a message of `nbytes` is cut into (an empty message still sends one)."""
    return max(1, -(-int(nbytes) // segment_bytes))


def wire_seconds(nbytes: int, *, rate_bps: float, segment_bytes: int = SEGMENT_BYTES) -> float:
    """Time a message of `nbytes` of payload occupies a NIC of `rate_bps` bits/s, with the
    headers of every one of its segments (0 without a rate: an infinitely fast link)."""
    if not rate_bps:
        return 0.0
    wire = nbytes + HEADER_BYTES * segment_count(nbytes, segment_bytes=segment_bytes)
    return wire * 8 / rate_bps


def wire_beta(rate_bps: float, *, segment_bytes: int = SEGMENT_BYTES) -> float:
    """The wire β: seconds per payload byte on a NIC of `rate_bps` bits/s, headers included
    (8 / rate x (65536 + 66) / 65536 for full segments); 0 without a rate."""
    if not rate_bps:
        return 0.0
    return 8 / rate_bps * (segment_bytes + HEADER_BYTES) / segment_bytes
