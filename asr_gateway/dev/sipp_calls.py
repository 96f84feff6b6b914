"""Real SIP calls with sipp (Debian's ``sip-tester``) for the demo, end-to-end tests and benchmarks.

sipp plays the PBX: it sends an INVITE offering one codec (``sendrecv`` for a plain call: a
``sendonly`` offer means hold, which pauses the RTP inactivity timer), replays a pcap of RTP packets to the
port our SDP answer names (``play_pcap_audio``), waits, and hangs up (or, to test RTP
timeouts, vanishes without a BYE). ``write_rtp_pcap`` turns 16-bit PCM into such a pcap
(20 ms packets, optionally followed by RFC 4733 key presses), and ``scenario_xml`` writes a
plain or SIPREC (two labelled streams, rs-metadata) call scenario. A codec is chosen by the
payload type it is sent as; codecs, rtpmap lines and encoders are those of ``rtp.codecs``
(``sent_codec``: a dynamic codec is sent as the number our own offers give it).

sipp's ``play_pcap_audio`` only feeds the first m-line. For the second SIPREC stream the
scenario logs the port of our answer's second m-line (``<ereg>`` + ``<log>``) and
``place_call`` streams that leg itself, paced at 20 ms per packet. An SRTP call
(``srtp``: RTP/SAVP with an SDES ``a=crypto`` line) is streamed the same way, each packet
protected by libsrtp (``rtp.srtp.SrtpSender``), since sipp cannot encrypt a pcap.
"""

from __future__ import annotations

import asyncio
import base64
import re
import shutil
import socket
import struct
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import soxr

from asr_gateway.dev.local_redis import free_tcp_port
from rtp.codecs import Codec, codec, sent_codec, telephone_events
from rtp.dtmf import KEYS
from rtp.srtp import SrtpKeys, SrtpSender

PACKET_MS = 20
PACKET_S = PACKET_MS / 1000
PCMU, PCMA, G722 = (codec(name).payload_type for name in ("PCMU", "PCMA", "G722"))
"""Payload types as the senders send them (``rtp.codecs.Codec.payload_type``)."""
KEY_PACKETS = 5  # a key press: 100 ms of event packets, then its End packet three times
SECOND_LEG_MARK = "SECOND_LEG_PORT"
ANSWERED_MARK = "CALL_ANSWERED"
FIRST_LEG_MARK = "FIRST_LEG_PORT"
BIND_ATTEMPTS = 5
# sipp's messages when a port it was given is taken before it binds it (it exits before any call)
_STARTUP_BIND_FAILURE = re.compile(
    r"Unable to bind main socket|Unable to bind UDP socket|Can't bind media raw socket"
    r"|Unable to bind (?:audio|video) RTP socket"  # its -mp ports, bound at start-up too
)
# sipp's error file, for a call whose INVITE got a final error response (503 from a full node)
# instead of the scenario's next expected message
_REJECTED = re.compile(
    r"Aborting call on unexpected message for Call-Id '([^']+)': [^\n]*?received 'SIP/2\.0 ([3-6]\d\d) "
)


def _ip_checksum(header: bytes) -> int:
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _payload(pcm: np.ndarray, sample_rate: int, sent: Codec) -> bytes:
    """The whole recording encoded with ``sent``'s encoder, at its sample rate."""
    if sent.make_encoder is None:
        raise ValueError(f"codec {sent.name} carries no audio to send")
    if sample_rate != sent.sample_rate:
        pcm = soxr.resample(np.asarray(pcm, dtype=np.float32), sample_rate, sent.sample_rate)
    samples = np.clip(np.asarray(pcm, dtype=np.float64), -32768, 32767).astype(np.int16)
    return sent.make_encoder().encode(samples)


