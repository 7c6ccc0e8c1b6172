"""The trace files the tests, the benchmarks and the demo read, and how to get each one:
`make data` and `make data-check` (``python -m tools.gen.data``) run ``main``.

Each file is pinned by sha256 and, where a public copy exists, by a URL at a fixed commit of its
origin repository (checked against those commits' trees: git blob ids of the same bytes). Files
already in the data directory are verified, never overwritten; missing ones are downloaded when
the network allows, and otherwise this prints exactly what to fetch and where to put it.
``--check`` downloads nothing: `make test` runs it first, so a missing file is named with the
command that fetches it before any test starts, not as a FileNotFoundError minutes in.

Must not: write anywhere but the data directory, or keep a file whose sha256 is not the pinned one.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import http.client
import io
import os
import shutil
import sys
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from seedance.testing.paths import data_dir

__all__ = [
    "DATASETS",
    "GENAI_FIRST_HALF_END",
    "PROGRESS_EVERY_S",
    "STALL_TIMEOUT_S",
    "Dataset",
    "download",
    "fetch",
    "main",
    "sha256",
    "verify",
]

_GH = "https://raw.githubusercontent.com/"
_CLUSTERDATA = _GH + "alibaba/clusterdata/7a6c496e4f4b6ce6150be8f881cb051bf2abff42/"

#: The GenTD26 per-pod series are kept to their first ~11.4 hours (the later hours are held back
#: for evaluation: alibaba-genai-2026's README); rows at or after this timestamp are dropped.
GENAI_FIRST_HALF_END = 1662899760

#: A download whose origin sends nothing for this long (connecting, or between any two reads)
#: is given up (``--stall-timeout-s``): a stalled origin must not hang `make data` for ever,
#: while a slow one that keeps sending is left to finish.
STALL_TIMEOUT_S = 60.0
#: A long download says its bytes so far at most this often (on stderr).
PROGRESS_EVERY_S = 5.0
#: A ``.fetching-*`` folder untouched this long was left by a killed run: the next fetch beside
#: it removes it.
ABANDONED_AFTER_S = 6 * 3600.0


@dataclass(frozen=True)
class Dataset:
    """One folder of the data directory: its files (``sha256  name``, as sha256sum writes) and
    where they come from. ``url`` is the folder's pinned base URL; ``archive`` says a file comes
    as ``<stem>.tar.gz`` (sha256 of the archive) holding ``<stem>.csv``, cut to the first half
    when ``first_half``; ``manual`` is what to do where no public copy exists."""

    folder: str
    sums: str
    url: str = ""
    origin: str = ""
    archives: tuple[tuple[str, str, bool], ...] = ()
    manual: str = ""
    #: False where no public copy exists: the tests that read it skip without it.
    required: bool = True

    def files(self) -> list[tuple[str, str]]:
        """(name under the folder, sha256)."""
        return [(n, d) for d, n in (line.split() for line in self.sums.strip().splitlines())]


DATASETS: tuple[Dataset, ...] = (
    Dataset(
        "alibaba-gpu-v2023",
        url=_CLUSTERDATA + "cluster-trace-gpu-v2023/csv/",
        origin="GitHub alibaba/clusterdata, cluster-trace-gpu-v2023/csv/ (research use; cite "
        "Weng et al., ATC'23)",
        sums="""
