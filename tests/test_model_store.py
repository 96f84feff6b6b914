"""asr-model: pull (resume, checksum), safe unpack, install, normalised layout, against fixture
archives in WeNet's layouts built here from the WeNet fixture model and served by a local
HTTP server with Range support."""

from __future__ import annotations

import hashlib
import http.server
import io
import tarfile
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from deploy.models.catalogue import CatalogueEntry, load_catalogue
from deploy.models.download import DownloadLimits
from deploy.models.errors import ModelStoreError
from deploy.models.store import DOWNLOADS, install, pull
from deploy.models.unpack import UnpackLimits

FIXTURE = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "wenet_u2pp_small"
MODEL = FIXTURE / "model"
pytestmark = pytest.mark.skipif(not (MODEL / "final.pt").is_file(), reason=f"WeNet fixture not found at {FIXTURE}")
RELEASED = ("train.yaml", "final.pt", "units.txt", "global_cmvn")
TOP = "20210601_u2++_conformer_exp"


def wenet_tar_gz(*, units_name: str = "words.txt", top: str = TOP) -> bytes:
    """A checkpoint archive as WeNet publishes them: one top folder, units under another name."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name in RELEASED:
            arcname = f"{top}/{units_name if name == 'units.txt' else name}"
            tar.add(MODEL / name, arcname=arcname)
    return buffer.getvalue()


def tar_with(members: list[tarfile.TarInfo], data: dict[str, bytes] | None = None) -> bytes:
    """A .tar.gz of the fixture's files plus ``members`` (hostile ones)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name in RELEASED:
            tar.add(MODEL / name, arcname=f"{TOP}/{name}")
        for member in members:
            payload = (data or {}).get(member.name, b"")
            member.size = len(payload) if member.isfile() else 0
            tar.addfile(member, io.BytesIO(payload) if member.isfile() else None)
    return buffer.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info


@dataclass
class Served:
    """What the local server serves and saw."""

    files: dict[str, bytes] = field(default_factory=dict)
    drop_once_after: dict[str, int] = field(default_factory=dict)  # path -> bytes sent before closing
    ranges: list[str | None] = field(default_factory=list)  # Range header of each GET


def make_handler(served: Served) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            served.ranges.append(self.headers.get("Range"))
            body = served.files.get(self.path)
            if body is None:
                self.send_error(404)
                return
            start, status = 0, 200
            requested = self.headers.get("Range")
            if requested:
                start = int(requested.removeprefix("bytes=").split("-")[0])
                if start >= len(body):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(body)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                status = 206
            self.send_response(status)
            self.send_header("Content-Length", str(len(body) - start))
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
            self.end_headers()
            cut = served.drop_once_after.pop(self.path, None)
            if cut is not None:
                self.wfile.write(body[start : start + cut])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)  # the transfer dies mid-body
                return
            self.wfile.write(body[start:])

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


@pytest.fixture()
def server() -> Iterator[tuple[str, Served]]:
    served = Served()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), make_handler(served))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", served
    finally:
        httpd.shutdown()
        httpd.server_close()


def entry(url: str, sha256: str = "") -> CatalogueEntry:
    return CatalogueEntry(
        name="fixture-u2pp", language="zh", data="random weights", data_licence="none",
        architecture="U2++ conformer 4 x 128", urls=(url,), sha256=sha256,
    )  # fmt: skip


def assert_released(model_dir: Path) -> None:
    assert sorted(p.name for p in model_dir.iterdir()) == sorted(RELEASED)
    assert (model_dir / "units.txt").read_bytes() == (MODEL / "units.txt").read_bytes()
    assert (model_dir / "final.pt").read_bytes() == (MODEL / "final.pt").read_bytes()


# -- catalogue --------------------------------------------------------------------------


def test_catalogue_lists_wenet_mandarin_checkpoints_without_invented_checksums() -> None:
    catalogue = load_catalogue()
    names = [e.name for e in catalogue.models]
    assert {"aishell-u2pp-conformer", "aishell2-u2pp-conformer", "wenetspeech-u2pp-conformer"} <= set(names)
    for item in catalogue.models:
        assert item.urls and all(url.endswith(".tar.gz") for url in item.urls)
        assert item.data_licence
        assert item.sha256 == "" and "not published" in item.notes  # neither source publishes one
    with pytest.raises(ModelStoreError, match="no model 'nope'"):
        catalogue.get("nope")


# -- pull ------------------------------------------------------------------------------


def test_pull_resumes_after_the_connection_drops_and_normalises_the_layout(
    server: tuple[str, Served], tmp_path: Path
) -> None:
    base, served = server
    archive = wenet_tar_gz()
    served.files["/m.tar.gz"] = archive
    served.drop_once_after["/m.tar.gz"] = len(archive) // 3
    progress = io.StringIO()
    sha = hashlib.sha256(archive).hexdigest()
    installed = pull(entry(f"{base}/m.tar.gz", sha), tmp_path, replace=False, progress=progress)
    assert installed == tmp_path / "fixture-u2pp"
    assert_released(installed)
    assert served.ranges == [None, f"bytes={len(archive) // 3}-"]
    assert "m.tar.gz" in progress.getvalue() and "MB" in progress.getvalue()
    assert not list((tmp_path / DOWNLOADS).iterdir())  # the archive is gone once installed


