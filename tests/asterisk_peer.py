"""A real Asterisk 22 for interop tests: built once from ``../shared/peers/asterisk/``, one private
instance per test module.

``asterisk_build()`` checks the sources against SHA256SUMS and builds them (build.sh, with the
pjproject tarball fed offline and ``INSTALL_DEPS=1`` when run as root, as CI is) into a cache outside
the clone, ``${XDG_CACHE_HOME:-~/.cache}/hotline-asr/asterisk-<sha12>``, keyed by the checksums and
the build script. The build runs under a file lock so that test modules started in parallel build
once; a build is complete only once its ``COMPLETE`` stamp exists, and a complete one is reused.

``AsteriskPeer`` renders the config templates into a run folder of its own (its own SIP port, RTP
port range and directories), starts ``asterisk -C RUN/etc/asterisk.conf -f`` in the background,
drives it with ``asterisk -C ... -rx`` and stops it by its PID. Its log (``RUN/var/log/full``) stays
in the run folder and is printed when a test fails, so a failure shows what Asterisk saw.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from asr_gateway.config import ServiceConfig
from tests.waiting import wait_until

PEER_DIR = Path(__file__).resolve().parents[2] / "shared" / "peers" / "asterisk"
PEER_DIR_ENV = "ASR_ASTERISK_PEER_DIR"
BUILD_TIMEOUT_S = 40 * 60
START_TIMEOUT_S = 30.0


def service_on_port(config: ServiceConfig, sip_port: int) -> ServiceConfig:
    """``config`` with its SIP door on ``sip_port``: the port the module's Asterisk was rendered to call."""
    return config.model_copy(update={"sip": config.sip.model_copy(update={"port": sip_port})})


class AsteriskPeerError(RuntimeError):
    """The Asterisk peer could not be built or run; the message says what to look at."""


def peer_dir() -> Path:
    """The folder of sources, build script and config templates (``ASR_ASTERISK_PEER_DIR`` overrides)."""
    return Path(os.environ.get(PEER_DIR_ENV, str(PEER_DIR)))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verified_sources(source_dir: Path) -> dict[str, Path]:
    """Each file SHA256SUMS names, checked against its checksum; raises on a mismatch or a missing file."""
    sums = source_dir / "SHA256SUMS"
    if not sums.is_file():
        raise AsteriskPeerError(f"{sums} is missing: the Asterisk peer sources are not in place")
    files: dict[str, Path] = {}
    for line in sums.read_text().splitlines():
        if not line.strip():
            continue
        expected, name = line.split(maxsplit=1)
        path = source_dir / name.lstrip("*")
        if not path.is_file():
            raise AsteriskPeerError(f"{path} is named in {sums} but missing")
        actual = _sha256(path)
        if actual != expected:
            raise AsteriskPeerError(f"{path}: sha256 {actual}, {sums} says {expected}; fetch the file again")
        files[path.name] = path
    return files


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hotline-asr"


def build_key(source_dir: Path) -> str:
    """12 hex digits of the checksums and the build script: a change in either is a new build."""
    digest = hashlib.sha256((source_dir / "SHA256SUMS").read_bytes())
    digest.update((source_dir / "build.sh").read_bytes())
    return digest.hexdigest()[:12]


def _one(files: dict[str, Path], prefix: str) -> Path:
    found = [path for name, path in files.items() if name.startswith(prefix)]
    if len(found) != 1:
        raise AsteriskPeerError(f"expected one {prefix}* in SHA256SUMS, found {sorted(p.name for p in found)}")
    return found[0]