5a85c2af79c66a1efff8bbcbda430400aae56d8431370d738480967e1a9c6b15  openb_node_list_all_node.csv
2beca64b4d3dfa342036a34b56a495c6cef9225db836c81f541282cb1df320b5  openb_node_list_gpu_node.csv
1bc3fd9ee5c1468ccd018f624d9222746e08d59f963f66b925804734271c0eaa  openb_pod_list_cpu0.csv
8ed554026d041b15ff21ddc104d9a21dbd9a93c496262fa23ef7b5be27e220dc  openb_pod_list_cpu037.csv
747f43247bffc2b0bb081d7f61f0705ca8d390dafc0b647e642c92f3baf3ba1e  openb_pod_list_cpu050.csv
f8a2b031461b54d7b9f06d55473c2371eb3357b78a255c646bdca5e0833a8a2f  openb_pod_list_cpu072.csv
bec1c33fbdde61fd463877534ec79b393aec73e1cbb22d55fab9f166ac480982  openb_pod_list_cpu100.csv
87bebd4d012faa8305ce1fd82737f51cf03361aac28b75d42e34aa656d7f4ee0  openb_pod_list_cpu235.csv
134c21ff96d57533df8a37b67632972884fec9396e77cd0898ddc370cc8e607d  openb_pod_list_cpu250.csv
76528825f40ee662cb098b3b6e683c1efd9f87a0c8af7e628df1f32c639636d1  openb_pod_list_cpu300.csv
1ee7ed79c27a3b0861cda8ddba86a004c6aba904caafa329a76ae93ca63834a8  openb_pod_list_default.csv
12dbc07d6a49bf8641e2275a2ff5bf7be74b5df7d148d531e135b140b95f9a3d  openb_pod_list_gpushare100.csv
9be2d0efb52e242c32e23dd184cc5fcc1983478c6c9c02cbb6b4b62925c0ffcd  openb_pod_list_gpushare20.csv
d83ce79a4eb6987524bedbb0c65e41aed3a36bf6c1b78b86234c3687a07e1d40  openb_pod_list_gpushare40.csv
88b6649369ced40d0fde287d2498ea61ff4b05fccba8bdc95daf6042f2f8431e  openb_pod_list_gpushare80.csv
8f1c0ef7e4e511e982bd2818898ba22ee6d273bf5fce124b7ace285b5928cf4e  openb_pod_list_gpuspec05.csv
2dc7e4cb9480484f08539720b433a9ec9ab5d76b396f3f7557c53a2ff78a7611  openb_pod_list_gpuspec10.csv
6b9b89ab8913c1c074e994e98f548cf1a872fc5f76f2442ca8cd514a478b00a9  openb_pod_list_gpuspec20.csv
9d030679a2ccd7e27a7ec9ff15baff34480d22a0012515691fc187e3f35ee68c  openb_pod_list_gpuspec25.csv
d9ec6f6c74fb980cc0b81239470c6353fceea077ea9abd610003b604c7cc2b01  openb_pod_list_multigpu20.csv
a5e479c6444b1d83eef848159cf00c3cfa13441b2d1e2c113c391b91f1cc5b11  openb_pod_list_multigpu30.csv
206f2f5959db30ecb7c44e7f13197c8ec50b7a35558ad3777cc3662ef0fe5373  openb_pod_list_multigpu50.csv
""",
    ),
    Dataset(
        # The commit that added these files (2023-05-10); unchanged at the repository's head.
        "alibaba-gpu-v2023/fgd-paper-results",
        url=_GH + "hkust-adsl/kubernetes-scheduler-simulator/"
        "1853fc0e79d74778719c8137d7ca31dd61729e4f/experiments/analysis/expected_results/",
        origin="GitHub hkust-adsl/kubernetes-scheduler-simulator (Apache-2.0), the FGD paper's "
        "simulation results",
        sums="""
