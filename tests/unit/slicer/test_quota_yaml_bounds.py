"""A quota document from the bus is refused with a QuotaError of bounded length, whatever it holds.

The quota key is written by the k8s-bridge (or an operator) and read by every slicer replica: a
document that makes `QuotaPolicy.from_yaml` raise anything else, or build a message the size of
an alias-expanded structure, took down every replica on every restart (the review's probe: 432
bytes of nine levels of nine aliases, a ~12.7 GB repr). Here each such document is refused as
an invalid policy, quickly, with a message that names why and stays short.
"""

from __future__ import annotations

import pytest

from seedance.slicer.core.bounded_yaml import MAX_DEPTH, MAX_DOC_BYTES
from seedance.slicer.core.quota import QuotaError, QuotaPolicy

#: A QuotaError's message is at most this long, whatever the document holds.
MESSAGE_BOUND = 1000


def alias_bomb(depth: int) -> str:
    """The probe's document: `tenants` a list of `depth` levels, each nine aliases of the last.
    Depth 6 (not the probe's 9) so that, were aliases accepted again, the old repr would cost
    ~17 MB here, not ~12.7 GB on a shared machine."""
    levels = [f"&a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, depth + 1)]
    parts = ["&a0 [0,0,0,0,0,0,0,0,0]", *levels]
    return "version: 1\ntenants: [" + ", ".join(parts) + "]"


def refusal(text: str) -> str:
    with pytest.raises(QuotaError) as info:
        QuotaPolicy.from_yaml(text)
    message = str(info.value)
    assert len(message) <= MESSAGE_BOUND, message[:200]
    return message


def test_the_probes_alias_bomb_is_refused_with_a_short_message() -> None:
    assert "anchors and aliases are not accepted" in refusal(alias_bomb(6))


@pytest.mark.parametrize(
    "text",
    [
        # an anchor alone, and YAML's merge key (an alias under another name)
        "version: 1\ntenants:\n  a: &q {quota: {gpus: 1}}\n",
        "version: 1\ntenants:\n  a: {quota: {gpus: 1}}\n  b: {<<: *q}\n",
    ],
    ids=["anchor", "merge_key"],
)
def test_anchors_and_aliases_are_refused(text: str) -> None:
    assert "anchors and aliases are not accepted" in refusal(text)


def test_nesting_past_the_bound_is_refused_not_a_recursion_error() -> None:
    # ~4 KB: the composer recursed once per level, RecursionError past ~330 levels
    deep = "version: 1\ntenants: " + "[" * 2000 + "]" * 2000
    assert f"nested deeper than {MAX_DEPTH} levels" in refusal(deep)


def test_a_document_over_the_size_bound_is_refused_before_it_is_parsed() -> None:
    big = "version: 1\ntenants: {a: {quota: {gpus: 1}}}\n#" + "x" * MAX_DOC_BYTES + "\n"
    assert "over the limit of" in refusal(big)


def test_an_integer_python_will_not_convert_is_refused_not_a_value_error() -> None:
    text = "version: 1\ntenants:\n  a: {quota: {gpus: " + "9" * 5000 + "}}\n"
    assert "cannot construct" in refusal(text)


def test_keys_of_mixed_types_are_refused_not_a_type_error() -> None:
    # two unknown keys, an int and a str: sorting them to name the first raised TypeError
    text = "version: 1\ntenants:\n  a: {1: x, b: y, quota: {gpus: 1}}\n"
    assert "tenants.a: unknown field 1" in refusal(text)


@pytest.mark.parametrize(
    "text",
    [
        # a large value of the wrong type, quoted in the message
        "version: 1\ntenants: [" + ", ".join(["0"] * 100_000) + "]\n",
        # a long tenant name, named in the field's path
        "version: 1\ntenants:\n  ? " + "t" * 100_000 + "\n  : [1]\n",
        # a long integer, quoted as the bad value
        "version: 1\ntenants:\n  a: {quota: {gpus: -" + "9" * 4000 + "}}\n",
        # a long unknown priority class, and many known ones
        "version: 1\npriority_classes: {"
        + ", ".join(f"c{i}: {i}" for i in range(10_000))
        + "}\ntenants:\n  a: {default_priority: "
        + "p" * 100_000
        + "}\n",
    ],
    ids=["long_list", "long_tenant_name", "long_integer", "long_priority_class"],
)
def test_values_are_quoted_within_the_bound(text: str) -> None:
    refusal(text)


def test_what_the_bridge_writes_still_parses() -> None:
    # the k8s-bridge writes JSON (json.dumps, sort_keys): no anchors, a few levels deep
    text = (
        '{"priority_classes": {"high": 1000}, "tenants": {"acme": {"cohort": "r", '
        '"max_priority": "high", "quota": {"gpus": 8, "mig": {"3g.40gb": 2}}, '
        '"lending_limit": {"gpus": 4}}}, "version": 1}'
    )
    policy = QuotaPolicy.from_yaml(text)
    assert policy.tenants["acme"].nominal == {"gpus": 8, "mig/3g.40gb": 2}
    assert policy.tenants["acme"].max_priority == 1000
