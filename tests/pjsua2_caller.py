"""An independent SIP caller for interop tests: pjsua2 (PJSIP's own stack) places calls and plays WAVs.

Run as a subprocess (pjsua2's Endpoint is process-wide and owns native threads):

    python tests/pjsua2_caller.py --target sip:asr@127.0.0.1:5060 --codec PCMU --calls 2 a.wav b.wav

Each call plays one WAV (16-bit mono; the last one is reused when there are fewer WAVs than
calls) into its audio stream once its media is active, then hangs up (BYE) when the WAV has
ended plus ``--tail-ms``. The media path is kept free of processing so that the RTP carries the
WAV's samples exactly: null sound device, 8 kHz conference bridge (no resampling for 8 kHz WAVs),
no VAD, no echo canceller, and only the requested G.711 codec offered.

Prints one JSON line to stdout: {"ok": bool, "codec": ..., "calls": [per-call results], "error": ...}
and exits 0 when every call was answered (200), played its whole WAV and ended with our BYE;
otherwise exits 1 (2 for bad arguments) with the reason on stderr and in "error".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import wave
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pjsua2 as pj

CLOCK_RATE_HZ = 8000
CODEC_IDS = {"PCMU": "PCMU/8000/1", "PCMA": "PCMA/8000/1"}
# PJSUA_MAX_CALLS in the pjsua2-python wheel: a fifth call fails with PJ_ETOOMANY.
MAX_CALLS = 4
POLL_MS = 10


SAMPLES_PER_PACKET = CLOCK_RATE_HZ // 50  # 20 ms


class CallerError(Exception):
    """A failure the caller reports as its result (rather than a traceback)."""


@dataclass
class CallResult:
    """What one call went through, as seen by pjsua2."""

    index: int
    wav: str
    sip_call_id: str = ""
    status_codes: list[int] = field(default_factory=list)
    confirmed: bool = False
    media_active: bool = False
    played_samples: int = 0
    wav_samples: int = 0
    hung_up_by_us: bool = False
    disconnected: bool = False
    last_reason: str = ""
    error: str = ""


def wav_samples(path: Path) -> int:
    """The WAV's frame count; CallerError unless it is 16-bit mono (what pjmedia's player accepts)."""
    try:
        with wave.open(str(path), "rb") as reader:
            if reader.getnchannels() != 1 or reader.getsampwidth() != 2:
                raise CallerError(
                    f"{path}: {reader.getnchannels()} channel(s) of {8 * reader.getsampwidth()} bits; "
                    "pjmedia's player needs 16-bit mono"
                )
            if reader.getframerate() != CLOCK_RATE_HZ:
                print(
                    f"warning: {path} is {reader.getframerate()} Hz; pjmedia resamples it to {CLOCK_RATE_HZ} Hz",
                    file=sys.stderr,
                )
            return reader.getnframes()
    except (OSError, wave.Error, EOFError) as exc:
        raise CallerError(f"cannot read WAV {path}: {exc}") from exc


def describe(exc: pj.Error) -> str:
    """pjsua2's Error carries title, reason and status; str() of it is empty."""
    return f"{exc.title}: {exc.reason} (status {exc.status})"


class Call(pj.Call):
    """One outgoing call: records SIP progress; the main loop drives playback and hangup."""

    def __init__(self, account: pj.Account, result: CallResult) -> None:
        super().__init__(account)
        self.result = result
        self.player: pj.AudioMediaPlayer | None = None
        self.ended_at: float | None = None
        self.started_at: float | None = None

    def onCallState(self, prm: Any) -> None:
        info = self.getInfo()
        code = int(info.lastStatusCode)
        if code and (not self.result.status_codes or self.result.status_codes[-1] != code):
            self.result.status_codes.append(code)
        self.result.sip_call_id = info.callIdString
        if info.state == pj.PJSIP_INV_STATE_CONFIRMED:
            self.result.confirmed = True
        elif info.state == pj.PJSIP_INV_STATE_DISCONNECTED:
            self.result.disconnected = True
            self.result.last_reason = info.lastReason

    def onCallMediaState(self, prm: Any) -> None:
        """Start the WAV once audio is active; errors are recorded, as raising here would reach C."""
        if self.player is not None:
            return
        info = self.getInfo()  # keep it: info.media points into this object
        try:
            for media in info.media:
                if media.type == pj.PJMEDIA_TYPE_AUDIO and media.status == pj.PJSUA_CALL_MEDIA_ACTIVE:
                    self.result.media_active = True
                    player = pj.AudioMediaPlayer()
                    player.createPlayer(self.result.wav, pj.PJMEDIA_FILE_NO_LOOP)
                    player.startTransmit(self.getAudioMedia(media.index))
                    self.player = player
                    self.started_at = time.monotonic()
                    return
        except pj.Error as exc:
            self.result.error = f"cannot play {self.result.wav}: {describe(exc)}"


