"""Admission at the SIP edge, sans-IO: the default ACL, per-source budgets (request rate,
transactions), trusted sources and trunks, open-setting warnings, and an answer for a request
whose handling fails outside its transaction."""

from __future__ import annotations

import ipaddress

import pytest

from asr_gateway.config import MetricsSettings
from calls.handler import CountingCallHandler
from calls.routing import Router, RoutesFile
from sip.actions import Action, SendMessage
from sip.config import SipSettings
from sip.message import Address, Response
from sip.uas import UasCore
from tests.test_sip_support import FakePorts, invite

PBX = Address("udp", "10.0.0.5", 5060)
FLOODER = Address("udp", "10.0.0.66", 5060)


def core_for(router: Router | None = None, **settings: object) -> UasCore:
    return UasCore(SipSettings.model_validate(settings), CountingCallHandler(), FakePorts(count=500), router)


def statuses(actions: list[Action]) -> list[int]:
    return [a.message.status for a in actions if isinstance(a, SendMessage) and isinstance(a.message, Response)]


def options(i: int) -> bytes:
    return invite(method="OPTIONS", body="", branch=f"z9hG4bK-o{i}", call_id=f"o{i}")


@pytest.mark.parametrize(
    ("host", "admitted"),
    [
        ("127.0.0.1", True),
        ("10.1.2.3", True),
        ("172.20.0.1", True),
        ("192.168.1.1", True),
        ("::1", True),
        ("::ffff:10.0.0.5", True),
        ("8.8.8.8", False),
        ("203.0.113.9", False),
        ("2001:db8::1", False),
    ],
)
def test_empty_acl_admits_loopback_and_private_sources_only(host: str, admitted: bool) -> None:
    core = core_for()
    answer = statuses(core.receive(options(1), Address("udp", host, 5060), 0.0))
    assert answer == ([200] if admitted else [403])


def test_explicit_any_acl_admits_public_sources_and_is_named_open() -> None:
    settings = SipSettings.model_validate({"acl_cidrs": ["0.0.0.0/0", "::/0"]})
    core = UasCore(settings, CountingCallHandler(), FakePorts())
    assert statuses(core.receive(options(1), Address("udp", "8.8.8.8", 5060), 0.0)) == [200]
    warnings = settings.open_settings()
    assert any("public sources" in w and "0.0.0.0/0" in w for w in warnings)
    assert any("no digest auth" in w for w in warnings)
    assert "admits 0.0.0.0/0, ::/0" in settings.acl_summary()


def test_defaults_name_no_open_setting() -> None:
    settings = SipSettings()
    assert settings.open_settings() == []
    assert "loopback and private sources only" in settings.acl_summary()
    with_auth = SipSettings.model_validate({"acl_cidrs": ["0.0.0.0/0"], "auth": {"users": {"pbx": "secret"}}})
    assert not any("digest" in w for w in with_auth.open_settings())
    assert MetricsSettings().open_settings() == []
    assert MetricsSettings(host="0.0.0.0").open_settings() == [
        "metrics.host 0.0.0.0 serves /metrics without auth beyond loopback"
    ]


def test_request_rate_covers_every_method_per_source() -> None:
    core = core_for(source_rate_per_s=10.0, source_burst=20)
    answered = [statuses(core.receive(options(i), FLOODER, 0.0)) for i in range(50)]
    assert answered.count([200]) == 20 and answered.count([]) == 30
    assert core.counters["flood.rate_dropped"] == 30
    assert statuses(core.receive(invite(), PBX, 0.0))[-1] == 200
    assert statuses(core.receive(options(99), FLOODER, 1.0)) == [200]  # 10 tokens back after 1 s


