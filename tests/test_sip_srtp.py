"""SDES-keyed SRTP in offer/answer (RFC 4568) and the route's ``srtp`` policy. Sans-IO: the
UAS core with a fake clock; the legs' unprotecting is tests/test_rtp_srtp.py."""

from __future__ import annotations

import base64
import logging
from pathlib import Path

import pytest

from asr_common.yamlconf import ConfigError
from calls.handler import CountingCallHandler
from calls.profile import Profile
from calls.routing import Router, RoutesFile, load_routes
from rtp.srtp import AWAITING_KEYS
from sip.actions import Action, SendMessage, StartMedia, UpdateMedia
from sip.config import SipSettings
from sip.header_values import NameAddr
from sip.message import Request
from sip.multipart import BodyPart, build_multipart
from sip.sdes import SdesError, parse_crypto, select_key
from sip.sdp import SessionDescription, SrtpPolicy
from sip.uas import UasCore
from tests.test_sip_fuzz import METADATA
from tests.test_sip_support import OFFER_PCMU, SOURCE, FakePorts, ack, invite
from tests.test_sip_uas import responses

KEY = bytes(range(100, 130))
INLINE = base64.b64encode(KEY).decode()
CRYPTO_80 = f"a=crypto:3 AES_CM_128_HMAC_SHA1_80 inline:{INLINE}|2^31|1:4\r\n"
CRYPTO_32 = f"a=crypto:7 AES_CM_128_HMAC_SHA1_32 inline:{INLINE}\r\n"
SAVP = OFFER_PCMU.replace("RTP/AVP", "RTP/SAVP")


def core_with(policy: SrtpPolicy) -> UasCore:
    routes = RoutesFile(profiles={"default": Profile(srtp=policy)})
    return UasCore(SipSettings(), CountingCallHandler(), FakePorts(), Router(routes))


def starts(actions: list[Action]) -> list[StartMedia]:
    return [a for a in actions if isinstance(a, StartMedia)]


def test_crypto_lines_parse_and_the_80_bit_tag_is_preferred() -> None:
    key = parse_crypto(CRYPTO_80[len("a=crypto:") :].strip())
    assert (key.tag, key.suite, key.keys.key, key.keys.mki_length) == (3, "AES_CM_128_HMAC_SHA1_80", KEY, 4)
    both = [line[len("a=crypto:") :].strip() for line in (CRYPTO_32, CRYPTO_80)]
    assert select_key(both).tag == 3
    unknown = f"1 AEAD_AES_256_GCM inline:{INLINE}"
    assert select_key([unknown, both[0]]).tag == 7


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("x AES_CM_128_HMAC_SHA1_80 inline:abc", "is not '<tag> <suite> inline:<key>'"),
        (f"1 F8_128_HMAC_SHA1_80 inline:{INLINE}", "suite not supported"),
        (f"1 AES_CM_128_HMAC_SHA1_80 inline:{INLINE} KDR=1", "session parameters"),
        (f"1 AES_CM_128_HMAC_SHA1_80 inline:{INLINE}|1:4;inline:{INLINE}|2:4", "more than one key"),
        (f"1 AES_CM_128_HMAC_SHA1_80 uri:{INLINE}", "not inline"),
        ("1 AES_CM_128_HMAC_SHA1_80 inline:@@@@", "not base64"),
        (f"1 AES_CM_128_HMAC_SHA1_80 inline:{INLINE[:-8]}", "the suite needs 30"),
        (f"1 AES_CM_128_HMAC_SHA1_80 inline:{INLINE}|2^20|1:200", "MKI length 200"),
        (f"1 AES_CM_128_HMAC_SHA1_80 inline:{INLINE}|forever", "neither a key lifetime"),
        (f"1 AES_CM_128_HMAC_SHA1_80 inline:{INLINE}|1|2|3", "too many"),
    ],
)
def test_malformed_crypto_lines_say_what_is_wrong_without_the_key(value: str, problem: str) -> None:
    with pytest.raises(SdesError) as caught:
        parse_crypto(value)
    assert problem in str(caught.value) and caught.value.status_hint == 488
    assert INLINE[:16] not in str(caught.value)


def test_optional_answers_savp_with_our_own_key_and_the_leg_gets_theirs() -> None:
    core = core_with("optional")
    actions = core.receive(invite(body=SAVP + CRYPTO_32 + CRYPTO_80), SOURCE, 0.0)
    ok = responses(actions)[-1]
    assert ok.status == 200
    (media,) = SessionDescription.parse(ok.body).media
    assert media.proto == "RTP/SAVP" and media.port != 0
    (ours,) = media.crypto
    tag, suite, inline = ours.split()
    assert (tag, suite) == ("3", "AES_CM_128_HMAC_SHA1_80")
    assert len(base64.b64decode(inline.removeprefix("inline:"))) == 30 and INLINE not in ok.body.decode()
    (start,) = starts(actions)
    assert start.srtp is not None and (start.srtp.suite, start.srtp.key, start.srtp.mki_length) == (
        "AES_CM_128_HMAC_SHA1_80",
        KEY,
        4,
    )
    again = core_with("optional").receive(invite(body=SAVP + CRYPTO_80), SOURCE, 0.0)
    assert SessionDescription.parse(responses(again)[-1].body).media[0].crypto != [ours], "a fresh key per answer"


