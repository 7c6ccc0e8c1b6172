"""`make data` / `make data-check` (seedance.testing.datasets) know every trace file the
repository reads, `make test` checks them before anything slow, and the tools resolve the data
directory as the Makefile does."""

from __future__ import annotations

import http.client
import http.server
import io
import os
import re
import socket
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

import pytest

from seedance.testing import datasets as data
from seedance.testing.paths import REPO, data_dir

#: A trace file's name as code writes it (the data folders' naming; a test's own synthetic
#: trace is written under tmp_path and exempt).
_TRACE_FILE = re.compile(
    r"\b(openb_\w+|\w+_anon|node_info_df|AzureLLMInferenceTrace_\w+|conversation_trace"
    r"|h200_conv_\w+|analysis_\w+_discrete)\.(?:csv|jsonl)\b"
)
_FOLDER = re.compile(
    r"(?:\"|DATA_DIR\)/)(alibaba-[a-z0-9-]+|azure-llm[a-z0-9-]*|mooncake-[a-z0-9-]+|h200-llm[a-z0-9-]*)"
)
_SYNTHETIC = {"openb_pod_list_x.csv"}


def manifest() -> dict[str, str]:
    return {f"{ds.folder}/{n}": digest for ds in data.DATASETS for n, digest in ds.files()}


def sources() -> list[Path]:
    roots = ["mk", "tests", "harness", "tools", "libs", "services"]
    files = [p for r in roots for p in (REPO / r).rglob("*") if p.suffix in {".py", ".mk"}]
    return [p for p in [*files, REPO / "Makefile"] if p != Path(data.__file__)]


def test_every_trace_file_and_folder_the_repository_reads_is_in_the_manifest() -> None:
    names = {rel.rsplit("/", 1)[1] for rel in manifest()}
    folders = {rel.split("/", 1)[0] for rel in manifest()}
    read = {m.group(0) for p in sources() for m in _TRACE_FILE.finditer(p.read_text("utf-8"))}
    read_folders = {m.group(1) for p in sources() for m in _FOLDER.finditer(p.read_text("utf-8"))}
    assert "node_info_df.csv" in read  # the scan sees what bench-scale reads
    assert sorted(read - names - _SYNTHETIC) == []
    assert sorted(read_folders - folders) == []


def test_the_manifest_matches_the_shared_data_file_for_file() -> None:
    """CI's data directory (../shared/data) holds exactly the manifest's files, and each is the
    pinned one: `make data-check` passes there."""
    root = data_dir()
    if not (root / "alibaba-gpu-v2023").is_dir():
        pytest.skip(f"shared data not present at {root}")
    held = {
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and p.name not in {"README.md", "SHA256SUMS"}
    }
    assert sorted(held ^ set(manifest())) == []
    assert data.verify(root, download=False) == 0