e00aff5923a52d53e47c16ec9d19190de4e788c15334865a77bd46e1bd006ea1  analysis_allo_discrete.csv
0d9181864ef9adb2169f232124c6af767579fe2a3c08f940419b4989420c8ce2  analysis_frag_discrete.csv
78f55e6324b532c6af8d69da8e312d8cbe6f953719ccfa3f51e5a392b6b1d860  analysis_frag_ratio_discrete.csv
""",
    ),
    Dataset(
        "alibaba-spot-gpu-2026",
        url=_CLUSTERDATA + "cluster-trace-v2026-spot-gpu/",
        origin="GitHub alibaba/clusterdata, cluster-trace-v2026-spot-gpu/ (research use; cite "
        "Duan et al., ASPLOS'26)",
        sums="1aba161961a5a4a1a61aa581383c5e5abe3400b59f8597ba8c4eef7597bc9d18  node_info_df.csv",
    ),
    Dataset(
        "alibaba-genai-2026",
        url=_CLUSTERDATA + "cluster-trace-v2026-GenAI/",
        origin="GitHub alibaba/clusterdata, cluster-trace-v2026-GenAI/ (research use; cite "
        "Lin et al., SoCC'25): each CSV from its .tar.gz, the per-pod series cut to the first "
        f"half (timestamp_anon < {GENAI_FIRST_HALF_END})",
        archives=(
            (
                "basemodel_update_latency_anon",
                "4a0cfd5537dc0e7e19340cc8cfc49c26d6aef0ffd85f3ed68db1f4e157811e9d",
                False,
            ),
            (
                "pod_gpu_duty_cycle_anon",
                "c4070218189b2811995c30dd9fefb8a793a83a54dccebe7b41cab2d123916855",
                True,
            ),
            (
                "pod_gpu_memory_used_bytes_anon",
                "662be431f2d24a003c3a0b28383155fccceefb7e83dea14f912166edc9129132",
                True,
            ),
        ),
        sums="""
06d1d39fea0e702dbeb209494fbb3ceec8ded62ade30dfa5b294b9adfbe27da7  basemodel_update_latency_anon.csv
30e7dd95bc840a3fa9e1eb56bda616cc038a7fb71bf5ecc41d1621f4183cf75a  pod_gpu_duty_cycle_anon.csv
6d7559d85ed5494f7f0455b50c9e523db35ab511a44e3fa834198f5a52ecf86f  pod_gpu_memory_used_bytes_anon.csv
""",
    ),
    Dataset(
        "azure-llm-inference-2023",
        url=_GH + "Azure/AzurePublicDataset/790921015d50dd6aae7f7e47f39ba0e235ad6b08/data/",
        origin="GitHub Azure/AzurePublicDataset (CC BY 4.0; cite Patel et al., ISCA'24)",
        sums="2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8  "
        "AzureLLMInferenceTrace_conv.csv",
    ),
    Dataset(
        "mooncake-fast25-conversation",
        url=_GH + "kvcache-ai/Mooncake/3cca71daccf2a7afb8fe3f0295358f70e3a69fdb/FAST25-release/"
        "traces/",
        origin="GitHub kvcache-ai/Mooncake (Apache-2.0; cite Qin et al., FAST'25)",
        sums="b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df  "
        "conversation_trace.jsonl",
    ),
    Dataset(
        "h200-llm-telemetry",
        origin="this project's own recording on one H200 (2026-11-30); arrivals from the Azure "
        "conversation trace (CC BY 4.0)",
        manual="no public copy: take the folder from the project's shared data "
        "(../shared/data/h200-llm-telemetry), or record your own with "
        "`python -m tools.record.h200_serving` on an H200 (its figures then differ, and so does "
        "its sha256); the tests that read it skip without it, `make bench-kv-forecast` needs it",
        required=False,
        sums="""
