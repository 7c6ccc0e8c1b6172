"""Label and field selectors as the API server parses them."""

from __future__ import annotations

from typing import Any

import pytest

from seedance.testing.kube_api.selectors import SelectorError, parse_fields, parse_labels


def _obj(labels: dict[str, str], **fields: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "labels": labels}, **fields}


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ("app=train", {"app": "train"}, True),
        ("app==train", {"app": "serve"}, False),
        ("app!=train", {}, True),
        ("app in (train, serve)", {"app": "serve"}, True),
        ("app notin (train,serve)", {"app": "serve"}, False),
        ("app notin (train)", {}, True),
        ("app", {"app": ""}, True),
        ("!app", {"app": "x"}, False),
        ("app=train,tier in (gpu),!legacy", {"app": "train", "tier": "gpu"}, True),
        ("app=train,tier in (gpu),!legacy", {"app": "train", "tier": "gpu", "legacy": "1"}, False),
        ("", {}, True),
    ],
)
def test_label_selectors(selector: str, labels: dict[str, str], matches: bool) -> None:
    assert parse_labels(selector).matches(_obj(labels)) is matches


def test_field_selectors() -> None:
    pod = _obj({}, spec={"schedulerName": "seedance", "nodeName": ""}, status={"phase": "Pending"})
    assert parse_fields("spec.schedulerName=seedance,status.phase!=Running").matches(pod)
    assert parse_fields("spec.nodeName=").matches(pod)
    assert not parse_fields("spec.nodeName!=").matches(pod)
    assert parse_fields("metadata.name=p,metadata.namespace=ns").matches(pod)
    event = {"metadata": {"name": "e"}, "involvedObject": {"name": "p", "uid": "u", "kind": "Pod"}}
    assert parse_fields("involvedObject.name=p,involvedObject.uid=u").matches(event)
    assert not parse_fields("involvedObject.kind=Node").matches(event)


def test_unserved_or_malformed_selectors_are_refused() -> None:
    with pytest.raises(SelectorError, match="field label not supported"):
        parse_fields("spec.containers=x")
    with pytest.raises(SelectorError):
        parse_fields("metadata.name")
    with pytest.raises(SelectorError):
        parse_labels("app in train")
