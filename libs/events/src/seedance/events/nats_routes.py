"""Who may join the NATS cluster as a route peer: the Kubernetes base's three servers only.

A route is a server-to-server link. A server that joins as one is trusted with every account
the cluster has: its own users (defined in its own config, under the accounts' public names)
publish and subscribe in each account outside every permission of ``auth.conf``, and its
JetStream API requests (deleting a stream included) are the cluster's. So the base's
``deploy/k8s/base/nats/nats.conf`` authenticates routes: ``cluster { authorization { user:
route, password: $NATS_ROUTE_PASSWORD } }``, and each pod dials its peers as that user with
that password in the route URLs (``NATS_ROUTES``, which the StatefulSet builds: nats-server
expands no variable inside a string, so the kubelet puts the password into the URLs).

The password follows the server password rule (`nats_config.check_server_password`: the
server parses the value as config syntax, and it stands in a URL). nats-server refuses to start
where the variable is unset, but takes an empty value: the cluster then admits ``route`` with
an empty password, so `route_password_problems` (``gen_nats_auth.py --check-env F --cluster``)
refuses it, and refuses a value that is also a user's password (whoever logs in with it would
join as a route). Compose and the dev overlay run one server, no cluster block, no route.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from seedance.events.nats_config import PasswordError, check_server_password

__all__ = ["ROUTES_VAR", "ROUTE_PASSWORD_VAR", "ROUTE_USER", "route_password_problems"]

#: The user a route authenticates as (public: the password is the secret).
ROUTE_USER = "route"
#: The Secret's key (``seedance-nats-passwords``, read by the NATS pods only).
ROUTE_PASSWORD_VAR = "NATS_ROUTE_PASSWORD"
#: The route URLs, credentials in them, as the StatefulSet hands them to nats.conf.
ROUTES_VAR = "NATS_ROUTES"


def route_password_problems(
    values: Mapping[str, str], *, interpolated: Collection[str] = ()
) -> list[str]:
    """The problems of the routes' password in environment ``values``, one line each, naming
    variables and never a value: unset, not following the rule (empty included), a ``$`` the
    env file's reader may replace (``interpolated``: it cannot be checked), or equal to a
    user's password (``NATS_PASSWORD_*``)."""
    var = ROUTE_PASSWORD_VAR
    if var not in values:
        return [f"{var} is not set: the NATS cluster's routes authenticate with it"]
    if var in interpolated:
        return [f"{var} holds a '$' in the env file, so it cannot be checked; write it without"]
    try:
        value = check_server_password(var, values[var])
    except PasswordError as exc:
        return [f"{exc} (an empty one admits any server as a route)"]
    return [
        f"{var} is the same as {other}: whoever logs in with it could join the cluster as a "
        "route; set its own (--new-password)"
        for other in sorted(values)
        if other.startswith("NATS_PASSWORD_") and values[other] == value
    ]