def test_optional_takes_plain_rtp_too_and_required_refuses_it_with_a_warning() -> None:
    (plain,) = starts(core_with("optional").receive(invite(), SOURCE, 0.0))
    assert plain.srtp is None
    refused = responses(core_with("required").receive(invite(), SOURCE, 0.0))[-1]
    assert refused.status == 488
    assert (refused.headers.get("Warning") or "").startswith('302 hotline-asr "plain RTP/AVP is not taken')
    (start,) = starts(core_with("required").receive(invite(body=SAVP + CRYPTO_32), SOURCE, 0.0))
    assert start.srtp is not None and start.srtp.suite == "AES_CM_128_HMAC_SHA1_32"


def test_required_with_avp_and_savp_lines_takes_the_savp_one() -> None:
    body = SAVP + CRYPTO_80 + "m=audio 40002 RTP/AVP 0\r\na=sendrecv\r\n"
    actions = core_with("required").receive(invite(body=body), SOURCE, 0.0)
    savp, avp = SessionDescription.parse(responses(actions)[-1].body).media
    assert savp.port != 0 and avp.port == 0 and not avp.crypto
    (start,) = starts(actions)
    assert start.srtp is not None and start.remote == ("10.0.0.5", 40000)


@pytest.mark.parametrize(
    ("crypto", "problem"),
    [
        ("", "has no a=crypto line"),
        ("a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:dG9vIHNob3J0\r\n", "the suite needs 30"),
        ("a=crypto:1 AES_256_CM_HMAC_SHA1_80 inline:x\r\n", "suite not supported"),
    ],
)
def test_savp_without_a_usable_key_is_refused_488_and_opens_nothing(crypto: str, problem: str) -> None:
    handler = CountingCallHandler()
    routes = RoutesFile(profiles={"default": Profile(srtp="optional")})
    core = UasCore(SipSettings(), handler, FakePorts(), Router(routes))
    actions = core.receive(invite(body=SAVP + crypto), SOURCE, 0.0)
    refused = responses(actions)[-1]
    assert refused.status == 488 and problem in (refused.headers.get("Warning") or "")
    assert handler.legs == {} and core.active_calls == 0


def test_reinvite_with_a_new_key_updates_the_leg() -> None:
    core = core_with("optional")
    actions = core.receive(invite(body=SAVP + CRYPTO_80), SOURCE, 0.0)
    tag = NameAddr.parse(responses(actions)[-1].headers.get("To") or "").tag or ""
    core.receive(ack(to_tag=tag), SOURCE, 0.1)
    new_key = bytes(range(30))
    reoffer = SAVP + f"a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:{base64.b64encode(new_key).decode()}\r\n"
    actions = core.receive(invite(to_tag=tag, cseq=2, branch="z9hG4bK-re", body=reoffer), SOURCE, 1.0)
    (update,) = [a for a in actions if isinstance(a, UpdateMedia)]
    assert update.srtp is not None and update.srtp.key == new_key


def test_delayed_offer_on_a_required_route_offers_savp_and_takes_the_key_from_the_ack() -> None:
    core = core_with("required")
    actions = core.receive(invite(body=""), SOURCE, 0.0)
    (start,) = starts(actions)
    assert start.srtp == AWAITING_KEYS, "SRTP sent before the ACK is dropped, not decoded as plain RTP"
    ok = responses(actions)[-1]
    (offered,) = SessionDescription.parse(ok.body).media
    assert offered.proto == "RTP/SAVP" and [c.split()[1] for c in offered.crypto] == [
        "AES_CM_128_HMAC_SHA1_80",
        "AES_CM_128_HMAC_SHA1_32",
    ]
    tag = NameAddr.parse(ok.headers.get("To") or "").tag or ""
    answer = (
        "v=0\r\no=- 7 1 IN IP4 10.0.0.5\r\ns=-\r\nc=IN IP4 10.0.0.5\r\nt=0 0\r\n"
        f"m=audio 41000 RTP/SAVP 0\r\n{CRYPTO_32}a=sendonly\r\n"
    )
    actions = core.receive(invite(method="ACK", to_tag=tag, body=answer, branch="z9hG4bK-a"), SOURCE, 0.1)
    (update,) = [a for a in actions if isinstance(a, UpdateMedia)]
    assert update.srtp is not None and update.srtp.key == KEY and update.srtp.suite.endswith("_32")


