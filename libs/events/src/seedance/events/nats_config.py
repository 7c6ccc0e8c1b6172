"""nats-server's ``authorization`` block, rendered from ``seedance.events.permissions``.

The output is text for nats-server's config (compose mounts it, Kubernetes ships it as a
ConfigMap). What a deployment chooses (``deploy/auth/users.yaml``: its static tenants, its
operators, whether auth callout is on) is read into ``AuthChoices``, which gives the users, the
rendered block and the password check of an environment; ``tools/gen/gen_nats_auth.py`` is only
the entry point that reads that file and writes or checks the rendered copies, and the deploy
tests read the same functions. This module parses no YAML and opens no file: its callers hand it
the parsed document and the text.

Passwords are never rendered: each user's is the server's environment variable
``NATS_PASSWORD_<USER>``. nats-server parses such a value as config syntax, not as a string
(``12345678`` becomes an integer, ``true`` a boolean, ``2024-01-01`` a date, a leading ``-`` or a
space is a parse error), and then refuses to start; a quoted reference (``"$VAR"``) is not
expanded at all. So the rule is on the value: ``check_server_password`` accepts only what the
server always reads as a string (a letter, then letters, digits, ``_`` or ``-``, 8 to 128
long), and ``new_password`` makes one (32 characters). Tenants added at run time authenticate
through the auth callout (``seedance.core.auth_callout``), whose passwords nats-server never
parses.

With ``callout_issuer_var`` the block also enables nats-server 2.10+ auth callout: every user not
listed here is authorised by the callout service, which signs a user JWT with that account key
(the variable holds its public key) and the tenant permissions declared here; the block also
names the callout's curve key (``CALLOUT_XKEY_VAR``), to which the server seals each request.
"""

from __future__ import annotations

import ipaddress
import re
import secrets
import string
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from seedance.events.accounts import (
    ACCOUNTS,
    DELIVERIES,
    NODES_ACCOUNT,
    PULL_RESPONSE_THRESHOLD,
    RESPONSE_THRESHOLD,
    SEEDANCE_ACCOUNT,
    TENANTS_ACCOUNT,
    node_flow_control,
    node_pulls,
    node_services,
    node_streams,
    tenant_flow_control,
    tenant_services,
)
from seedance.events.env_file import EnvFile, EnvFileError, parse_env_file, read_env_file
from seedance.events.node_permissions import (
    FLEET_REPLAYER,
    NODE_AGENTS,
    fleet_replayer_user,
    node_user,
    shared_node_user,
    telemetry_replayer_user,
)
from seedance.events.permissions import (
    CALLOUT_USER,
    IDENTITIES,
    PermissionsError,
    User,
    operator_user,
    service_user,
    tenant_user,
)
from seedance.events.provision_permissions import provisioner_user

__all__ = [
    "CALLOUT_ISSUER_SEED_VAR",
    "CALLOUT_ISSUER_VAR",
    "CALLOUT_USER",
    "CALLOUT_XKEY_SEED_VAR",
    "CALLOUT_XKEY_VAR",
    "DEV_KEYS",
    "PASSWORD_RULE",
    "PUBLISH_IP_VAR",
    "RENDERED_FILES",
    "USERS_FILE",
    "AuthChoices",
    "EnvFile",
    "EnvFileError",
    "PasswordError",
    "check_server_password",
    "compose_values",
    "dev_password",
    "new_password",
    "parse_env_file",
    "password_var",
    "publish_ip",
    "published_beyond_loopback",
    "read_env_file",
    "render",
    "users",
]

CALLOUT_ISSUER_VAR = "NATS_AUTH_CALLOUT_ISSUER"
#: The callout's curve public key (X...): the server seals each request to it (the passwords
#: inside never cross the bus in clear) and opens the callout's sealed answers with it.
CALLOUT_XKEY_VAR = "NATS_AUTH_CALLOUT_XKEY"
#: The seeds of those two pairs, which the auth-callout service holds (the names
#: ``seedance.core.auth_callout`` reads; this layer cannot import it).
CALLOUT_ISSUER_SEED_VAR = "SEEDANCE_AUTH_CALLOUT_ISSUER_SEED"
CALLOUT_XKEY_SEED_VAR = "SEEDANCE_AUTH_CALLOUT_XKEY_SEED"