def make_endpoint(log_level: int) -> pj.Endpoint:
    """An Endpoint whose callbacks all run in our thread (libHandleEvents), with a plain media path."""
    endpoint = pj.Endpoint()
    endpoint.libCreate()
    config = pj.EpConfig()
    config.uaConfig.threadCnt = 0
    config.uaConfig.mainThreadOnly = True
    config.uaConfig.maxCalls = MAX_CALLS
    config.uaConfig.userAgent = "hotline-asr-interop-pjsua2"
    config.logConfig.level = log_level
    config.logConfig.consoleLevel = log_level
    config.medConfig.clockRate = CLOCK_RATE_HZ
    config.medConfig.sndClockRate = CLOCK_RATE_HZ
    config.medConfig.channelCount = 1
    config.medConfig.noVad = True
    config.medConfig.ecTailLen = 0
    endpoint.libInit(config)
    return endpoint


def restrict_codecs(endpoint: pj.Endpoint, codec: str) -> None:
    """Offer only ``codec``: priority 0 disables every other codec pjmedia knows."""
    wanted = CODEC_IDS[codec]
    known = [info.codecId for info in endpoint.codecEnum2()]
    if wanted not in known:
        raise CallerError(f"pjsua2 has no codec {wanted}; it knows {known}")
    for codec_id in known:
        endpoint.codecSetPriority(codec_id, 255 if codec_id == wanted else 0)


def make_account(
    endpoint: pj.Endpoint, sip_port: int, rtp_port: int, srtp: bool = False, tls: bool = False
) -> pj.Account:
    """A registration-free account whose SIP and RTP stay on loopback; with ``srtp``, SRTP
    mandatory with SDES keys (RTP/SAVP offers and answers); with ``tls``, SIP over TLS (the
    server's certificate is not verified: a loopback test peer)."""
    transport = pj.TransportConfig()
    transport.port = sip_port
    transport.boundAddress = "127.0.0.1"
    transport.publicAddress = "127.0.0.1"
    kind = pj.PJSIP_TRANSPORT_TLS if tls else pj.PJSIP_TRANSPORT_UDP
    transport_id = endpoint.transportCreate(kind, transport)
    endpoint.libStart()
    endpoint.audDevManager().setNullDev()
    local_port = endpoint.transportGetInfo(transport_id).localName.split(":")[-1]
    config = pj.AccountConfig()
    config.idUri = f"sip:pjsua2@127.0.0.1:{local_port}"
    config.sipConfig.transportId = transport_id
    config.mediaConfig.transportConfig.boundAddress = "127.0.0.1"
    config.mediaConfig.transportConfig.publicAddress = "127.0.0.1"
    config.mediaConfig.transportConfig.port = rtp_port
    if srtp:
        config.mediaConfig.srtpUse = pj.PJMEDIA_SRTP_MANDATORY
        config.mediaConfig.srtpSecureSignaling = 0
        config.mediaConfig.srtpOpt.keyings = pj.IntVector([pj.PJMEDIA_SRTP_KEYING_SDES])
    account = pj.Account()
    account.create(config)
    return account


def plan_calls(args: argparse.Namespace) -> list[CallResult]:
    """One result record per call with its WAV (the last WAV serves the calls beyond the list)."""
    results = [CallResult(index=i, wav=args.wav[min(i, len(args.wav) - 1)]) for i in range(args.calls)]
    for result in results:
        result.wav_samples = wav_samples(Path(result.wav))
    return results


def run_calls(endpoint: pj.Endpoint, account: pj.Account, results: list[CallResult], args: argparse.Namespace) -> None:
    """Place the calls, play, hang up; ``results`` fill in as the calls progress."""
    calls: list[Call] = []
    try:
        for result in results:
            call = Call(account, result)
            params = pj.CallOpParam(True)
            params.opt.audioCount = 1
            params.opt.videoCount = 0
            if args.delayed_offer:
                params.opt.flag |= pj.PJSUA_CALL_NO_SDP_OFFER
            call.makeCall(args.target, params)
            calls.append(call)
        deadline = time.monotonic() + args.timeout_s
        tail_s = args.tail_ms / 1000
        while not all(call.result.disconnected for call in calls):
            if time.monotonic() > deadline:
                up = [call.result.index for call in calls if not call.result.disconnected]
                raise CallerError(f"call(s) {up} still up after {args.timeout_s} s (see their results)")
            endpoint.libHandleEvents(POLL_MS)
            for call in calls:
                if call.result.error:
                    raise CallerError(f"call {call.result.index}: {call.result.error}")
                hang_up_when_played(call, tail_s)
    finally:
        for call in calls:
            call.player = None
        if any(call.isActive() for call in calls):
            endpoint.hangupAllCalls()
            end = time.monotonic() + 2
            while any(call.isActive() for call in calls) and time.monotonic() < end:
                endpoint.libHandleEvents(POLL_MS)