1f932d72787715b2553a90ddeba0a90d53f3abd87939926a5d71c6ea1ad9af79  h200_conv_x6_requests.csv
cad00ad8008a65957310c251c808420252d0cd37258220ec07e4b6e7a72802d4  h200_conv_x6_telemetry.csv
""",
    ),
)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def first_half(member: bytes) -> bytes:
    """A GenTD26 per-pod series cut to its first half, written as the shared copy was (csv's
    CRLF line ends; the archive's own are LF)."""
    rows = csv.reader(io.StringIO(member.decode("utf-8")))
    header = next(rows)
    at = header.index("timestamp_anon")
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(header)
    w.writerows(r for r in rows if float(r[at]) < GENAI_FIRST_HALF_END)
    return out.getvalue().encode("utf-8")


def from_archive(archive: Path, stem: str, cut: bool) -> bytes:
    """``<stem>.csv`` out of a downloaded ``<stem>.tar.gz``, cut to the first half if asked."""
    with tarfile.open(archive, "r:gz") as tar:
        f = tar.extractfile(f"{stem}.csv")
        if f is None:
            raise OSError(f"{archive.name} holds no {stem}.csv")
        member = f.read()
    return first_half(member) if cut else member


def how_to_fetch(ds: Dataset, name: str) -> str:
    """Where the file comes from, for a reader fetching it by hand."""
    for stem, digest, cut in ds.archives:
        if f"{stem}.csv" == name:
            how = f"cut to timestamp_anon < {GENAI_FIRST_HALF_END}, CRLF line ends"
            return f"{ds.url}{stem}.tar.gz (sha256 {digest}): its {name}" + (
                f", {how}" if cut else ""
            )
    return ds.manual if ds.manual else ds.url + name


def download(
    url: str, dest: Path, *, stall_timeout_s: float, progress_every_s: float = PROGRESS_EVERY_S
) -> int:
    """``url`` written to ``dest``; its size. Raises ``TimeoutError`` when the origin sends
    nothing for ``stall_timeout_s`` (connecting, or any read), ``OSError`` when it ends short
    of its Content-Length. Says the bytes so far on stderr at most every ``progress_every_s``."""
    got, last = 0, time.monotonic()
    with urllib.request.urlopen(url, timeout=stall_timeout_s) as reply, dest.open("wb") as out:
        size = reply.headers.get("Content-Length")
        of = f" of {int(size):,}" if size and size.isdigit() else ""
        while chunk := reply.read(1 << 16):
            out.write(chunk)
            got += len(chunk)
            if time.monotonic() - last >= progress_every_s:
                print(f"  {got:,}{of} bytes", file=sys.stderr)
                last = time.monotonic()
    if of and got < int(size or 0):
        raise OSError(f"the origin ended after {got:,}{of} bytes")
    return got


def remove_abandoned(folder: Path, *, now: float | None = None) -> list[Path]:
    """Remove the ``.fetching-*`` folders in ``folder`` that nothing touched for
    ``ABANDONED_AFTER_S`` (a run killed mid-download left them; a live run writes within its
    stall timeout or gives up, and removes its own); the ones removed, each said on stderr."""
    now = time.time() if now is None else now
    removed = []
    for tmp in sorted(folder.glob(".fetching-*")):
        try:
            touched = max(p.stat().st_mtime for p in (tmp, *tmp.rglob("*")))
        except OSError:  # removed meanwhile by the run that made it
            continue
        if now - touched >= ABANDONED_AFTER_S:
            shutil.rmtree(tmp, ignore_errors=True)
            print(f"  removed {tmp}, left by a download that did not finish", file=sys.stderr)
            removed.append(tmp)
    return removed


def fetch(
    ds: Dataset,
    name: str,
    path: Path,
    digest: str,
    *,
    stall_timeout_s: float = STALL_TIMEOUT_S,
    progress_every_s: float = PROGRESS_EVERY_S,
) -> str:
    """Download one file under a temporary name beside its place and move it there only if its
    sha256 matches: "ok", or "missing" (could not fetch, not the pinned bytes, no public copy),
    a failure said in one line naming the file, the URL and the origin. Nothing but the pinned
    file is ever left where a later run would take it as done."""
    if ds.manual:
        return "missing"
    print(f"fetching {ds.folder}/{name}", file=sys.stderr)
    archive = {f"{stem}.csv": (stem, sha, cut) for stem, sha, cut in ds.archives}.get(name)
    url = ds.url + name if archive is None else f"{ds.url}{archive[0]}.tar.gz"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_abandoned(path.parent)
        with tempfile.TemporaryDirectory(dir=path.parent, prefix=".fetching-") as tmp:
            part = Path(tmp) / name
            got = Path(tmp) / url.rsplit("/", 1)[-1] if archive else part
            download(url, got, stall_timeout_s=stall_timeout_s, progress_every_s=progress_every_s)
            want = digest if archive is None else archive[1]
            if (have := sha256(got)) != want:
                raise ValueError(f"sha256 {have}, not the pinned {want}")
            if archive is not None:
                part.write_bytes(from_archive(got, archive[0], archive[2]))
                if (have := sha256(part)) != digest:
                    raise ValueError(f"its {name} has sha256 {have}, not the pinned {digest}")
            shutil.move(part, path)
    except (OSError, http.client.HTTPException, tarfile.TarError, ValueError) as exc:
        why = (
            f"no bytes for {stall_timeout_s:g} s (--stall-timeout-s)"
            # A connect that times out comes wrapped: URLError(reason=TimeoutError).
            if isinstance(exc, TimeoutError)
            or isinstance(getattr(exc, "reason", None), TimeoutError)
            else str(exc) or type(exc).__name__
        )
        origin = f" ({ds.origin})" if ds.origin else ""
        print(
            f"  could not fetch {ds.folder}/{name} from {url}{origin}: {why}; nothing kept",
            file=sys.stderr,
        )
        return "missing"
    return "ok"


def verify(
    root: Path,
    download: bool,
    *,
    stall_timeout_s: float = STALL_TIMEOUT_S,
    datasets: Sequence[Dataset] = DATASETS,
) -> int:
    """Check every file of ``datasets`` (and fetch the missing ones when ``download``, each
    given up after ``stall_timeout_s`` without a byte); 0 when every required file is in
    place, 1 otherwise, naming each missing or wrong one and how to get it."""
    states: dict[str, list[str]] = {"ok": [], "bad": [], "missing": [], "optional": []}
    for ds in datasets:
        for name, digest in ds.files():
            path = root / ds.folder / name
            if path.exists():
                state = "ok" if sha256(path) == digest else "bad"
            elif download:
                state = fetch(ds, name, path, digest, stall_timeout_s=stall_timeout_s)
            else:
                state = "missing"
            if state == "missing" and not ds.required:
                state = "optional"
            where = "" if state == "ok" else f"\n    {how_to_fetch(ds, name)}\n    sha256 {digest}"
            states[state].append(f"  {ds.folder}/{name}{where}")
    return report(root, states, download)


def report(root: Path, states: dict[str, list[str]], download: bool) -> int:
    for state, head in (
        ("optional", f"optional, not under {root} (the tests that read it skip without it):"),
        ("bad", f"not the pinned file under {root} (another sha256; move it away, then fetch):"),
        ("missing", f"missing under {root}:"),
    ):
        if states[state]:
            print(head + "\n" + "\n".join(states[state]), file=sys.stderr)
    if not (states["bad"] or states["missing"]):
        print(f"data ok: {len(states['ok'])} files verified in {root}")
        return 0
    if download:
        fix = "these could not be fetched here: put each file there by hand"
    else:
        fix = "`make data` fetches them there (or put each file there by hand)"
    print(f"{fix}, or point SEEDANCE_DATA_DIR at a folder that holds them", file=sys.stderr)
    return 1


def _folder(text: str) -> Path:
    """``--dir``: a relative folder from the current directory; an empty one is refused (it
    was the checkout itself: ``make data`` fetched into the checkout's root)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty: leave --dir out for SEEDANCE_DATA_DIR's folder")
    return Path(os.path.abspath(text))


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 s: {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tools.gen.data",
        description="check (and where missing, fetch) the trace files the tests and benches read",
    )
    p.add_argument("--dir", type=_folder, default=data_dir(), help="default: %(default)s")
    p.add_argument(
        "--check", action="store_true", help="verify only, download nothing (make data-check)"
    )
    p.add_argument(
        "--stall-timeout-s",
        type=_positive,
        default=STALL_TIMEOUT_S,
        help="give a download up after this many seconds without a byte (default: %(default)g)",
    )
    args = p.parse_args(argv)
    return verify(args.dir, download=not args.check, stall_timeout_s=args.stall_timeout_s)
