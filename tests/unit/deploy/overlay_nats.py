"""An overlay's NATS pod as a local process: the pinned nats-server with the ``nats-config``
ConfigMap the rendered StatefulSet mounts and the environment its pod gets (the Secrets it loads
by ``envFrom``, ``POD_NAME`` from the downward API as the pod's name, and each ``value`` the
container sets, with its ``$(VAR)`` references expanded as the kubelet does).

What the test machine changes from the pod, and why: the client and monitoring ports (free ones,
the client's on loopback; the monitor keeps the config's host), the pod's mount paths in the
config (the data volume, the ``/tmp`` emptyDir of the pid file) moved under ``tmp``: the files
of the ConfigMap are written beside the config, as the pod mounts them; and, for a cluster, each
pod-network address (``host:port``) named in ``addresses`` replaced in the config and the
environment by the loopback one given (the route port, the peers' headless names). An overlay
that brings no Secret (prod: created out of band) gets ``secret`` as the Secret's values.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from pathlib import Path

from seedance.testing.servers import NatsServer
from tests.unit.deploy.kubelet import pod_env
from tests.unit.deploy.test_k8s import by_kind, render

__all__ = ["overlay_nats_server"]


def overlay_nats_server(
    overlay: str,
    tmp: Path,
    *,
    pod: int = 0,
    secret: Mapping[str, str] | None = None,
    addresses: Mapping[str, str] | None = None,
    edit: Callable[[str], str] | None = None,
) -> tuple[NatsServer, dict[str, str]]:
    """The overlay's NATS pod number ``pod`` as a local process, and the environment it was
    given; ``edit``, where given, rewrites its ``nats.conf`` last (a config of another release)."""
    docs = render(overlay)
    sts = by_kind(docs, "StatefulSet")["nats"]
    pod_spec = sts["spec"]["template"]["spec"]
    (container,) = pod_spec["containers"]
    namespace = sts["metadata"]["namespace"]
    name = f"{sts['metadata']['name']}-{pod}"
    secrets = {
        d["metadata"]["name"]: {k: base64.b64decode(v).decode() for k, v in d["data"].items()}
        for d in docs  # a Secret is read in its own namespace only
        if d["kind"] == "Secret" and d["metadata"]["namespace"] == namespace
    }
    for source in container.get("envFrom", []):
        wanted = source["secretRef"]["name"]
        if wanted not in secrets:
            assert secret is not None, f"{overlay} brings no Secret {wanted}"
            secrets[wanted] = secret
    env = pod_env(container, secrets, name)
    (volume,) = [v for v in pod_spec["volumes"] if "configMap" in v]
    config = dict(by_kind(docs, "ConfigMap")[volume["configMap"]["name"]]["data"])
    conf = config.pop("nats.conf")
    for pod_address, local_address in (addresses or {}).items():
        conf = conf.replace(pod_address, local_address)
        env = {k: v.replace(pod_address, local_address) for k, v in env.items()}
    root = tmp / name
    for mount in container["volumeMounts"]:
        if mount["name"] != volume["name"]:
            local = root / mount["name"]
            local.mkdir(parents=True)
            conf = conf.replace(f"{mount['mountPath']}/", f"{local}/")
    if edit is not None:
        conf = edit(conf)
    server = NatsServer(config=conf, files=config, env=env, monitor=True, store=root / "config")
    return server, env