def test_transaction_budget_per_source_keeps_the_table_for_others() -> None:
    core = core_for(max_calls=16, source_rate_per_s=1e6, source_burst=1_000_000, source_max_transactions=100)
    answered = [statuses(core.receive(options(i), FLOODER, 0.0))[0] for i in range(500)]
    assert answered.count(200) == 100 and answered.count(503) == 400
    assert core.counters["flood.source_transactions"] == 400
    assert statuses(core.receive(invite(), PBX, 0.0))[-1] == 200
    core.on_timer(100.0)  # the flood's transactions end; its budget comes back
    assert statuses(core.receive(options(1000), FLOODER, 100.0)) == [200]


def test_one_source_holds_at_most_half_of_the_table() -> None:
    core = core_for(max_calls=1, source_rate_per_s=1e6, source_burst=1_000_000)  # table: 1 * 8 + 256 = 264
    answered = [statuses(core.receive(options(i), FLOODER, 0.0))[0] for i in range(400)]
    assert answered.count(200) == 132
    assert core.counters["dropped.tx_table_full"] == 0


def test_trusted_sources_and_trunks_get_larger_budgets() -> None:
    trunk = Router(RoutesFile.model_validate({"trunks": {"carrier": ["10.9.0.0/16"]}}))
    core = core_for(
        trunk,
        trusted_cidrs=["10.8.0.0/16"],
        trusted_budget_factor=5,
        source_rate_per_s=1e6,
        source_burst=1_000_000,
        source_max_transactions=10,
    )
    for n, (host, budget) in enumerate((("10.8.0.1", 50), ("10.9.0.1", 50), ("10.7.0.1", 10))):
        source = Address("udp", host, 5060)
        answered = [statuses(core.receive(options(100 * n + i), source, 0.0))[0] for i in range(60)]
        assert answered.count(200) == budget, host
    reloaded = Router(RoutesFile.model_validate({"trunks": {"carrier": ["10.7.0.0/16"]}}))
    core.router = reloaded
    assert core.admission.trusted("10.7.0.1") and not core.admission.trusted("10.9.0.1")
    assert core.invites.router is reloaded


def test_a_failure_outside_the_transaction_is_answered_500_and_frees_it(monkeypatch: pytest.MonkeyPatch) -> None:
    core = core_for()

    def broken(*args: object) -> list[Action]:
        raise RuntimeError("bug while answering")

    monkeypatch.setattr(core.handler, "has_capacity", broken)
    monkeypatch.setattr(core, "_abandon", broken)
    assert statuses(core.receive(invite(), PBX, 0.0)) == [500]
    assert core.counters["errors.internal"] == 2
    assert len(core._server_tx) == 0 and core.active_calls == 0 and not core._tx_by_source


def test_local_network_check() -> None:
    from sip.config import is_local_network

    assert is_local_network(ipaddress.ip_network("10.1.0.0/16"))
    assert not is_local_network(ipaddress.ip_network("0.0.0.0/0"))
    assert not is_local_network(ipaddress.ip_network("::/0"))


def test_siprec_metadata_in_an_unknown_encoding_gets_400_with_a_warning() -> None:
    from sip.multipart import BodyPart, build_multipart
    from tests.test_sip_fuzz import METADATA
    from tests.test_sip_support import OFFER_PCMU

    metadata = '<?xml version="1.0" encoding="x-no-such-encoding"?>' + METADATA
    sdp = OFFER_PCMU.replace("a=sendrecv", "a=label:1\r\na=sendonly")
    parts = [BodyPart("application/sdp", sdp.encode()), BodyPart("application/rs-metadata+xml", metadata.encode())]
    request = invite(
        extra="Require: siprec\r\n",
        body=build_multipart(parts, "b1").decode(),
        content_type="multipart/mixed;boundary=b1",
    )
    core = core_for()
    actions = core.receive(request, PBX, 0.0)
    assert statuses(actions) == [400]
    sent = actions[0]
    assert isinstance(sent, SendMessage)
    response = sent.message
    assert "unknown encoding" in (response.headers.get("Warning") or "")
    core.on_timer(100.0)
    assert len(core._server_tx) == 0
