"""KEDA's nats-jetstream scaler reads a consumer's lag from NATS's ``/jsz`` by account: it must
name the account that holds JetStream, which the rendered config gives to Seedance's users.
With tenants in an account of their own the streams left the global account ``$G``; a scaler
still reading ``$G`` would find no stream and never scale the graph-compiler."""

from __future__ import annotations

from pathlib import Path

import yaml

from seedance.events.accounts import SEEDANCE_ACCOUNT
from seedance.events.nats_config import RENDERED_FILES

REPO = Path(__file__).resolve().parents[3]
KEDA = REPO / "deploy/k8s/components/keda/graph-compiler.yaml"


def test_the_scaler_reads_the_account_that_holds_jetstream() -> None:
    docs = [d for d in yaml.safe_load_all(KEDA.read_text()) if d]
    triggers = [
        t
        for d in docs
        if d.get("kind") == "ScaledObject"
        for t in d["spec"]["triggers"]
        if t["type"] == "nats-jetstream"
    ]
    assert triggers, "no nats-jetstream trigger"
    assert {t["metadata"]["account"] for t in triggers} == {SEEDANCE_ACCOUNT}
    for rendered in RENDERED_FILES:
        text = (REPO / rendered).read_text()
        block = text[text.index(f"  {SEEDANCE_ACCOUNT} {{") :]
        assert block.splitlines()[1].strip() == "jetstream: enabled", rendered