#: The auth callout's development key pairs, compose's defaults and the dev overlay's: public
#: like the ``dev_password``s, so anyone who has read the repository holds their seeds. With
#: the curve pair they open every login request the server sealed to it (passwords inside) that
#: they capture; with the account pair they sign user JWTs the server takes from the callout.
DEV_KEYS: Mapping[str, str] = MappingProxyType({
    CALLOUT_ISSUER_VAR: "AAAM7E74SUEY62M7DQIWU27G355GN5GPHRTS3GQJZYUUDWT7VIXICETG",
    CALLOUT_ISSUER_SEED_VAR: "SAAFASOSBLMMOOQO6CSXIBRI7XK6SXMPLNETSHWCFIOBHPBINCUEZJEEQM",
    CALLOUT_XKEY_VAR: "XB3KRVLKB3MODQQYB6KKB7STKSISCJNGRXA4VJ6AMG7C5Y26RPFENIDR",
    CALLOUT_XKEY_SEED_VAR: "SXAK5LLLBJVKLCOL3JPUHMQLNJYJHOARNDECKJWASLAO2CVAJR6EBKLLBE",
})  # fmt: skip
#: What a holder of each development seed can do, and the command that makes a new pair.
_DEV_KEY_RISK = {
    CALLOUT_ISSUER_VAR: "anyone holds its seed and signs user JWTs the server accepts from the "
    "callout; make a pair (seedance-auth new-issuer)",
    CALLOUT_XKEY_VAR: "anyone holds its seed and opens each login request sealed to it, "
    "password inside; make a pair (seedance-auth new-xkey)",
}
_DEV_KEY_RISK[CALLOUT_ISSUER_SEED_VAR] = _DEV_KEY_RISK[CALLOUT_ISSUER_VAR]
_DEV_KEY_RISK[CALLOUT_XKEY_SEED_VAR] = _DEV_KEY_RISK[CALLOUT_XKEY_VAR]
#: Why a variable whose env-file value compose interpolates cannot be checked.
_INTERPOLATED = (
    "holds a '$' in the env file, which compose replaces (from the shell, an earlier line, or "
    "a default written in it) before anything reads it, so it cannot be checked"
)

_PASSWORD = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{7,127}$")
PASSWORD_RULE = (
    "a letter, then letters, digits, '_' or '-', 8 to 128 characters "
    "(nats-server parses the variable's value as config: digits, true/false, dates, a leading "
    "'-' or spaces stop it from starting)"
)


#: Where a checkout keeps the deployment's choices and the rendered copies, relative to the
#: repository root: one source, two copies of the same output (compose mounts the first;
#: kustomize cannot read files above its root, hence the second, which it turns into the
#: ConfigMap). The generator writes them; the deploy tests compare them with a fresh render.
USERS_FILE = "deploy/auth/users.yaml"
RENDERED_FILES = ("deploy/auth/nats-auth.conf", "deploy/k8s/base/nats/auth.conf")
_CHOICES = (
    "tenants", "operators", "auth_callout", "nodes", "replay_nodes", "shared_node_users",
    "replay_fleet",
)  # fmt: skip


#: Where compose publishes NATS's client port on the host (``${NATS_PUBLISH_IP:-127.0.0.1}``):
#: unset or empty, the loopback only.
PUBLISH_IP_VAR = "NATS_PUBLISH_IP"
_LOOPBACK_DEFAULT = "127.0.0.1"
#: An address or a host name as `NATS_PUBLISH_IP` may name one (IPv6 unbracketed by `publish_ip`).
_HOST = re.compile(r"[A-Za-z0-9.:-]{1,253}")


