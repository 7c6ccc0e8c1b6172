"""`make data`: check (and where missing, fetch) the public traces the benchmarks and demo read.

Every file is pinned by URL (a fixed commit of its origin repository) and sha256. Files already
in the data directory are verified, never overwritten; missing ones are downloaded when the
network allows, and otherwise this prints exactly what to fetch and where to put it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import urllib.request
from pathlib import Path

_ALIBABA = (
    "https://raw.githubusercontent.com/alibaba/clusterdata/"
    "7a6c496e4f4b6ce6150be8f881cb051bf2abff42/cluster-trace-gpu-v2023/csv/"
)
_FGD = (
    "https://raw.githubusercontent.com/hkust-adsl/kubernetes-scheduler-simulator/"
    "master/experiments/analysis/expected_results/"
)
_AZURE = (
    "https://raw.githubusercontent.com/Azure/AzurePublicDataset/"
    "790921015d50dd6aae7f7e47f39ba0e235ad6b08/data/"
)
_MOONCAKE = (
    "https://raw.githubusercontent.com/kvcache-ai/Mooncake/"
    "3cca71daccf2a7afb8fe3f0295358f70e3a69fdb/FAST25-release/traces/"
)

#: (path under the data directory, URL, sha256)
MANIFEST: list[tuple[str, str, str]] = (
    [
        (f"alibaba-gpu-v2023/{name}", _ALIBABA + name, sha)
        for name, sha in [
            (
                "openb_node_list_gpu_node.csv",
                "2beca64b4d3dfa342036a34b56a495c6cef9225db836c81f541282cb1df320b5",
            ),
            (
                "openb_pod_list_default.csv",
                "1ee7ed79c27a3b0861cda8ddba86a004c6aba904caafa329a76ae93ca63834a8",
            ),
            (
                "openb_pod_list_gpushare100.csv",
                "12dbc07d6a49bf8641e2275a2ff5bf7be74b5df7d148d531e135b140b95f9a3d",
            ),
            (
                "openb_pod_list_gpushare20.csv",
                "9be2d0efb52e242c32e23dd184cc5fcc1983478c6c9c02cbb6b4b62925c0ffcd",
            ),
            (
                "openb_pod_list_gpushare40.csv",
                "d83ce79a4eb6987524bedbb0c65e41aed3a36bf6c1b78b86234c3687a07e1d40",
            ),
            (
                "openb_pod_list_gpushare80.csv",
                "88b6649369ced40d0fde287d2498ea61ff4b05fccba8bdc95daf6042f2f8431e",
            ),
            (
                "openb_pod_list_gpuspec05.csv",
                "8f1c0ef7e4e511e982bd2818898ba22ee6d273bf5fce124b7ace285b5928cf4e",
            ),
            (
                "openb_pod_list_gpuspec10.csv",
                "2dc7e4cb9480484f08539720b433a9ec9ab5d76b396f3f7557c53a2ff78a7611",
            ),
            (
                "openb_pod_list_gpuspec20.csv",
                "6b9b89ab8913c1c074e994e98f548cf1a872fc5f76f2442ca8cd514a478b00a9",
            ),
            (
                "openb_pod_list_gpuspec25.csv",
                "9d030679a2ccd7e27a7ec9ff15baff34480d22a0012515691fc187e3f35ee68c",
            ),
            (
                "openb_pod_list_multigpu20.csv",
                "d9ec6f6c74fb980cc0b81239470c6353fceea077ea9abd610003b604c7cc2b01",
            ),
            (
                "openb_pod_list_multigpu30.csv",
                "a5e479c6444b1d83eef848159cf00c3cfa13441b2d1e2c113c391b91f1cc5b11",
            ),
            (
                "openb_pod_list_multigpu50.csv",
                "206f2f5959db30ecb7c44e7f13197c8ec50b7a35558ad3777cc3662ef0fe5373",
            ),
        ]
    ]
    + [
        (f"alibaba-gpu-v2023/fgd-paper-results/{name}", _FGD + name, sha)
        for name, sha in [
            (
                "analysis_allo_discrete.csv",
                "e00aff5923a52d53e47c16ec9d19190de4e788c15334865a77bd46e1bd006ea1",
            ),
            (
                "analysis_frag_discrete.csv",
                "0d9181864ef9adb2169f232124c6af767579fe2a3c08f940419b4989420c8ce2",
            ),
            (
                "analysis_frag_ratio_discrete.csv",
                "78f55e6324b532c6af8d69da8e312d8cbe6f953719ccfa3f51e5a392b6b1d860",
            ),
        ]
    ]
    + [
        (
            "azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv",
            _AZURE + "AzureLLMInferenceTrace_conv.csv",
            "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
        ),
        (
            "mooncake-fast25-conversation/conversation_trace.jsonl",
            _MOONCAKE + "conversation_trace.jsonl",
            "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",
        ),
    ]
)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch(path: Path, rel: str, url: str, digest: str) -> str:
    """Download one file next to its place, keep it only if its sha256 matches: "ok", "bad"
    (fetched but not the pinned file) or "missing" (could not fetch)."""
    print(f"fetching {rel}", file=sys.stderr)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".part")
        urllib.request.urlretrieve(url, tmp)
        if sha256(tmp) != digest:
            tmp.unlink()
            return "bad"
        tmp.rename(path)
    except OSError as exc:
        print(f"  could not fetch: {exc}", file=sys.stderr)
        return "missing"
    return "ok"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default=os.environ.get("SEEDANCE_DATA_DIR", "data"))
    p.add_argument("--no-download", action="store_true")
    args = p.parse_args()
    root = Path(args.dir)
    missing: list[tuple[str, str, str]] = []
    bad: list[str] = []
    for rel, url, digest in MANIFEST:
        path = root / rel
        if path.exists():
            state = "ok" if sha256(path) == digest else "bad"
        elif args.no_download:
            state = "missing"
        else:
            state = fetch(path, rel, url, digest)
        if state == "bad":
            bad.append(rel)
        elif state == "missing":
            missing.append((rel, url, digest))
    if bad:
        print("checksum mismatch (not the pinned file): " + ", ".join(bad), file=sys.stderr)
    if missing:
        print(f"missing under {root.resolve()}; fetch these (sha256 must match):", file=sys.stderr)
        for rel, url, digest in missing:
            print(f"  {rel}\n    {url}\n    sha256 {digest}", file=sys.stderr)
    if bad or missing:
        return 1
    print(f"data ok: {len(MANIFEST)} files verified in {root.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