def test_srtp_policy_loads_from_yaml_and_a_bad_value_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "routes.yaml"
    path.write_text("profiles:\n  default:\n    srtp: required\n  pbx:\n    srtp: off\n", encoding="utf-8")
    router = load_routes(path)
    assert router.routes.profiles["default"].srtp == "required" and router.routes.profiles["pbx"].srtp == "off"
    path.write_text("profiles:\n  default:\n    srtp: always\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"routes.yaml:3 profiles.default.srtp"):
        load_routes(path)


def test_keys_never_reach_logs_or_reprs(caplog: pytest.LogCaptureFixture) -> None:
    """A whole SRTP call (offer, re-INVITE, BYE) with DEBUG logging: neither the peer's key
    (base64 or bytes) nor ours appears in any log record or in the repr of any action."""
    caplog.set_level(logging.DEBUG)
    core = core_with("optional")
    actions = core.receive(invite(body=SAVP + CRYPTO_80), SOURCE, 0.0)
    ours = SessionDescription.parse(responses(actions)[-1].body).media[0].crypto[0].split()[2].removeprefix("inline:")
    tag = NameAddr.parse(responses(actions)[-1].headers.get("To") or "").tag or ""
    actions += core.receive(ack(to_tag=tag), SOURCE, 0.1)
    actions += core.receive(invite(to_tag=tag, cseq=2, branch="z9hG4bK-re", body=SAVP + CRYPTO_32), SOURCE, 1.0)
    actions += core.receive(invite(method="BYE", to_tag=tag, cseq=3, branch="z9hG4bK-b", body=""), SOURCE, 2.0)
    call = core.call(starts(actions)[0].call.call_id)
    texts = [caplog.text, repr([a for a in actions if not hasattr(a, "message")]), repr(call)]
    texts.append(repr(SessionDescription.parse(SAVP + CRYPTO_80)))
    for text in texts:
        for secret in (INLINE, KEY.hex(), repr(KEY)[2:-1], ours):
            assert secret not in text


def test_an_ack_answer_without_a_usable_key_ends_the_call_with_a_reason() -> None:
    core = core_with("required")
    ok = responses(core.receive(invite(body=""), SOURCE, 0.0))[-1]
    tag = NameAddr.parse(ok.headers.get("To") or "").tag or ""
    answer = (
        "v=0\r\no=- 7 1 IN IP4 10.0.0.5\r\ns=-\r\nc=IN IP4 10.0.0.5\r\nt=0 0\r\n"
        "m=audio 41000 RTP/SAVP 0\r\na=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:c2hvcnQ=\r\na=sendonly\r\n"
    )
    actions = core.receive(invite(method="ACK", to_tag=tag, body=answer, branch="z9hG4bK-a"), SOURCE, 0.1)
    (bye,) = [a.message for a in actions if isinstance(a, SendMessage) and isinstance(a.message, Request)]
    assert bye.method == "BYE" and "the suite needs 30" in (bye.headers.get("Reason") or "")
    assert core.counters["calls.answer_refused"] == 1


def test_siprec_with_srtp_streams_gets_a_key_per_labelled_stream() -> None:
    """SIPREC from an SBC as SRTP: each labelled RTP/SAVP stream is answered with its own
    crypto line and its leg unprotects with that stream's key."""
    other = bytes(range(50, 80))
    sdp = (
        "v=0\r\no=- 1 1 IN IP4 10.0.0.5\r\ns=-\r\nc=IN IP4 10.0.0.5\r\nt=0 0\r\n"
        f"m=audio 40000 RTP/SAVP 0\r\n{CRYPTO_80}a=label:1\r\na=sendonly\r\n"
        f"m=audio 40002 RTP/SAVP 0\r\na=crypto:1 AES_CM_128_HMAC_SHA1_32 inline:{base64.b64encode(other).decode()}\r\n"
        "a=label:2\r\na=sendonly\r\n"
    )
    body = build_multipart(
        [BodyPart("application/sdp", sdp.encode()), BodyPart("application/rs-metadata+xml", METADATA.encode())], "fz"
    ).decode()
    core = core_with("required")
    actions = core.receive(
        invite(extra="Require: siprec\r\n", body=body, content_type="multipart/mixed;boundary=fz"), SOURCE, 0.0
    )
    ok = responses(actions)[-1]
    assert ok.status == 200
    first, second = SessionDescription.parse(ok.body).media
    assert [c.split()[:2] for c in first.crypto + second.crypto] == [
        ["3", "AES_CM_128_HMAC_SHA1_80"],
        ["1", "AES_CM_128_HMAC_SHA1_32"],
    ]
    keys = {start.leg.label: start.srtp.key for start in starts(actions) if start.srtp is not None}
    assert keys == {"1": KEY, "2": other}