def asterisk_build() -> Path:
    """The install prefix of a complete Asterisk build for the current sources, building it if needed."""
    source_dir = peer_dir()
    files = verified_sources(source_dir)
    prefix = cache_root() / f"asterisk-{build_key(source_dir)}"
    stamp = prefix / "COMPLETE"
    if stamp.is_file():
        return prefix
    prefix.parent.mkdir(parents=True, exist_ok=True)
    with (prefix.parent / f"{prefix.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not stamp.is_file():
            _build(source_dir, files, prefix)
            stamp.write_text(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n")
    return prefix


def _build(source_dir: Path, files: dict[str, Path], prefix: Path) -> None:
    """Unpack and build into ``prefix`` (a half-built one from an interrupted run is started over)."""
    work = prefix.parent / f"{prefix.name}.build"
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(prefix, ignore_errors=True)
    work.mkdir(parents=True)
    tarball = _one(files, "asterisk-")
    with tarfile.open(tarball) as tar:
        tar.extractall(work, filter="tar")
    (src,) = [path for path in work.iterdir() if path.is_dir()]
    env = dict(os.environ, PJPROJECT_TARBALL=str(_one(files, "pjproject-")))
    env["INSTALL_DEPS"] = "1" if os.geteuid() == 0 and shutil.which("apt-get") else "0"
    log = prefix.parent / f"{prefix.name}.build.log"
    with log.open("w") as out:
        result = subprocess.run(
            ["bash", str(source_dir / "build.sh"), str(src), str(prefix)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
    if result.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        raise AsteriskPeerError(f"building Asterisk failed (exit {result.returncode}); {log} ends:\n{tail}")
    shutil.rmtree(work, ignore_errors=True)


@dataclass(frozen=True)
class AsteriskPorts:
    sip: int
    rtp_start: int
    rtp_end: int


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _rtp_range(run_dir: Path, width: int = 200) -> tuple[int, int]:
    """A window of ``width`` UDP ports in 30000-39999 picked by the run folder, clear of the service's
    RTP ports (41000 up) and the kernel's ephemeral ones; Asterisk skips a port in use."""
    slot = int(hashlib.sha256(str(run_dir).encode()).hexdigest(), 16) % (10000 // width)
    start = 30000 + slot * width
    return start, start + width - 1


def without_sections(config: str, names: set[str]) -> str:
    """``config`` (Asterisk's ini dialect) less its sections called one of ``names``: a context the
    extra dialplan defines anew replaces the template's of that name instead of merging with it."""
    kept: list[str] = []
    keep = True
    for line in config.splitlines(keepends=True):
        header = re.match(r"^\[([^\]]+)\]", line)
        if header:
            keep = header.group(1) not in names
        if keep:
            kept.append(line)
    return "".join(kept)


class AsteriskPeer:
    """One private Asterisk: its configs rendered into ``run_dir`` from the templates, started with
    ``start()``, driven with ``rx()``, stopped with ``stop()``.

    ``svc_sip_port`` is the service's SIP port (endpoint ``svc`` of pjsip.conf calls it), ``wav`` the
    sentence the dialplan plays (a path without its ``.wav``); ``extra_dialplan`` and ``extra_pjsip``
    are appended to extensions.conf and pjsip.conf, the templates' ``@...@`` names replaced in them too.
    A context of ``extra_dialplan`` replaces the template's of the same name (``[test](+)`` adds to it)."""

    def __init__(
        self,
        prefix: Path,
        run_dir: Path,
        svc_sip_port: int,
        wav: Path,
        *,
        extra_dialplan: str = "",
        extra_pjsip: str = "",
    ) -> None:
        self.prefix = prefix
        self.run_dir = run_dir
        self.svc_sip_port = svc_sip_port
        rtp_start, rtp_end = _rtp_range(run_dir)
        self.ports = AsteriskPorts(_free_udp_port(), rtp_start, rtp_end)
        self.conf = run_dir / "etc" / "asterisk.conf"
        self.log_file = run_dir / "var" / "log" / "full"
        self._render(wav, extra_dialplan, extra_pjsip)
        self._process: subprocess.Popen[bytes] | None = None

    def _render(self, wav: Path, extra_dialplan: str, extra_pjsip: str) -> None:
        values = {
            "@PREFIX@": str(self.prefix),
            "@RUN@": str(self.run_dir),
            "@AST_SIP_PORT@": str(self.ports.sip),
            "@SVC_SIP_PORT@": str(self.svc_sip_port),
            "@WAV@": str(wav.with_suffix("")),
            "@RTP_START@": str(self.ports.rtp_start),
            "@RTP_END@": str(self.ports.rtp_end),
        }
        etc = self.run_dir / "etc"
        for sub in ("etc", "var/lib", "var/spool", "var/run", "var/log"):
            (self.run_dir / sub).mkdir(parents=True, exist_ok=True)
        for template in sorted((peer_dir() / "configs").iterdir()):
            extra = {"extensions.conf": extra_dialplan, "pjsip.conf": extra_pjsip}.get(template.name, "")
            text = template.read_text()
            if template.name == "extensions.conf":
                text = without_sections(text, set(re.findall(r"^\[([^\]]+)\]\s*$", extra_dialplan, re.M)))
            text += "\n" + extra if extra else ""
            for key, value in values.items():
                text = text.replace(key, value)
            (etc / template.name).write_text(text)

    def _env(self) -> dict[str, str]:
        """The environment with the build's shared libraries (libasteriskpj, libasteriskssl) findable."""
        paths = [str(self.prefix / "lib"), *filter(None, [os.environ.get("LD_LIBRARY_PATH")])]
        return dict(os.environ, LD_LIBRARY_PATH=":".join(paths))

    @property
    def binary(self) -> str:
        return str(self.prefix / "sbin" / "asterisk")

    def start(self) -> None:
        """Start Asterisk in the background and wait until it is fully booted."""
        console = (self.run_dir / "console.log").open("wb")
        self._process = subprocess.Popen(
            [self.binary, "-C", str(self.conf), "-f"],
            stdin=subprocess.DEVNULL,
            stdout=console,
            stderr=subprocess.STDOUT,
            env=self._env(),
            start_new_session=True,
        )
        console.close()

        def booted() -> bool:
            if self._process is not None and self._process.poll() is not None:
                raise AsteriskPeerError(f"Asterisk exited ({self._process.returncode}) at start:\n{self.log_tail()}")
            return self._rx_status("core waitfullybooted") == 0

        wait_until(booted, START_TIMEOUT_S, "Asterisk fully booted")
        self.rx("pjsip set logger on")  # SIP messages into the log (var/log/full)

    def _rx_status(self, command: str) -> int:
        result = subprocess.run(
            [self.binary, "-C", str(self.conf), "-rx", command],
            capture_output=True,
            env=self._env(),
            timeout=20,
            check=False,
        )
        return result.returncode

    def rx(self, command: str) -> str:
        """Run a CLI command in the running Asterisk (``asterisk -rx``); its output."""
        result = subprocess.run(
            [self.binary, "-C", str(self.conf), "-rx", command],
            capture_output=True,
            text=True,
            env=self._env(),
            timeout=20,
            check=False,
        )
        if result.returncode != 0:
            raise AsteriskPeerError(f"asterisk -rx {command!r} failed ({result.returncode}): {result.stderr}")
        return result.stdout

    def channels(self) -> dict[str, str]:
        """The channels there are now, name -> state (``Up``, ``Ring`` ...; ``core show channels concise``)."""
        rows = [line.split("!") for line in self.rx("core show channels concise").splitlines() if "!" in line]
        return {row[0]: row[4] for row in rows if len(row) > 4}

    def channel_up(self, prefix: str, timeout_s: float = 30.0) -> str:
        """The name of the one channel named ``prefix``... once it is up (answered)."""
        found: list[str] = []

        def up() -> bool:
            found[:] = [name for name, state in self.channels().items() if name.startswith(prefix) and state == "Up"]
            return len(found) == 1

        wait_until(up, timeout_s, f"one channel {prefix}... up in Asterisk")
        return found[0]

    def log_text(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.is_file() else ""

    def log_tail(self, lines: int = 80) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop Asterisk by its PID: SIGTERM (a clean shutdown), SIGKILL if it has not gone in ``timeout_s``."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout_s)
