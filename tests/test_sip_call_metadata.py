"""Call metadata off the INVITE: From/To, the dialled number, SIPREC session id, listed headers."""

from __future__ import annotations

import jsonschema
import pytest

from asr_gateway.bridge import _participant
from calls.handler import CountingCallHandler
from calls.metadata import MAX_VALUE_CHARS, CallMetadata
from calls.profile import Profile
from calls.routing import Router, RoutesFile
from kb_hooks import events as ev
from kb_hooks.types import CallContext
from sip.call_metadata import extract, uri_user
from sip.config import SipSettings
from sip.header_values import NameAddr
from sip.message import Request, parse
from sip.siprec import RecordingMetadata
from sip.uas import UasCore
from tests.test_sip_sdp_siprec import ACME_METADATA, RFC_METADATA
from tests.test_sip_support import SOURCE, FakePorts, invite

HEADERS = ["X-Agent-Id", "X-UCID", "User-to-User", "X-Queue"]


def request(extra: str = "", to_user: str = "4000") -> Request:
    message = parse(invite(extra=extra, to_user=to_user))
    assert isinstance(message, Request)
    return message


def metadata_of(
    message: Request, names: list[str] = HEADERS, recording: RecordingMetadata | None = None
) -> CallMetadata:
    from_party = NameAddr.parse(message.headers.get("From") or "")
    to = NameAddr.parse(message.headers.get("To") or "")
    return extract(message, from_party, to, names, recording)


@pytest.mark.parametrize(
    ("uri", "user"),
    [
        ("sip:4008001234@pbx.local", "4008001234"),
        ("sips:+8610123@pbx.local:5061;user=phone", "+8610123"),
        ("sip:alice:secret@pbx.local", "alice"),
        ("sip:%2B8610123@pbx.local", "+8610123"),
        ("tel:+86-10-6552-1234;phone-context=example.com", "+86-10-6552-1234"),
        ("TEL:95555", "95555"),
        ("sip:pbx.local", None),
        ("mailto:a@b", None),
        ("garbage", None),
    ],
)
def test_uri_user(uri: str, user: str | None) -> None:
    assert uri_user(uri) == user


def test_from_to_and_dialled_number() -> None:
    meta = metadata_of(request(to_user="95555"))
    assert (meta.from_uri, meta.from_name) == ("sip:alice@10.0.0.5", "Alice")
    assert (meta.to_uri, meta.to_name) == ("sip:95555@10.0.0.1", None)
    assert meta.dialled == "95555" and meta.request_uri == "sip:95555@10.0.0.1"
    assert meta.as_map() == {
        "from_uri": "sip:alice@10.0.0.5",
        "from_name": "Alice",
        "to_uri": "sip:95555@10.0.0.1",
        "dialled_number": "95555",
        "request_uri": "sip:95555@10.0.0.1",
    }


def test_display_names_with_quotes_and_escapes() -> None:
    message = request()
    message.headers.set("From", r'"Wang \"Xiao\" Ming, Ltd" <sip:wxm@pbx.local>;tag=1')
    message.headers.set("To", "Hotline <tel:+864008001234>")
    meta = metadata_of(message)
    assert meta.from_name == 'Wang "Xiao" Ming, Ltd'
    assert (meta.to_uri, meta.to_name) == ("tel:+864008001234", "Hotline")


def test_dialled_number_falls_back_to_the_to_user() -> None:
    message = request()
    message.uri = "sip:recorder.local"
    message.headers.set("To", "<tel:+861012345>")
    assert metadata_of(message).dialled == "+861012345"


def test_listed_headers_case_insensitive_cleaned_and_cut() -> None:
    extra = (
        "x-agent-id: 1001\r\n"
        "X-UCID: 00001002121700000001\r\n"
        "X-UCID: second-one-ignored\r\n"
        f"User-to-User: {'a' * (MAX_VALUE_CHARS + 50)};encoding=hex\r\n"
        "X-Other: not listed\r\n"
    )
    message = request(extra)
    message.headers.add("X-Queue", "  sales\x00\x1b[31m  ")
    meta = metadata_of(message)
    values = dict(meta.headers)
    assert values["X-Agent-Id"] == "1001"  # the name as listed, whatever the peer's spelling
    assert values["X-UCID"] == "00001002121700000001"
    assert values["User-to-User"] == "a" * MAX_VALUE_CHARS
    assert values["X-Queue"] == "sales[31m"
    assert "X-Other" not in meta.as_map()
    assert metadata_of(request(), names=HEADERS).headers == ()


@pytest.mark.parametrize(("xml", "session_id"), [(RFC_METADATA, None), (ACME_METADATA, "ZdW8Xj1mSr6uJ2cFzpj4Yw==")])
def test_siprec_session_id(xml: bytes, session_id: str | None) -> None:
    recording = RecordingMetadata.parse(xml)
    assert recording.session_id == session_id
    assert metadata_of(request(), recording=recording).siprec_session_id == session_id


def test_rfc7865_session_element() -> None:
    xml = RFC_METADATA.replace(b"<datamode>", b'<session session_id="hVpd7YQgRW2nD22h7q60JQ=="/><datamode>')
    assert RecordingMetadata.parse(xml).session_id == "hVpd7YQgRW2nD22h7q60JQ=="


def test_uas_hands_metadata_and_names_to_the_application() -> None:
    routes = RoutesFile(profiles={"default": Profile(metadata_headers=["X-Agent-Id", "X-UCID"])})
    handler = CountingCallHandler()
    core = UasCore(SipSettings(), handler, FakePorts(), Router(routes))
    core.receive(invite(extra="X-Agent-Id: 1001\r\nX-UCID: ucid-7\r\n"), SOURCE, 0.0)
    (call,) = handler.calls.values()
    assert call.metadata.as_map()["X-Agent-Id"] == "1001"
    assert call.metadata.as_map()["X-UCID"] == "ucid-7"
    (leg,) = handler.legs.values()
    assert (leg.aor, leg.name) == ("sip:alice@10.0.0.5", "Alice")
    participant = _participant(leg)
    started = ev.CallStarted(call=CallContext(call.call_id), participants=(participant,),
                             metadata=call.metadata.as_map()).to_json()  # fmt: skip
    jsonschema.validate({**started, "seq": 1}, ev.schema())
    assert started["participants"][0]["name"] == "Alice"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**started, "seq": 1, "metadata": {"X-Agent-Id": "x" * 300}}, ev.schema())