class PasswordError(ValueError):
    """A password value nats-server would not read back as the same string."""


def password_var(user: str) -> str:
    return "NATS_PASSWORD_" + user.upper().replace("-", "_")


def check_server_password(var: str, value: str) -> str:
    """Return ``value`` if nats-server reads ``$var`` holding it as that string; else raise
    naming the variable (never the value) and the rule."""
    if not _PASSWORD.fullmatch(value):  # not match: its `$` passes a trailing newline
        why = "is empty" if not value else f"does not follow the rule ({len(value)} characters)"
        raise PasswordError(f"{var} {why}: a server password is {PASSWORD_RULE}")
    return value


def dev_password(user: str) -> str:
    """``user``'s public development password, the default compose (``${VAR:-dev-<user>}``)
    and the dev overlay ship: anyone who has read the repository knows it."""
    return f"dev-{user}"


def publish_ip(values: Mapping[str, str]) -> str:
    """``NATS_PUBLISH_IP`` of environment ``values`` as an address: blanks, one pair of
    surrounding quotes and an IPv6 address's brackets (``[::1]``, as a compose port is written)
    taken off; unset or empty, compose's default (``${NATS_PUBLISH_IP:-127.0.0.1}``)."""
    ip = (values.get(PUBLISH_IP_VAR) or "").strip()
    if len(ip) >= 2 and ip[0] == ip[-1] and ip[0] in "\"'":
        ip = ip[1:-1].strip()
    if ip.startswith("[") and ip.endswith("]"):
        ip = ip[1:-1].strip()
    return ip or _LOOPBACK_DEFAULT


def _shown_publish_ip(values: Mapping[str, str]) -> str:
    """``NATS_PUBLISH_IP=<value>`` for a message, the value only where it reads as an address
    or a host name: a quote left open on its line swallows the next lines of the env file (a
    password among them, after its ``NATS_PASSWORD_…=``), and a message never prints a secret."""
    value = values.get(PUBLISH_IP_VAR) or ""
    if _HOST.fullmatch(publish_ip(values)):
        return f"{PUBLISH_IP_VAR}={value}"
    return f"{PUBLISH_IP_VAR} not an address ({len(value)} characters)"


def published_beyond_loopback(values: Mapping[str, str]) -> bool:
    """Whether compose publishes NATS's client port to other machines under environment
    ``values``: ``NATS_PUBLISH_IP`` (`publish_ip`) set to an address that is not a loopback one:
    ``127.0.0.0/8``, ``::1``, an IPv4-mapped loopback (``::ffff:127.0.0.1``) and ``localhost``
    are the loopback; any other host name counts as beyond (compose hands it to the engine)."""
    ip = publish_ip(values)
    if ip.lower() == "localhost":
        return False
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return True
    mapped = getattr(address, "ipv4_mapped", None)
    return not (address.is_loopback or (mapped is not None and mapped.is_loopback))


def compose_values(
    file_values: Mapping[str, str], environ: Mapping[str, str]
) -> tuple[dict[str, str], tuple[str, ...]]:
    """What compose substitutes for the variables `--check-env` reads: an env file's
    ``file_values`` (``.env``), each overridden by the same variable in the shell's
    ``environ`` (compose prefers the shell's), and the names the shell's value won for."""
    read = [
        k for k in environ
        if k == PUBLISH_IP_VAR or k in DEV_KEYS or k.startswith("NATS_PASSWORD_")
    ]  # fmt: skip
    return {**file_values, **{k: environ[k] for k in read}}, tuple(sorted(read))


def new_password(length: int = 32) -> str:
    """A random password that follows ``PASSWORD_RULE`` (about 5.9 bits per character)."""
    alphabet = string.ascii_letters + string.digits
    return secrets.choice(string.ascii_letters) + "".join(
        secrets.choice(alphabet) for _ in range(length - 1)
    )


