"""Render nats-server's ``authorization`` block from ``deploy/auth/users.yaml``.

One source, two copies of the same output: ``deploy/auth/nats-auth.conf`` (compose mounts it) and
``deploy/k8s/base/nats/auth.conf`` (kustomize turns it into the ConfigMap; kustomize cannot read
files above its root, hence the copy). ``--check`` fails when either differs from a fresh render.

Subjects are derived from the catalogue (``seedance.events.subjects``), so a renamed stream,
durable or bucket changes the permissions with it. Passwords are never rendered: each user's is
the server's environment variable ``NATS_PASSWORD_<USER>`` (nats-server resolves ``$NAME`` from
its environment).

    python tools/gen_nats_auth.py            # write both files
    python tools/gen_nats_auth.py --check    # exit 1 on drift
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from seedance.events import subjects
from seedance.events.tokens import check_tenant, check_token

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "deploy" / "auth" / "users.yaml"
OUTPUTS = (
    REPO / "deploy" / "auth" / "nats-auth.conf",
    REPO / "deploy" / "k8s" / "base" / "nats" / "auth.conf",
)
JS_API = "$JS.API"
COSTS_STREAM = "SEEDANCE_COSTS"
SLICING_STREAM = "SEEDANCE_SLICING"

#: The subject families a service may publish on, by catalogue name.
FAMILIES = {
    "jobs": subjects.jobs.ALL,
    "telemetry": subjects.telemetry.ALL,
    "slicing": subjects.slicing.ALL,
    "routing": subjects.routing.ALL,
    "graph": subjects.graph.ALL,
    "costs": subjects.costs.ALL,
    "ledger": subjects.ledger.ALL,
}


@dataclass(frozen=True)
class User:
    name: str
    publish_allow: tuple[str, ...]
    publish_deny: tuple[str, ...] = ()
    subscribe_allow: tuple[str, ...] = ()
    #: Operators have no permissions block: they may do anything in the account.
    unrestricted: bool = False


def password_var(user: str) -> str:
    return "NATS_PASSWORD_" + user.upper().replace("-", "_")


tenant_inbox_prefix = subjects.inbox_prefix


def _stream_api(stream: str) -> list[str]:
    return [f"{JS_API}.STREAM.{op}.{stream}" for op in ("CREATE", "UPDATE", "INFO")]


def service_user(name: str, spec: dict[str, list[str]]) -> User:
    """A service may provision the catalogue, bind its own durables and publish its own family."""
    check_token("service", name)
    pub = [f"{JS_API}.INFO"]
    for stream in subjects.STREAMS:  # every replica provisions every stream at start-up
        pub += _stream_api(stream.name)
    for family in spec.get("publishes", []):
        if family not in FAMILIES:
            raise ValueError(f"{name}: unknown subject family {family!r} (know {sorted(FAMILIES)})")
        pub.append(FAMILIES[family])
    pub.append(subjects.dlq.subject(name))
    for durable in spec.get("consumes", []):
        c = subjects.consumer(durable)  # KeyError names an unknown durable
        pub += [
            f"{JS_API}.CONSUMER.CREATE.{c.stream}.{c.durable}",
            f"{JS_API}.CONSUMER.CREATE.{c.stream}.{c.durable}.>",
            f"{JS_API}.CONSUMER.DURABLE.CREATE.{c.stream}.{c.durable}",
            f"{JS_API}.CONSUMER.INFO.{c.stream}.{c.durable}",
            f"{JS_API}.CONSUMER.MSG.NEXT.{c.stream}.{c.durable}",
            # ack, nak, in-progress and term all go to the message's reply subject
            f"$JS.ACK.{c.stream}.{c.durable}.>",
        ]
        if not c.acked:
            # Each replica reads with its own ``<durable>-<replica>`` consumer, re-created at
            # every start from its checkpoint (see subjects.replica_consumer). A subject wildcard
            # is a whole token, so the grant is any consumer of that stream, which only this
            # service reads.
            pub += [
                f"{JS_API}.CONSUMER.CREATE.{c.stream}.*",
                f"{JS_API}.CONSUMER.CREATE.{c.stream}.*.>",
                f"{JS_API}.CONSUMER.DELETE.{c.stream}.*",
                f"{JS_API}.CONSUMER.INFO.{c.stream}.*",
                f"{JS_API}.CONSUMER.MSG.NEXT.{c.stream}.*",
            ]
    for bucket in spec.get("buckets", []):
        if bucket not in subjects.BUCKETS:
            raise ValueError(f"{name}: unknown KV bucket {bucket!r}")
        kv_stream = f"KV_{bucket}"
        pub += _stream_api(kv_stream)
        pub += [
            f"{JS_API}.STREAM.MSG.GET.{kv_stream}",
            f"{JS_API}.DIRECT.GET.{kv_stream}",
            f"{JS_API}.DIRECT.GET.{kv_stream}.>",
            f"$KV.{bucket}.>",
            # watches (the router's weights) read the bucket through an ordered consumer
            f"{JS_API}.CONSUMER.CREATE.{kv_stream}",
            f"{JS_API}.CONSUMER.CREATE.{kv_stream}.>",
            f"{JS_API}.CONSUMER.DELETE.{kv_stream}.>",
        ]
    for store in spec.get("object_stores", []):
        if store not in subjects.OBJECT_STORES:
            raise ValueError(f"{name}: unknown object store {store!r}")
        obj_stream = f"OBJ_{store}"
        pub += _stream_api(obj_stream)
        pub += [
            f"{JS_API}.STREAM.MSG.GET.{obj_stream}",
            f"{JS_API}.STREAM.PURGE.{obj_stream}",
            f"{JS_API}.DIRECT.GET.{obj_stream}.>",
            # a get reads the object's chunks through an ordered consumer
            f"{JS_API}.CONSUMER.CREATE.{obj_stream}",
            f"{JS_API}.CONSUMER.CREATE.{obj_stream}.>",
            f"{JS_API}.CONSUMER.DELETE.{obj_stream}.>",
            f"$O.{store}.>",
        ]
    return User(name=name, publish_allow=tuple(pub), subscribe_allow=("_INBOX.>",))


def tenant_user(tenant: str) -> User:
    """A tenant publishes its own jobs and follows its own costs; nothing else."""
    check_tenant(tenant)
    costs_filter = subjects.costs.tenant_wildcard(tenant)
    slicing_filter = subjects.slicing.tenant_wildcard(tenant)
    # Consumer names are one token, so "only its own consumers" cannot be a subject pattern; the
    # SDK names them with 48 random bits, and the catalogue's durables on the stream are denied.
    deny = []
    for stream in (COSTS_STREAM, SLICING_STREAM):
        for durable in [c.durable for c in subjects.CONSUMERS.values() if c.stream == stream]:
            deny += [
                # a tenant must not re-create a service's durable with its own filter
                f"{JS_API}.CONSUMER.CREATE.{stream}.{durable}.>",
                f"{JS_API}.CONSUMER.DELETE.{stream}.{durable}",
                f"{JS_API}.CONSUMER.INFO.{stream}.{durable}",
            ]
    pub = (
        f"{JS_API}.INFO",
        subjects.jobs.tenant_wildcard(tenant),
        # nats-server 2.10+: the filter travels in the subject, and the server checks it matches
        # the request body, so this permission confines the consumer to the tenant's costs.
        f"{JS_API}.CONSUMER.CREATE.{COSTS_STREAM}.*.{costs_filter}",
        f"{JS_API}.CONSUMER.DELETE.{COSTS_STREAM}.*",
        f"{JS_API}.CONSUMER.INFO.{COSTS_STREAM}.*",
        # flow-control replies of its push consumer
        f"$JS.FC.{COSTS_STREAM}.>",
        # The slicer's answers to its own job events (placements, releases, rejections): the
        # SDK and CLI wait on them; the filter is confined to the tenant's slicing subjects.
        f"{JS_API}.CONSUMER.CREATE.{SLICING_STREAM}.*.{slicing_filter}",
        f"{JS_API}.CONSUMER.DELETE.{SLICING_STREAM}.*",
        f"{JS_API}.CONSUMER.INFO.{SLICING_STREAM}.*",
        f"$JS.FC.{SLICING_STREAM}.>",
    )
    return User(
        name=f"tenant-{tenant}",
        publish_allow=pub,
        publish_deny=tuple(deny),
        subscribe_allow=(f"{tenant_inbox_prefix(tenant)}.>",),
    )


def users_from(source: dict[str, object]) -> list[User]:
    services = source.get("services") or {}
    tenants = source.get("tenants") or []
    operators = source.get("operators") or []
    assert isinstance(services, dict)
    assert isinstance(tenants, list)
    assert isinstance(operators, list)
    users = [service_user(name, spec or {}) for name, spec in services.items()]
    users += [tenant_user(t) for t in tenants]
    users += [
        User(name=check_token("operator", o), publish_allow=(), unrestricted=True)
        for o in operators
    ]
    names = [u.name for u in users]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate user names in {SOURCE.name}: {names}")
    return users


def _list(items: tuple[str, ...], indent: str) -> str:
    inner = "".join(f'{indent}  "{s}"\n' for s in items)
    return f"[\n{inner}{indent}]"


def render(users: list[User]) -> str:
    out = [
        "# Generated by tools/gen_nats_auth.py from deploy/auth/users.yaml (`make nats-auth`).",
        "# Do not edit: the tests fail when this file differs from a fresh render.",
        "# Each password is the server's environment variable named below.",
        "authorization {",
        "  users = [",
    ]
    for u in users:
        out += ["    {", f'      user: "{u.name}"', f"      password: ${password_var(u.name)}"]
        if not u.unrestricted:
            out.append("      permissions: {")
            pub = f"        publish: {{\n          allow: {_list(u.publish_allow, '          ')}\n"
            if u.publish_deny:
                pub += f"          deny: {_list(u.publish_deny, '          ')}\n"
            out.append(pub + "        }")
            sub = _list(u.subscribe_allow, "          ")
            out.append(f"        subscribe: {{\n          allow: {sub}\n        }}")
            out.append("      }")
        out.append("    }")
    out += ["  ]", "}", ""]
    return "\n".join(out)


def render_source(path: Path = SOURCE) -> str:
    return render(users_from(yaml.safe_load(path.read_text())))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--check", action="store_true", help="fail if the rendered files drifted")
    args = ap.parse_args()
    text = render_source()
    drifted = []
    for out in OUTPUTS:
        if args.check:
            if not out.exists() or out.read_text() != text:
                drifted.append(out.relative_to(REPO))
        else:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text)
            print(f"wrote {out.relative_to(REPO)}", file=sys.stderr)
    if drifted:
        print(
            f"out of date (run `make nats-auth`): {', '.join(map(str, drifted))}", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