def rtp_packets(pcm: np.ndarray, sample_rate: int, payload_type: int = PCMU, ssrc: int = 0x1234,
                keys: str = "") -> list[bytes]:  # fmt: skip
    """``pcm`` (int16-range mono, any rate) as RTP packets of 20 ms in the codec sent as
    ``payload_type`` (``rtp.codecs.sent_codec``), then ``keys`` (``0-9*#A-D``) as RFC 4733 events
    at the same clock (``rtp.codecs.telephone_events``)."""
    sent = sent_codec(payload_type)
    payload = _payload(pcm, sample_rate, sent)
    ticks = sent.clock_rate * PACKET_MS // 1000  # per packet
    size = sent.payload_bytes(ticks)
    events = telephone_events(sent).payload_type
    packets = [
        struct.pack("!BBHII", 0x80, payload_type, i & 0xFFFF, i * ticks, ssrc) + payload[i * size : (i + 1) * size]
        for i in range(len(payload) // size)
    ]
    for key in keys:
        if key not in KEYS:
            raise ValueError(f"not a DTMF key: {key!r} (use 0-9 * # A-D)")
        start = len(packets) * ticks
        for n in range(KEY_PACKETS + 3):
            end = n >= KEY_PACKETS
            duration = ticks * min(n + 1, KEY_PACKETS)
            event = struct.pack("!BBH", KEYS.index(key), (0x80 if end else 0) | 10, duration)
            marker = 0x80 if n == 0 else 0
            header = struct.pack("!BBHII", 0x80, marker | events, len(packets) & 0xFFFF, start, ssrc)
            packets.append(header + event)
    return packets


def write_rtp_pcap(
    path: Path, pcm: np.ndarray, sample_rate: int, payload_type: int = PCMU, ssrc: int = 0x1234, keys: str = ""
) -> float:
    """Write ``pcm`` (int16-range mono) as RTP packets 20 ms apart (``rtp_packets``); returns the duration in s."""
    packets = rtp_packets(pcm, sample_rate, payload_type, ssrc, keys)
    out = bytearray(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))  # pcap header, Ethernet
    for i, rtp in enumerate(packets):
        udp = struct.pack("!HHHH", 40000, 40000, 8 + len(rtp), 0) + rtp
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), i & 0xFFFF, 0, 64, 17, 0,
                         bytes([127, 0, 0, 1]), bytes([127, 0, 0, 1]))  # fmt: skip
        ip = ip[:10] + struct.pack("!H", _ip_checksum(ip)) + ip[12:]
        frame = b"\x00" * 12 + b"\x08\x00" + ip + udp
        usec = i * 20_000
        out += struct.pack("<IIII", usec // 1_000_000, usec % 1_000_000, len(frame), len(frame)) + frame
    path.write_bytes(bytes(out))
    return len(packets) * PACKET_S


_HEADERS = """Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
From: {from_name} <sip:{from_user}@[local_ip]:[local_port]{from_uri_params}>;tag=[pid]SIPpTag00[call_number]
To: <sip:{to_user}@[remote_ip]:[remote_port]>{to_tag}
Call-ID: [call_id]
CSeq: {cseq} {method}
Contact: <sip:{from_user}@[local_ip]:[local_port]>{contact_params}
Max-Forwards: 70"""

_SDP_PLAIN = """v=0
o=pbx 1 1 IN IP[local_ip_type] [local_ip]
s=-
c=IN IP[media_ip_type] [media_ip]
t=0 0
m=audio [media_port] RTP/AVP {pt} {events}
a=rtpmap:{pt} {rtpmap}
a=rtpmap:{events} {events_rtpmap}
a=sendrecv
"""

_SIPREC_BODY = """--hotline-boundary
Content-Type: application/sdp

v=0
o=src 1 1 IN IP[local_ip_type] [local_ip]
s=-
c=IN IP[media_ip_type] [media_ip]
t=0 0
m=audio [media_port] RTP/AVP {pt}
a=rtpmap:{pt} {rtpmap}
a=label:1
a=sendonly
m=audio [media_port+2] RTP/AVP {pt}
a=rtpmap:{pt} {rtpmap}
a=label:2
a=sendonly

--hotline-boundary
Content-Type: application/rs-metadata+xml
Content-Disposition: recording-session

<?xml version="1.0" encoding="UTF-8"?>
<recording xmlns="urn:ietf:params:xml:ns:recording:1">
  <datamode>complete</datamode>
  <session session_id="hotlinesess1"><sipSessionID>[call_id]</sipSessionID></session>
  <participant participant_id="p1"><nameID aor="sip:{caller}@citizen.example"><name>caller</name></nameID></participant>
  <participant participant_id="p2"><nameID aor="sip:{agent}@pbx.example"><name>agent</name></nameID></participant>
  <stream stream_id="s1" session_id="hotlinesess1"><label>1</label></stream>
  <stream stream_id="s2" session_id="hotlinesess1"><label>2</label></stream>
  <participantstreamassoc participant_id="p1"><send>s1</send></participantstreamassoc>
  <participantstreamassoc participant_id="p2"><send>s2</send></participantstreamassoc>
</recording>
--hotline-boundary--
"""


def _message(method: str, cseq: int, body: str = "", content_type: str = "", extra: str = "", **names: str) -> str:
    to_tag = "" if method == "INVITE" else "[peer_tag_param]"
    contact_params = names.pop("contact_params", "")
    head = f"{method} sip:{names['to_user']}@[remote_ip]:[remote_port] SIP/2.0\n" + _HEADERS.format(
        cseq=cseq, method=method, to_tag=to_tag, contact_params=contact_params, **names
    )
    if extra:
        head += "\n" + extra
    if body:
        head += f"\nContent-Type: {content_type}\nContent-Length: [len]\n\n{body}"
    else:
        head += "\nContent-Length: 0\n\n"
    return head


def _along_route_set(request: str) -> str:
    """An in-dialog request sent to the answer's Contact along the Record-Route set (``[next_url]``,
    ``[routes]``), as a call through a proxy needs."""
    request_line, _, rest = request.partition("\n")
    method = request_line.split(" ", 1)[0]
    return f"{method} [next_url] SIP/2.0\n[routes]\n" + rest


HANGUP_AFTER_AUDIO_S = 1.0
"""A call hangs up this long after its audio has been sent."""


def scenario_xml(seconds: float, payload_type: int = PCMU, siprec: bool = False, to_user: str = "12345",
                 from_user: str = "citizen", agent: str = "1001", hangup: bool = True,
                 media_delay_ms: int = 0, extra_headers: str = "", from_uri_params: str = "",
                 via_proxy: bool = False, srtp: SrtpKeys | None = None) -> str:  # fmt: skip
    """A sipp UAC scenario: INVITE, ACK, (wait ``media_delay_ms``,) play ``audio.pcap`` for
    ``seconds`` (+1 s), BYE.

    ``via_proxy``: the INVITE goes to a record-routing proxy (Kamailio); ACK and BYE follow the
    route set to the node that answered.

    ``extra_headers``: header lines (``X-Agent-Id: 1001``, one a line) added to the INVITE.
    ``from_uri_params``: parameters inside the From URI (CUCM built-in bridge:
    ``;x-nearend;x-refci=123``), on every request of the dialog.

    ``siprec``: logs ``SECOND_LEG_PORT <port>`` (the answer's second m-line) to sipp's log file.
    ``srtp``: a plain call offering RTP/SAVP with these keys; logs ``FIRST_LEG_PORT <port>``
    and plays nothing (``place_call`` sends the SRTP).
    ``hangup=False``: the caller vanishes after the audio, without a BYE.
    """
    rtpmap = sent_codec(payload_type).rtpmap
    names = {"from_name": "pbx", "from_user": from_user, "to_user": to_user, "from_uri_params": from_uri_params}
    if siprec:
        body = _SIPREC_BODY.format(pt=payload_type, rtpmap=rtpmap, caller=from_user, agent=agent)
        extra = "\n".join(line for line in ("Require: siprec", extra_headers.strip()) if line)
        invite = _message("INVITE", 1, body, "multipart/mixed;boundary=hotline-boundary", extra,
                          contact_params=";+sip.src", **names)  # fmt: skip
    else:
        events = telephone_events(sent_codec(payload_type))
        sdp = _SDP_PLAIN.format(pt=payload_type, rtpmap=rtpmap, events=events.payload_type, events_rtpmap=events.rtpmap)
        if srtp is not None:
            inline = base64.b64encode(srtp.key).decode("ascii")
            sdp = sdp.replace(" RTP/AVP ", " RTP/SAVP ").replace(
                "a=sendrecv", f"a=crypto:1 {srtp.suite} inline:{inline}\na=sendrecv"
            )
        invite = _message("INVITE", 1, sdp, "application/sdp", extra_headers.strip(), **names)
    ack = _message("ACK", 1, **names)
    bye = _message("BYE", 2, **names)
    if via_proxy:
        ack, bye = _along_route_set(ack), _along_route_set(bye)
    record_routes = ' rrs="true"' if via_proxy else ""
    log_answer = f'<action><log message="{ANSWERED_MARK}"/></action>'
    answered = f'<recv response="200" rtd="true"{record_routes}>{log_answer}</recv>'
    if siprec:
        answered = f"""<recv response="200" rtd="true"{record_routes}><action>
<ereg regexp="m=audio ([0-9]+)(.|\n)*m=audio ([0-9]+)" search_in="body" check_it="true" assign_to="m,p1,x,p2"/>
<ereg regexp="c=IN IP4 ([0-9.]+)" search_in="body" check_it="true" assign_to="c,addr"/>
<log message="{ANSWERED_MARK}"/>
<log message="{SECOND_LEG_MARK} [$p2] [$addr]"/>
</action></recv>
<Reference variables="m,p1,x,c"/>"""
    if srtp is not None:
        answered = f"""<recv response="200" rtd="true"{record_routes}><action>
<ereg regexp="m=audio ([0-9]+) RTP/SAVP" search_in="body" check_it="true" assign_to="m,p1"/>
<ereg regexp="c=IN IP4 ([0-9.]+)" search_in="body" check_it="true" assign_to="c,addr"/>
<log message="{FIRST_LEG_MARK} [$p1] [$addr]"/>
</action></recv>
<Reference variables="m,c"/>"""
    play = "" if srtp is not None else '<nop><action><exec play_pcap_audio="audio.pcap"/></action></nop>'
    ending = f"""<pause milliseconds="{int((seconds + HANGUP_AFTER_AUDIO_S) * 1000)}"/>
<send retrans="500"><![CDATA[
{bye}]]></send>
<recv response="200" crlf="true"/>"""
    if not hangup:
        ending = f'<pause milliseconds="{int(seconds * 1000) + 200}"/>'
    return f"""<?xml version="1.0" encoding="ISO-8859-1" ?>
<!DOCTYPE scenario SYSTEM "sipp.dtd">
<scenario name="hotline-asr call">
<send retrans="500"><![CDATA[
{invite}]]></send>
<recv response="100" optional="true"/>
<recv response="180" optional="true"/>
{answered}
<send><![CDATA[
{ack}]]></send>
{f'<pause milliseconds="{media_delay_ms}"/>' if media_delay_ms > 0 else ""}
{play}
{ending}
</scenario>
"""


@dataclass(frozen=True)
class CallResult:
    returncode: int
    errors: str
    answered: bool | None = None
    """``place_call``: whether a 200 answered the INVITE (a call may be answered and still fail later)."""
    rejected: Mapping[str, int] = field(default_factory=dict)
    """``place_calls``: Call-ID -> the error status (3xx-6xx, e.g. 503: the node refused it) that
    answered the call's INVITE instead of a 200 (``rejected_calls``)."""


def rejected_calls(errors: str) -> dict[str, int]:
    """Call-ID -> error status of each call that sipp aborted because an error response (3xx-6xx)
    came instead of the answer it expected, from sipp's error output (``-trace_err``)."""
    return {match.group(1): int(match.group(2)) for match in _REJECTED.finditer(errors)}


def pinned(cpus: Collection[int] | None) -> list[str]:
    """The command prefix that runs a program on ``cpus`` only (``taskset -c``; [] for None)."""
    if cpus is None:
        return []
    taskset = shutil.which("taskset")
    if taskset is None:
        raise FileNotFoundError("taskset not found: install the Debian package util-linux to pin cores")
    return [taskset, "-c", ",".join(str(cpu) for cpu in sorted(cpus))]


def sipp_path() -> str:
    path = shutil.which("sipp")
    if path is None:
        raise FileNotFoundError("sipp not found: install the Debian package sip-tester (make setup does)")
    return path


async def place_call(workdir: Path, sip_port: int, pcm: np.ndarray, sample_rate: int, *,
                     payload_type: int = PCMU, siprec: bool = False, second_pcm: np.ndarray | None = None,
                     hangup: bool = True, host: str = "127.0.0.1", timeout_s: float | None = None,
                     call_tag: str | None = None, media_delay_ms: int = 0, keys: str = "",
                     via_proxy: bool = False, target_host: str | None = None,
                     srtp: SrtpKeys | None = None, srtp_send_key: bytes | None = None,
                     **names: str) -> CallResult:  # fmt: skip
    """One sipp call that streams ``pcm`` over RTP to our service, then hangs up.

    sipp sends from ``host`` to ``target_host`` (default: ``host``) at ``sip_port``;
    ``via_proxy``: that is a record-routing proxy in front of the service (``scenario_xml``).

    A SIPREC call streams ``second_pcm`` (default: ``pcm``) on its second leg;
    ``hangup=False`` leaves without a BYE; ``call_tag`` starts the SIP Call-ID (``TAG-...``),
    so the call's events can be found by their ``sip_call_id``; ``media_delay_ms`` holds the
    RTP back after the ACK (the leg is open, nothing has latched it yet); ``keys`` are sent as
    RFC 4733 key presses after the audio. ``srtp`` offers RTP/SAVP with those keys and sends
    the audio as SRTP protected with ``srtp_send_key`` (default: the offered key; another one
    plays a misconfigured peer).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    seconds = write_rtp_pcap(workdir / "audio.pcap", pcm, sample_rate, payload_type, keys=keys)
    scenario = workdir / "scenario.xml"
    xml = scenario_xml(
        seconds,
        payload_type,
        siprec,
        hangup=hangup,
        media_delay_ms=media_delay_ms,
        via_proxy=via_proxy,
        srtp=srtp,
        **names,
    )
    scenario.write_text(xml, encoding="latin-1")
    log_file = workdir / "sipp.log"

    def arguments(sip_local: int, media_base: int) -> list[str]:
        return [
            "-sf", str(scenario), "-m", "1", "-l", "1", "-i", host, "-p", str(sip_local), "-mp", str(media_base),
            "-timeout", f"{int(timeout_s or seconds + 30)}s", "-timeout_error", "-nostdin",
            "-trace_err", "-error_file", str(workdir / "errors.log"), "-trace_logs", "-log_file", str(log_file),
            *(["-cid_str", f"{call_tag}-%u-%p@%s"] if call_tag else []), f"{target_host or host}:{sip_port}",
        ]  # fmt: skip

    def second_leg(process: asyncio.subprocess.Process) -> asyncio.Task[None] | None:
        if siprec:
            packets = rtp_packets(pcm if second_pcm is None else second_pcm, sample_rate, payload_type, ssrc=0x5678)
            return asyncio.create_task(_stream_leg(log_file, SECOND_LEG_MARK, host, packets, process))
        if srtp is not None:
            protector = SrtpSender(SrtpKeys(srtp.suite, srtp_send_key or srtp.key))
            packets = [protector.protect(p) for p in rtp_packets(pcm, sample_rate, payload_type)]
            return asyncio.create_task(_stream_leg(log_file, FIRST_LEG_MARK, host, packets, process))
        return None

    returncode, stderr = await run_sipp(workdir, host, arguments, second_leg, log_file)
    answered = log_file.exists() and ANSWERED_MARK in log_file.read_text(errors="replace")
    return CallResult(returncode, stderr[-4000:], answered)


async def place_calls(workdir: Path, sip_port: int, pcm: np.ndarray, sample_rate: int, count: int, *,
                      rate_per_s: float = 10.0, payload_type: int = PCMU, host: str = "127.0.0.1",
                      call_tag: str = "load", total: int | None = None,
                      cpus: Collection[int] | None = None) -> CallResult:  # fmt: skip
    """``count`` concurrent plain calls from one sipp process (started at ``rate_per_s``), same audio.

    ``total`` (default ``count``): calls placed in all, never more than ``count`` at once; each
    that ends makes room for the next. Call-IDs are ``{call_tag}-{n}-...``; returncode 0 only
    when every call succeeded; ``rejected``: the calls an error response refused. ``cpus``: sipp
    runs on these cores only (``taskset``), apart from the service it loads.
    """
    total = count if total is None else total
    workdir.mkdir(parents=True, exist_ok=True)
    seconds = write_rtp_pcap(workdir / "audio.pcap", pcm, sample_rate, payload_type)
    scenario = workdir / "scenario.xml"
    scenario.write_text(scenario_xml(seconds, payload_type), encoding="latin-1")

    def arguments(sip_local: int, media_base: int) -> list[str]:
        return [
            "-sf", str(scenario), "-m", str(total), "-l", str(count), "-r", str(rate_per_s),
            "-i", host, "-p", str(sip_local), "-mp", str(media_base),
            "-timeout", f"{int(seconds + 30 + total / rate_per_s)}s", "-timeout_error", "-nostdin",
            "-trace_err", "-error_file", str(workdir / "errors.log"), "-cid_str", f"{call_tag}-%u-%p@%s",
            f"{host}:{sip_port}",
        ]  # fmt: skip

    returncode, stderr = await run_sipp(workdir, host, arguments, cpus=cpus)
    return CallResult(returncode, stderr[-4000:], rejected=rejected_calls(stderr))


async def run_sipp(
    workdir: Path,
    host: str,
    arguments: Callable[[int, int], list[str]],
    companion: Callable[[asyncio.subprocess.Process], asyncio.Task[None] | None] | None = None,
    log_file: Path | None = None,
    tcp: bool = False,
    cpus: Collection[int] | None = None,
) -> tuple[int, str]:
    """Run sipp in ``workdir`` with ``arguments(sip_port, media_base)``: ports free on ``host``
    (a TCP one for SIP when ``tcp``), ``-error_file errors.log`` expected among the arguments;
    with ``cpus``, under ``taskset`` on those cores only.
    Returns its exit status and its errors (stderr, then its error file).

    A port found free can be taken by another process before sipp binds it; sipp then exits at
    start-up, before sending anything, and is started again on other ports (up to
    ``BIND_ATTEMPTS`` times). ``companion`` starts a task beside each sipp process (a leg sipp
    cannot stream itself); it is cancelled when sipp ends.
    """
    attempt = 0
    while True:
        attempt += 1
        if log_file is not None:
            log_file.unlink(missing_ok=True)
        (workdir / "errors.log").unlink(missing_ok=True)
        process = await asyncio.create_subprocess_exec(
            *pinned(cpus), sipp_path(), *arguments(_free_port(host, tcp), _free_udp_ports(4, host)),
            cwd=workdir, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        task = companion(process) if companion is not None else None
        try:
            _, raw = await process.communicate()
        except asyncio.CancelledError:
            if process.returncode is None:
                process.kill()
                await process.wait()
            raise
        finally:
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        errors = raw.decode(errors="replace")
        error_log = workdir / "errors.log"
        if error_log.exists():
            errors += error_log.read_text(errors="replace")
        returncode = process.returncode or 0
        if returncode == 0 or not _STARTUP_BIND_FAILURE.search(errors) or attempt == BIND_ATTEMPTS:
            return returncode, errors


async def _stream_leg(
    log_file: Path, mark: str, host: str, packets: list[bytes], process: asyncio.subprocess.Process
) -> None:
    """Wait for sipp to log an m-line's port and the answer's connection address after ``mark``,
    then send ``packets`` there in real time from ``host`` (the address sipp's SDP gives)."""
    port, media_host = None, host
    while port is None and process.returncode is None:
        await asyncio.sleep(0.01)
        text = log_file.read_text(errors="replace") if log_file.exists() else ""
        found = re.search(mark + r" (\d+) ([0-9.]+)", text)
        port, media_host = (int(found.group(1)), found.group(2)) if found else (None, host)
    if port is None or port == 0:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((host, 0))
        sock.setblocking(False)
        start = time.monotonic()
        for index, packet in enumerate(packets):
            delay = start + index * PACKET_S - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            sock.sendto(packet, (media_host, port))


def _free_port(host: str, tcp: bool) -> int:
    return free_tcp_port(host) if tcp else _free_udp_ports(1, host)


def _free_udp_ports(count: int, host: str = "127.0.0.1") -> int:
    """The first of ``count`` consecutive UDP ports free on ``host`` (even when count > 1): probed on
    that very address, since a port taken on 127.0.0.100 is still free on 127.0.0.1."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.bind((host, 0))
            base = probe.getsockname()[1] & (~1 if count > 1 else ~0)
        sockets: list[socket.socket] = []
        try:
            for offset in range(count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                sockets.append(sock)
                sock.bind((host, base + offset))
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
        return base
    raise RuntimeError(f"no {count} free consecutive UDP ports on {host}")