def test_pull_continues_the_partial_file_of_a_killed_pull(server: tuple[str, Served], tmp_path: Path) -> None:
    base, served = server
    archive = wenet_tar_gz()
    served.files["/m.tar.gz"] = archive
    (tmp_path / DOWNLOADS).mkdir()
    (tmp_path / DOWNLOADS / "m.tar.gz.part").write_bytes(archive[:1000])
    pull(entry(f"{base}/m.tar.gz"), tmp_path, replace=False, progress=io.StringIO())
    assert served.ranges == ["bytes=1000-"]
    assert_released(tmp_path / "fixture-u2pp")


def test_pull_refuses_a_bad_checksum_and_drops_the_file(server: tuple[str, Served], tmp_path: Path) -> None:
    base, served = server
    served.files["/m.tar.gz"] = wenet_tar_gz()
    with pytest.raises(ModelStoreError, match="checksum mismatch"):
        pull(entry(f"{base}/m.tar.gz", "0" * 64), tmp_path, replace=False, progress=io.StringIO())
    assert not (tmp_path / "fixture-u2pp").exists()
    assert not list((tmp_path / DOWNLOADS).iterdir())


def test_pull_refuses_a_truncated_archive(server: tuple[str, Served], tmp_path: Path) -> None:
    base, served = server
    served.files["/m.tar.gz"] = wenet_tar_gz()[:-5000]  # the server itself has a short file
    with pytest.raises(ModelStoreError, match="truncated or corrupt"):
        pull(entry(f"{base}/m.tar.gz"), tmp_path, replace=False, progress=io.StringIO())
    assert not (tmp_path / "fixture-u2pp").exists()
    assert [p.name for p in tmp_path.iterdir()] == [DOWNLOADS]  # no scratch or staging left
    assert not list((tmp_path / DOWNLOADS).iterdir())  # and no archive that would be refused again


def test_pull_refuses_a_file_over_the_size_limit_and_reports_http_and_connection_errors(
    server: tuple[str, Served], tmp_path: Path
) -> None:
    base, served = server
    served.files["/m.tar.gz"] = wenet_tar_gz()
    with pytest.raises(ModelStoreError, match="accepted"):
        pull(entry(f"{base}/m.tar.gz"), tmp_path, replace=False, progress=io.StringIO(),
             download_limits=DownloadLimits(max_bytes=1000))  # fmt: skip
    with pytest.raises(ModelStoreError, match="HTTP 404"):
        pull(entry(f"{base}/gone.tar.gz"), tmp_path, replace=False, progress=io.StringIO())
    with pytest.raises(ModelStoreError, match=r"cannot connect .*offline"):
        pull(entry("http://127.0.0.1:1/m.tar.gz"), tmp_path, replace=False, progress=io.StringIO())


# -- install: archives carried in ---------------------------------------------------------


@pytest.mark.parametrize("units_name", ["units.txt", "words.txt", "lang_char.txt"])
def test_install_archive_finds_the_model_under_its_top_folder(units_name: str, tmp_path: Path) -> None:
    archive = tmp_path / "wenet_exp.tar.gz"
    archive.write_bytes(wenet_tar_gz(units_name=units_name))
    installed = install(archive, tmp_path / "models", None, replace=False)
    assert installed == tmp_path / "models" / "wenet_exp"
    assert_released(installed)