def users(
    tenants: Iterable[str],
    operators: Iterable[str],
    *,
    callout: bool,
    nodes: Iterable[str] = (),
    replay_nodes: Iterable[str] = (),
    shared_node_users: bool = True,
    replay_fleet: bool = False,
) -> list[User]:
    """Every static user: the declared identities, the provisioner (`seedance admin
    provision`), the listed tenants and operators, and the callout service's user when auth
    callout is on; one ``node-<node>`` user per listed node, the ``telemetry-replayer`` for the
    replay's nodes when there are any; the shared node users (``telemetry-collector``,
    ``node-agent``: any node's telemetry) only while ``shared_node_users`` (a cluster moving to
    per-node credentials, docs/security.md); and the replaying collector ``fleet-replayer``
    (any node's telemetry, in the nodes' account) only with ``replay_fleet``, last (no
    deployment replays a fleet: the demo's, the tests' and the benches' servers add it)."""
    skip = {FLEET_REPLAYER} | (set() if shared_node_users else set(NODE_AGENTS))
    if not callout:
        skip.add(CALLOUT_USER)
    out = [
        shared_node_user(name) if name in NODE_AGENTS else service_user(name)
        for name in IDENTITIES
        if name not in skip
    ]
    out.append(provisioner_user())
    replay = tuple(replay_nodes)
    if replay:
        out.append(telemetry_replayer_user(replay))
    out += [node_user(n) for n in nodes]
    out += [tenant_user(t) for t in tenants]
    out += [operator_user(o) for o in operators]
    out += [fleet_replayer_user()] if replay_fleet else []
    names = [u.name for u in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise PermissionsError(f"duplicate NATS user names: {dupes}")
    return out


def _list(items: tuple[str, ...], indent: str) -> str:
    inner = "".join(f'{indent}  "{s}"\n' for s in items)
    return f"[\n{inner}{indent}]"


def _perm_block(kind: str, allow: tuple[str, ...], deny: tuple[str, ...]) -> str:
    text = f"        {kind}: {{\n"
    if allow:
        text += f"          allow: {_list(allow, '          ')}\n"
    if deny:
        text += f"          deny: {_list(deny, '          ')}\n"
    return text + "        }"


def _user_entries(static: Iterable[User], indent: str) -> list[str]:
    out: list[str] = []
    for u in static:
        out += [f"{indent}{{", f'{indent}  user: "{u.name}"']
        out.append(f"{indent}  password: ${password_var(u.name)}")
        if not u.unrestricted:
            p = u.permissions
            out.append(f"{indent}  permissions: {{")
            out += [
                indent + line[4:]
                for line in (
                    _perm_block("publish", p.publish_allow, p.publish_deny).split("\n")
                    + _perm_block("subscribe", p.subscribe_allow, p.subscribe_deny).split("\n")
                )
            ]
            if p.allow_responses:
                # one reply per request received, to its reply subject (any inbox prefix)
                out.append(f"{indent}    allow_responses: true")
            out.append(f"{indent}  }}")
        out.append(f"{indent}}}")
    return out


def _crossings(indent: str) -> dict[str, list[str]]:
    """What each account exports and imports (`seedance.events.accounts`), keyed
    ``<account>_exports`` / ``<account>_imports``: ``SEEDANCE`` exports tenants' and nodes'
    services (answered within the threshold; a pull's many answers as a stream), the tenants'
    deliveries and the nodes' MIG plans, each only to the account that needs it; ``TENANTS``
    (and ``NODES``, where any) export their flow control to ``SEEDANCE`` only."""
    seedance, tenants, nodes = SEEDANCE_ACCOUNT, TENANTS_ACCOUNT, NODES_ACCOUNT
    out: dict[str, list[str]] = {f"{a}_{k}": [] for a in ACCOUNTS for k in ("exports", "imports")}
    once = f", response_threshold: {RESPONSE_THRESHOLD}"
    pull = f", response_type: stream, response_threshold: {PULL_RESPONSE_THRESHOLD}"
    services: dict[str, tuple[list[str], str]] = {}  # subject: (importers, answer terms)
    for importer, subject, terms in (
        *((tenants, s, once) for s in tenant_services()),
        *((nodes, s, once) for s in node_services()),
        *((nodes, s, pull) for s in node_pulls()),
    ):
        importers, had = services.setdefault(subject, ([], terms))
        if had != terms:
            raise PermissionsError(f"{subject}: exported as {had!r} and as {terms!r}")
        importers.append(importer)
    streams = [(DELIVERIES, tenants), *((s, nodes) for s in node_streams())]
    for kind, subject, importers, terms in (
        *(("service", s, i, t) for s, (i, t) in services.items()),
        *(("stream", s, [i], "") for s, i in streams),
    ):
        out[f"{seedance}_exports"].append(
            f'{indent}{{{kind}: "{subject}", accounts: [{", ".join(importers)}]{terms}}}'
        )
        for importer in importers:
            out[f"{importer}_imports"].append(
                f'{indent}{{{kind}: {{account: {seedance}, subject: "{subject}"}}}}'
            )
    for account, subjects in ((tenants, tenant_flow_control()), (nodes, node_flow_control())):
        for subject in subjects:
            out[f"{account}_exports"].append(
                f'{indent}{{stream: "{subject}", accounts: [{seedance}]}}'
            )
            out[f"{seedance}_imports"].append(
                f'{indent}{{stream: {{account: {account}, subject: "{subject}"}}}}'
            )
    return out


def _account(name: str, static: list[User], cross: dict[str, list[str]]) -> list[str]:
    return [
        f"  {name} {{",
        *(["    jetstream: enabled"] if name == SEEDANCE_ACCOUNT else []),
        "    users = [",
        *_user_entries((u for u in static if u.account == name), "      "),
        "    ]",
        "    exports = [",
        *cross[f"{name}_exports"],
        "    ]",
        "    imports = [",
        *cross[f"{name}_imports"],
        "    ]",
        "  }",
    ]


def render(static: list[User], *, source: str, callout_issuer_var: str | None = None) -> str:
    """The server's ``accounts`` block (``SEEDANCE``: every user but tenants' and nodes',
    JetStream, the services it exports; ``TENANTS``: the listed tenants; ``NODES``: the node-side
    users; each with its imports, `seedance.events.accounts`) and, with ``callout_issuer_var``,
    the ``authorization`` block that hands every user not listed here to the auth callout."""
    cross = _crossings("      ")
    out = [
        f"# Generated by tools/gen/gen_nats_auth.py from {source} (`make nats-auth`).",
        "# Do not edit: the tests fail when this file differs from a fresh render.",
        "# Each password is the server's environment variable named below; see "
        "docs/security.md for the rule its value must follow.",
        "# Tenants are users of an account of their own, which reaches Seedance's only through",
        "# the services exported to it: the server then rewrites each of a tenant's reply",
        "# subjects, so its acks and answers cannot land on Seedance's (docs/security.md).",
        "# Nodes' users (node-<node>, the shared node agents, the replayer) likewise.",
        "accounts {",
        *(line for name in ACCOUNTS for line in _account(name, static, cross)),
        "}",
    ]
    unknown = sorted({u.account for u in static} - set(ACCOUNTS))
    if unknown:
        raise PermissionsError(f"users of no rendered account: {unknown}")
    if callout_issuer_var:
        out += [
            "authorization {",
            "  # Every other user is authorised by the auth-callout service (tenants added at run",
            "  # time); its user JWTs are signed with the account key whose public key this is.",
            "  auth_callout {",
            f"    issuer: ${callout_issuer_var}",
            "    # Requests are sealed to the callout's curve key, answers to the server's: the",
            "    # passwords inside never cross the bus in clear (docs/security.md).",
            f"    xkey: ${CALLOUT_XKEY_VAR}",
            "    # The callout's own user is in Seedance's account; it places each user it",
            "    # admits in the account of its kind (a tenant in TENANTS, a node in NODES).",
            f"    account: {SEEDANCE_ACCOUNT}",
            "    auth_users: [",
            *(f'      "{u.name}"' for u in static),
            "    ]",
            "  }",
            "}",
        ]
    out.append("")
    return "\n".join(out)


def _names(doc: Mapping[str, object], key: str, what: str) -> tuple[str, ...]:
    value = doc.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PermissionsError(f"{key}: a list of {what}, not {value!r}")
    return tuple(value)


@dataclass(frozen=True, kw_only=True)
class AuthChoices:
    """What a deployment chooses: its static tenants, its operators, and whether auth callout
    authorises everyone else (tenants added at run time). Services are declared in
    ``seedance.events.permissions``, never here."""

    tenants: tuple[str, ...] = ()
    operators: tuple[str, ...] = ()
    auth_callout: bool = False
    #: Nodes with a static ``node-<node>`` user (others get theirs from the auth callout).
    nodes: tuple[str, ...] = ()
    #: The nodes a replaying collector speaks for (the ``telemetry-replayer`` user).
    replay_nodes: tuple[str, ...] = ()
    #: The shared node users of before issue 27: on while a cluster moves to per-node ones.
    shared_node_users: bool = True
    #: The replaying collector ``fleet-replayer`` (any node's telemetry): off in deploy/auth.
    replay_fleet: bool = False

    @classmethod
    def from_document(cls, doc: object, *, name: str = USERS_FILE) -> AuthChoices:
        """The choices of a parsed ``users.yaml`` (``None``: an empty file); an unknown key or
        a wrong type is refused naming it."""
        doc = doc or {}
        if not isinstance(doc, Mapping):
            raise PermissionsError(f"{name}: a mapping of {list(_CHOICES)}, not {doc!r}")
        unknown = set(doc) - set(_CHOICES)
        if unknown:
            raise PermissionsError(
                f"{name}: unknown keys {sorted(unknown)} (services are declared in "
                "seedance.events.permissions, not here)"
            )
        return cls(
            tenants=_names(doc, "tenants", "tenant ids"),
            operators=_names(doc, "operators", "user names"),
            auth_callout=bool(doc.get("auth_callout")),
            nodes=_names(doc, "nodes", "node names"),
            replay_nodes=_names(doc, "replay_nodes", "node names"),
            shared_node_users=bool(doc.get("shared_node_users", True)),
            replay_fleet=bool(doc.get("replay_fleet")),
        )

    def users(self) -> list[User]:
        return users(
            self.tenants, self.operators, callout=self.auth_callout, nodes=self.nodes,
            replay_nodes=self.replay_nodes, shared_node_users=self.shared_node_users,
            replay_fleet=self.replay_fleet,
        )  # fmt: skip

    def render(self, *, source: str = USERS_FILE) -> str:
        """The ``authorization`` block; ``source`` names the file in its header."""
        callout = CALLOUT_ISSUER_VAR if self.auth_callout else None
        return render(self.users(), source=source, callout_issuer_var=callout)

    def password_problems(
        self, values: Mapping[str, str], *, interpolated: Collection[str] = ()
    ) -> list[str]:
        """The problems of the passwords the rendered config needs in ``values`` (an
        environment), one line each, naming the variable and never the value; a password that
        is still its user's public development one (``dev_password``), or an auth callout key
        that is its public development one (`DEV_KEYS`, unset included), is one where NATS is
        published beyond the loopback (``published_beyond_loopback``), else a warning
        (``password_warnings``). A checked variable (a password, a callout key,
        ``NATS_PUBLISH_IP``) in ``interpolated`` (`EnvFile.interpolated`: compose replaces its
        ``$``) cannot be checked: it fails closed, as a development value would, and such a
        ``NATS_PUBLISH_IP`` counts as published beyond the loopback (and is a problem)."""
        unverified = self._unverified(interpolated)
        problems = []
        for user in self.users():
            var = password_var(user.name)
            if var not in values:
                problems.append(f"{var} is not set")
                continue
            if var in unverified:
                continue
            try:
                check_server_password(var, values[var])
            except PasswordError as exc:
                problems.append(str(exc))
        if PUBLISH_IP_VAR in unverified:
            problems.append(
                f"{PUBLISH_IP_VAR} {_INTERPOLATED}: whether NATS is published beyond this "
                "machine's loopback cannot be checked, so it counts as published; write the "
                "address itself"
            )
            where = f"{PUBLISH_IP_VAR} cannot be checked"
        else:
            where = _shown_publish_ip(values)
        if self._published(values, unverified):
            problems += [
                f"{var} {what}, and NATS is published beyond this machine ({where}): {risk}"
                for var, what, risk in self._public_defaults(values, unverified)
            ]
        return problems

    def password_warnings(
        self, values: Mapping[str, str], *, interpolated: Collection[str] = ()
    ) -> list[str]:
        """While NATS is on the loopback only: each password that is still its user's public
        development one, each of the auth callout's keys that is its public development one
        (`DEV_KEYS`), and each checked variable in ``interpolated``, which cannot be checked
        (`password_problems`); refused as problems once NATS is published beyond."""
        unverified = self._unverified(interpolated)
        if self._published(values, unverified):
            return []
        return [
            f"{var} {what}: safe only while NATS is on this machine's loopback "
            f"({PUBLISH_IP_VAR} unset or a loopback address)"
            for var, what, _ in self._public_defaults(values, unverified)
        ]

    def _unverified(self, interpolated: Collection[str]) -> list[str]:
        """The variables the check reads that are in ``interpolated``, sorted."""
        checked = {password_var(u.name) for u in self.users()} | {PUBLISH_IP_VAR}
        if self.auth_callout:
            checked |= set(DEV_KEYS)
        return sorted(checked.intersection(interpolated))

    @staticmethod
    def _published(values: Mapping[str, str], unverified: Collection[str]) -> bool:
        return PUBLISH_IP_VAR in unverified or published_beyond_loopback(values)

    def _public_defaults(
        self, values: Mapping[str, str], unverified: Collection[str] = ()
    ) -> list[tuple[str, str, str]]:
        """(variable, what it is, what anyone can do with it) of each value in ``values``
        that the repository publishes: a user's ``dev_password``; with auth callout on, a key
        of `DEV_KEYS`, or one of the two public keys the server's config names left unset or
        empty (compose then substitutes its development default). An unset seed is not
        named: it only breaks the callout where the public key is a new one, and a
        Kubernetes env file keeps the seeds in another Secret. A variable of ``unverified``
        (but ``NATS_PUBLISH_IP``, a problem of its own) is one whatever its text."""
        out = [
            (var, _INTERPOLATED, "it may stand for a public development value; write the "
             "value itself (single quotes keep a '$' as it is)")
            for var in unverified if var != PUBLISH_IP_VAR
        ]  # fmt: skip
        out += [
            (var, "is still the public development password",
             "anyone who can reach it logs in as that user; set a real one (--new-password)")
            for user in self.users()
            if (var := password_var(user.name)) not in unverified
            and values.get(var) == dev_password(user.name)
        ]  # fmt: skip
        if not self.auth_callout:
            return out
        for var, dev in DEV_KEYS.items():
            if var in unverified:
                continue
            value = values.get(var) or ""
            if value == dev:
                out.append((var, "is still the public development key", _DEV_KEY_RISK[var]))
            elif not value and var in (CALLOUT_ISSUER_VAR, CALLOUT_XKEY_VAR):
                what = "is not set, so compose substitutes the public development key"
                out.append((var, what, _DEV_KEY_RISK[var]))
        return out