def test_the_check_names_each_missing_file_and_the_command_that_fetches_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert data.main(["--check", "--dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    for rel in manifest():
        assert f"  {rel}\n" in err
    assert "`make data` fetches them" in err
    assert "alibaba-spot-gpu-2026/node_info_df.csv\n    https://" in err
    assert list(tmp_path.iterdir()) == []  # --check downloads nothing


def test_files_without_a_public_copy_are_named_but_not_required(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A user elsewhere cannot fetch the project's own H200 recording: the check says what to do
    and passes, and the tests that read it skip."""
    for ds in data.DATASETS:
        for name in dict(ds.files()):
            if ds.required:
                (tmp_path / ds.folder).mkdir(parents=True, exist_ok=True)
                (tmp_path / ds.folder / name).write_bytes(b"x")
    # Only the required ones are present (with the wrong bytes): named as not the pinned file.
    assert data.main(["--check", "--dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "not the pinned file" in err
    assert "optional, not under" in err
    assert "h200-llm-telemetry/h200_conv_x6_requests.csv\n    no public copy" in err
    assert "  h200-llm-telemetry/h200_conv_x6_requests.csv\n" not in err.split("not the pinned")[1]


def _tarball(path: Path, member: str, text: str) -> str:
    raw = text.encode()
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo(member)
        info.size = len(raw)
        tar.addfile(info, io.BytesIO(raw))
    return data.sha256(path)


def test_a_genai_series_is_fetched_from_its_archive_and_cut_to_the_first_half(
    tmp_path: Path,
) -> None:
    end = data.GENAI_FIRST_HALF_END
    origin = tmp_path / "origin"
    origin.mkdir()
    text = (
        f"value,timestamp_anon,container_ip\n1.0,{end - 60}.0,a\n2.0,{end}.0,a\n3.0,{end + 1}.0,b\n"
    )
    want = f"value,timestamp_anon,container_ip\r\n1.0,{end - 60}.0,a\r\n".encode()
    archive_sha = _tarball(origin / "s.tar.gz", "s.csv", text)
    ds = data.Dataset(
        "f", sums=f"{data.hashlib.sha256(want).hexdigest()}  s.csv", url=origin.as_uri() + "/",
        archives=(("s", archive_sha, True),),
    )  # fmt: skip
    out = tmp_path / "data" / "f" / "s.csv"
    assert data.fetch(ds, "s.csv", out, ds.files()[0][1]) == "ok"
    assert out.read_bytes() == want
    # Another archive than the pinned one is refused and leaves nothing in place.
    out.unlink()
    bad = replace(ds, archives=(("s", "0" * 64, True),))
    assert data.fetch(bad, "s.csv", out, ds.files()[0][1]) == "missing"
    assert list(out.parent.iterdir()) == []


def test_the_data_directory_resolves_as_the_makefile_does(tmp_path: Path) -> None:
    repo = tmp_path / "checkout"
    repo.mkdir()
    assert data_dir({}, repo) == repo / "data"
    (tmp_path / "shared" / "data").mkdir(parents=True)
    assert data_dir({}, repo) == tmp_path / "shared" / "data"
    assert data_dir({"SEEDANCE_DATA_DIR": "/d"}, repo) == Path("/d")


def test_empty_is_unset_and_a_relative_folder_is_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "checkout"
    repo.mkdir()
    for empty in ("", " "):
        assert data_dir({"SEEDANCE_DATA_DIR": empty}, repo) == repo / "data"
    monkeypatch.chdir(tmp_path)
    assert data_dir({"SEEDANCE_DATA_DIR": "here/d"}, repo) == tmp_path / "here" / "d"
    assert data_dir({"SEEDANCE_DATA_DIR": "/a/x/../d"}, repo) == Path("/a/d")


def _make_data_check(*args: str, cwd: Path = REPO, **env: str) -> str:
    """The folder `make -n data-check` would check."""
    dry = subprocess.run(
        ["make", "-n", "--no-print-directory", *args, "data-check"],
        cwd=cwd, env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    (folder,) = re.findall(r'tools\.gen\.data --check --dir "([^"]*)"', dry)
    return folder


def test_make_resolves_the_data_directory_as_python_does(tmp_path: Path) -> None:
    """Set but empty, make kept "" (`?=` sees it defined) and checked (`make data`: fetched
    into) the checkout itself, while Python took the default; a relative value went to the
    tools unresolved. Make's current directory is the checkout, under `make -C` too."""
    default = str(data_dir({}))
    assert _make_data_check() == default
    assert _make_data_check(SEEDANCE_DATA_DIR="") == default
    assert _make_data_check("SEEDANCE_DATA_DIR=") == default  # on make's command line
    assert _make_data_check(SEEDANCE_DATA_DIR="rel/d") == str(REPO / "rel" / "d")
    assert _make_data_check("SEEDANCE_DATA_DIR=rel/d") == str(REPO / "rel" / "d")
    elsewhere = _make_data_check("-C", str(REPO), cwd=tmp_path, SEEDANCE_DATA_DIR="rel/d")
    assert elsewhere == str(REPO / "rel" / "d")
    assert _make_data_check(SEEDANCE_DATA_DIR="/x/../d") == "/d"


def test_the_data_tool_refuses_an_empty_folder(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        data.main(["--check", "--dir", ""])
    assert stop.value.code == 2
    assert "--dir: empty" in capsys.readouterr().err


def test_make_test_checks_the_data_before_anything_slow() -> None:
    # -B: every prerequisite's recipe, whether or not this checkout built it already (once
    # `make test` has built .venv-triton, a plain dry run prints nothing for it).
    dry = subprocess.run(
        ["make", "-n", "-B", "--no-print-directory", "test"],
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "SEEDANCE_DATA_DIR": "/nowhere"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    check = dry.index('tools.gen.data --check --dir "/nowhere"')
    assert check < dry.index("lint")
    assert check < dry.index(".venv-triton")


def test_no_tool_or_test_resolves_the_data_directory_on_its_own() -> None:
    """`python -m tools.demo` once fell back to ../shared/data and never ./data, so a user whose
    `make data` filled ./data got "not found": one resolution (data_dir) serves everyone."""
    own = re.compile(r"\"shared\"\s*/\s*\"data\"|get\(\"SEEDANCE_DATA_DIR\"")
    mine = {REPO / "libs/testing/src/seedance/testing/paths.py", Path(__file__).resolve()}
    found = [
        f"{p.relative_to(REPO)}:{n}"
        for p in sources()
        if p.suffix == ".py" and p not in mine
        for n, line in enumerate(p.read_text("utf-8").splitlines(), 1)
        if own.search(line)
    ]
    assert found == []


class _Origin(http.server.BaseHTTPRequestHandler):
    """A local origin: ``/stall`` sends its headers and 10 of the 1,000 bytes it promises, then
    nothing until the test releases it; any other path is served from ``bodies``."""

    bodies: ClassVar[dict[str, bytes]] = {}
    release = threading.Event()

    def do_GET(self) -> None:
        if self.path == "/stall":
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b"x" * 10)
            self.wfile.flush()
            self.release.wait()
            return
        body = self.bodies[self.path]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def origin() -> Iterator[str]:
    _Origin.release = threading.Event()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Origin)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        _Origin.release.set()
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_stalled_origin_is_given_up_naming_the_file_and_origin_leaving_nothing(
    origin: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: ``urlretrieve`` had no timeout, and a stalled origin hung `make data` for ever."""
    ds = data.Dataset("f", sums=f"{'0' * 64}  stall", url=origin, origin="a test origin")
    assert data.verify(tmp_path, download=True, stall_timeout_s=0.5, datasets=(ds,)) == 1
    err = capsys.readouterr().err
    assert (
        f"  could not fetch f/stall from {origin}stall (a test origin): no bytes for 0.5 s "
        "(--stall-timeout-s); nothing kept\n"
    ) in err
    assert "missing under" in err
    assert list((tmp_path / "f").iterdir()) == []  # no partial file a later run would take


def test_a_download_with_another_sha256_is_said_and_not_kept(
    origin: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = b"not the pinned bytes\n"
    _Origin.bodies["/t.csv"] = body
    ds = data.Dataset("f", sums=f"{'0' * 64}  t.csv", url=origin, origin="a test origin")
    assert data.verify(tmp_path, download=True, datasets=(ds,)) == 1
    err = capsys.readouterr().err
    have = data.hashlib.sha256(body).hexdigest()
    assert (
        f"  could not fetch f/t.csv from {origin}t.csv (a test origin): sha256 {have}, not the "
        f"pinned {'0' * 64}; nothing kept\n"
    ) in err
    assert list((tmp_path / "f").iterdir()) == []


def test_a_long_download_says_its_bytes_so_far(
    origin: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = b"y" * (3 << 16)  # three reads
    _Origin.bodies["/big"] = body
    digest = data.hashlib.sha256(body).hexdigest()
    ds = data.Dataset("f", sums=f"{digest}  big", url=origin)
    out = tmp_path / "f" / "big"
    assert data.fetch(ds, "big", out, digest, progress_every_s=0.0) == "ok"
    assert out.read_bytes() == body
    lines = capsys.readouterr().err.splitlines()
    assert f"  {len(body):,} of {len(body):,} bytes" in lines, lines


def test_the_stall_timeout_is_a_positive_number_of_seconds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for bad in ("0", "-1", "soon"):
        with pytest.raises(SystemExit):
            data.main(["--check", "--stall-timeout-s", bad])
        assert "--stall-timeout-s" in capsys.readouterr().err


def test_a_connect_that_times_out_is_said_as_a_stall(
    origin: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An origin that never answers the connect (its SYN dropped): urllib wraps the timeout in
    URLError, which was said as `<urlopen error timed out>`, not as the stall it is."""

    def stalled_connect(*args: object, **kwargs: object) -> socket.socket:
        raise TimeoutError("timed out")  # what the connect raises after stall_timeout_s

    monkeypatch.setattr(http.client.socket, "create_connection", stalled_connect)
    ds = data.Dataset("f", sums=f"{'0' * 64}  b.csv", url=origin, origin="a test origin")
    assert data.verify(tmp_path, download=True, stall_timeout_s=0.5, datasets=(ds,)) == 1
    assert (
        f"  could not fetch f/b.csv from {origin}b.csv (a test origin): no bytes for 0.5 s "
        "(--stall-timeout-s); nothing kept\n"
    ) in capsys.readouterr().err


def test_a_fetch_removes_what_a_killed_run_left_but_not_a_live_run_s(
    origin: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A `make data` killed mid-download left its `.fetching-*` folder (the partial file in
    it) for ever; a later fetch beside it removes one untouched for ABANDONED_AFTER_S."""
    folder = tmp_path / "f"
    left = folder / ".fetching-killed"
    left.mkdir(parents=True)
    (left / "t.csv").write_bytes(b"x" * 10)
    old = time.time() - 7 * 24 * 3600  # a week: past ABANDONED_AFTER_S
    for p in (left / "t.csv", left):
        os.utime(p, (old, old))
    live = folder / ".fetching-live"  # another run's, writing now
    live.mkdir()
    (live / "u.csv").write_bytes(b"y")
    body = b"ok\n"
    _Origin.bodies["/t.csv"] = body
    ds = data.Dataset("f", sums=f"{data.hashlib.sha256(body).hexdigest()}  t.csv", url=origin)
    assert data.verify(tmp_path, download=True, datasets=(ds,)) == 0
    assert sorted(p.name for p in folder.iterdir()) == [".fetching-live", "t.csv"]
    assert f"  removed {left}, left by a download that did not finish" in capsys.readouterr().err