def test_install_zip_and_link_to_the_last_epoch(tmp_path: Path) -> None:
    """WeNet's training leaves final.pt as a link to the last epoch's checkpoint."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name in ("train.yaml", "units.txt", "global_cmvn"):
            tar.add(MODEL / name, arcname=f"exp/{name}")
        tar.add(MODEL / "final.pt", arcname="exp/39.pt")
        tar.addfile(member("exp/final.pt", tarfile.SYMTYPE, "39.pt"))
    (tmp_path / "a.tgz").write_bytes(buffer.getvalue())
    installed = install(tmp_path / "a.tgz", tmp_path / "models", "linked", replace=False)
    assert_released(installed)

    with zipfile.ZipFile(tmp_path / "m.zip", "w") as archive:
        for name in RELEASED:
            archive.write(MODEL / name, f"{TOP}/{name}")
    assert_released(install(tmp_path / "m.zip", tmp_path / "models", None, replace=False))


HOSTILE = {  # case -> (extra members, why it is refused)
    "parent": ([member("../x")], "climbs out"),
    "nested parent": ([member(f"{TOP}/../../x")], "climbs out"),
    "absolute": ([member("/tmp/x")], "absolute path"),
    "symlink out": ([member(f"{TOP}/evil", tarfile.SYMTYPE, "../../x")], "points outside"),
    "absolute symlink": ([member(f"{TOP}/evil", tarfile.SYMTYPE, "/etc/passwd")], "points outside"),
    "hardlink out": ([member(f"{TOP}/evil", tarfile.LNKTYPE, "../x")], "points outside"),
    "device": ([member(f"{TOP}/dev", tarfile.CHRTYPE)], "device file or FIFO"),
    "fifo": ([member(f"{TOP}/fifo", tarfile.FIFOTYPE)], "device file or FIFO"),
    "file as directory": ([member(f"{TOP}/final.pt/x")], "conflict"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_install_refuses_a_hostile_archive(case: str, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    archive = work / "hostile.tar.gz"
    members, why = HOSTILE[case]
    archive.write_bytes(tar_with(members, {"../x": b"pwned", f"{TOP}/../../x": b"pwned", "/tmp/x": b"pwned"}))
    with pytest.raises(ModelStoreError, match=f"refused: .*{why}"):
        install(archive, work / "models", None, replace=False)
    assert not (tmp_path / "x").exists() and not (work / "x").exists()
    assert not (work / "models" / "hostile").exists()
    assert list((work / "models").iterdir()) == []  # scratch removed


def test_install_refuses_a_hostile_zip_and_size_limits(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "evil.zip", "w") as archive:
        archive.writestr("../x", b"pwned")
    with pytest.raises(ModelStoreError, match="climbs out"):
        install(tmp_path / "evil.zip", tmp_path / "models", None, replace=False)
    archive_path = tmp_path / "big.tar.gz"
    archive_path.write_bytes(wenet_tar_gz())
    with pytest.raises(ModelStoreError, match="limit per file"):
        install(archive_path, tmp_path / "models", None, replace=False, limits=UnpackLimits(max_file_bytes=1 << 20))
    with pytest.raises(ModelStoreError, match="in all"):
        install(archive_path, tmp_path / "models", None, replace=False,
                limits=UnpackLimits(max_total_bytes=4 << 20))  # fmt: skip


def test_install_refuses_a_truncated_archive_carried_in(tmp_path: Path) -> None:
    archive = tmp_path / "short.tar.gz"
    archive.write_bytes(wenet_tar_gz()[: 3 << 20])
    with pytest.raises(ModelStoreError, match="truncated or corrupt"):
        install(archive, tmp_path / "models", None, replace=False)
    zipped = tmp_path / "m.zip"
    with zipfile.ZipFile(zipped, "w") as archive_zip:
        for name in RELEASED:
            archive_zip.write(MODEL / name, name)
    zipped.write_bytes(zipped.read_bytes()[:-200])  # the central directory cut off
    with pytest.raises(ModelStoreError, match="truncated or corrupt"):
        install(zipped, tmp_path / "models", None, replace=False)


def test_install_takes_the_cmvn_file_train_yaml_names_and_an_averaged_checkpoint(tmp_path: Path) -> None:
    config = (MODEL / "train.yaml").read_text(encoding="utf-8")
    assert "cmvn_file: global_cmvn" in config
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        moved = config.replace("cmvn_file: global_cmvn", "cmvn_file: /data/exp/cmvn.json").encode()
        info = tarfile.TarInfo("exp/train.yaml")
        info.size = len(moved)
        tar.addfile(info, io.BytesIO(moved))
        tar.add(MODEL / "global_cmvn", arcname="exp/cmvn.json")
        tar.add(MODEL / "final.pt", arcname="exp/avg_10.pt")
        tar.add(MODEL / "units.txt", arcname="exp/lang_char.txt")
    (tmp_path / "a.tar.gz").write_bytes(buffer.getvalue())
    installed = install(tmp_path / "a.tar.gz", tmp_path / "models", None, replace=False)
    assert sorted(p.name for p in installed.iterdir()) == sorted(RELEASED)
    assert (installed / "global_cmvn").read_bytes() == (MODEL / "global_cmvn").read_bytes()


# -- install: directories carried in ------------------------------------------------------


def test_install_from_a_read_only_directory_and_force(tmp_path: Path) -> None:
    installed = install(MODEL, tmp_path / "models", "small", replace=False)  # the fixture is read-only
    assert_released(installed)
    with pytest.raises(ModelStoreError, match="--force"):
        install(MODEL, tmp_path / "models", "small", replace=False)
    assert_released(install(MODEL, tmp_path / "models", "small", replace=True))
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["small"]
    for name in ("../small", ".hidden", "a/b"):
        with pytest.raises(ModelStoreError, match="plain directory name"):
            install(MODEL, tmp_path / "models", name, replace=False)


def test_install_refuses_what_does_not_load(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    for name in RELEASED:
        (source / name).write_bytes((MODEL / name).read_bytes())
    (source / "units.txt").write_text("<blank> 0\n<unk> 1\n", encoding="utf-8")  # not this model's vocabulary
    with pytest.raises(ModelStoreError, match="does not load"):
        install(source, tmp_path / "models", None, replace=False)
    assert list((tmp_path / "models").iterdir()) == []
    with pytest.raises(ModelStoreError, match=r"no train\.yaml"):
        install(tmp_path / "models", tmp_path / "elsewhere", None, replace=False)
