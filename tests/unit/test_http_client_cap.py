"""Who a connection counts against, and one client's share of the connection cap."""

from __future__ import annotations

from gateway.config import HeraldConfig
from gateway.http.server import HeadLimits, client_of


def test_an_ipv6_client_is_its_64_and_a_mapped_ipv4_one_its_address() -> None:
    # One host owns a whole /64: counting addresses would let it open 2**64 "clients".
    assert client_of(("2001:db8:1:2::1", 1, 0, 0)) == client_of(("2001:db8:1:2:ffff::9", 2, 0, 0))
    assert client_of(("2001:db8:1:3::1", 1, 0, 0)) != client_of(("2001:db8:1:2::1", 1, 0, 0))
    assert client_of(("::ffff:203.0.113.9", 1, 0, 0)) == client_of(("203.0.113.9", 2))
    assert client_of(("203.0.113.9", 1)) != client_of(("203.0.113.10", 1))


def test_one_client_gets_at_most_half_the_connections() -> None:
    def per_client(api: dict[str, int]) -> int | None:
        return HeadLimits.of(HeraldConfig.model_validate({"api": api}).api).max_per_client

    assert per_client({}) == 64
    assert per_client({"max_connections": 10}) == 5
    assert per_client({"max_connections": 1}) == 1
    assert per_client({"max_connections": 1000, "max_connections_per_client": 300}) == 300