def hang_up_when_played(call: Call, tail_s: float) -> None:
    """BYE ``tail_s`` after the player reached the WAV's end.

    pjmedia's player rewinds at the end even with PJMEDIA_FILE_NO_LOOP (it then sends
    silence), so the end shows as the position going back; until then it is the peak. A
    position read can also step back mid-file while the player refills its buffer (seen on a
    loaded machine), so a step back counts as the end only once the peak is within two packets
    of the WAV's length, or once the WAV's duration (plus a second) has passed since it started.
    """
    result = call.result
    if call.player is None or result.hung_up_by_us or result.disconnected:
        return
    now = time.monotonic()
    if call.ended_at is None:
        position = int(call.player.getPos())
        if position >= result.played_samples:
            result.played_samples = position
            return
        near_end = result.played_samples >= result.wav_samples - 2 * SAMPLES_PER_PACKET
        overdue = call.started_at is not None and now - call.started_at > result.wav_samples / CLOCK_RATE_HZ + 1.0
        if not (near_end or overdue):
            return
        call.ended_at = now
    if now - call.ended_at >= tail_s:
        result.hung_up_by_us = True
        call.hangup(pj.CallOpParam(True))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("wav", nargs="+", help="16-bit mono WAV(s), 8 kHz to stay sample-exact; one per call")
    parser.add_argument("--target", required=True, help="request URI, e.g. sip:asr@127.0.0.1:5060")
    parser.add_argument("--codec", choices=sorted(CODEC_IDS), default="PCMU")
    parser.add_argument("--calls", type=int, default=1, help=f"concurrent calls, 1..{MAX_CALLS}")
    parser.add_argument("--sip-port", type=int, default=0, help="local UDP port for SIP (0: any free one)")
    parser.add_argument("--rtp-port", type=int, default=0, help="first local RTP port (0: pjsua's default)")
    parser.add_argument("--tail-ms", type=int, default=300, help="time to keep the call up after the WAV ends")
    parser.add_argument("--timeout-s", type=float, default=30.0, help="give up when calls are still up by then")
    parser.add_argument(
        "--delayed-offer", action="store_true", help="INVITE without SDP: the callee offers, we answer in the ACK"
    )
    parser.add_argument("--srtp", action="store_true", help="SRTP mandatory, SDES keys (RTP/SAVP)")
    parser.add_argument("--tls", action="store_true", help="SIP over TLS (give a ;transport=tls target)")
    parser.add_argument("--log-level", type=int, default=1, help="pjsua2 log level for console (0..6)")
    args = parser.parse_args(argv)
    if not 1 <= args.calls <= MAX_CALLS:
        parser.error(f"--calls must be 1..{MAX_CALLS} (pjsua2's compile-time call limit), got {args.calls}")
    if len(args.wav) > args.calls:
        parser.error(f"{len(args.wav)} WAVs for {args.calls} call(s); give at most one per call")
    if not args.target.startswith("sip:"):
        parser.error(f"--target must be a sip: URI, got {args.target!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # pjlib writes to fd 1 (its start-up lines come before any log setting applies): send all
    # native output to stderr and keep the real stdout for the one JSON line.
    report_out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    report: dict[str, Any] = {"ok": False, "codec": args.codec, "calls": [], "error": None}
    results: list[CallResult] = []
    endpoint: pj.Endpoint | None = None
    account: pj.Account | None = None
    try:
        results = plan_calls(args)
        endpoint = make_endpoint(args.log_level)
        restrict_codecs(endpoint, args.codec)
        account = make_account(endpoint, args.sip_port, args.rtp_port, args.srtp, args.tls)
        run_calls(endpoint, account, results, args)
        failed = [r.index for r in results if not (r.confirmed and r.hung_up_by_us and r.disconnected)]
        if failed:
            raise CallerError(f"call(s) {failed} were not answered, played and hung up by us")
        report["ok"] = True
    except CallerError as exc:
        report["error"] = str(exc)
    except pj.Error as exc:
        report["error"] = f"pjsua2 error: {describe(exc)}"
    finally:
        if account is not None:
            account.shutdown()
            del account
        if endpoint is not None:
            endpoint.libDestroy()
    report["calls"] = [asdict(result) for result in results]
    print(json.dumps(report), file=report_out, flush=True)
    if report["error"]:
        print(f"pjsua2_caller: {report['error']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
