"""An overlay's NATS pod as a local process: the pinned nats-server with the ``nats-config``
ConfigMap the rendered StatefulSet mounts and the environment its pod gets (the Secrets it loads
by ``envFrom``, ``POD_NAME`` from the downward API as the first pod's name).

What the test machine changes from the pod, and why: the client and monitoring ports (free ones,
the client's on loopback; the monitor keeps the config's host), and the pod's mount paths in the
config (the data volume, the ``/tmp`` emptyDir of the pid file) moved under ``tmp``: the files
of the ConfigMap are written beside the config, as the pod mounts them.
"""

from __future__ import annotations

import base64
from pathlib import Path

from seedance.testing.servers import NatsServer
from tests.unit.deploy.test_k8s import by_kind, render

__all__ = ["overlay_nats_server"]


def overlay_nats_server(overlay: str, tmp: Path) -> tuple[NatsServer, dict[str, str]]:
    """The overlay's first NATS pod as a local process, and the environment it was given."""
    docs = render(overlay)
    sts = by_kind(docs, "StatefulSet")["nats"]
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    namespace = sts["metadata"]["namespace"]
    env: dict[str, str] = {}
    secrets = {
        d["metadata"]["name"]: d
        for d in docs
        if d["kind"] == "Secret" and d["metadata"]["namespace"] == namespace
    }
    for source in container.get("envFrom", []):  # a Secret is read in its own namespace only
        secret = secrets[source["secretRef"]["name"]]
        env |= {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    for var in container["env"]:
        assert var["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name", var
        env[var["name"]] = f"{sts['metadata']['name']}-0"
    (volume,) = [v for v in pod["volumes"] if "configMap" in v]
    config = dict(by_kind(docs, "ConfigMap")[volume["configMap"]["name"]]["data"])
    conf = config.pop("nats.conf")
    root = tmp / f"{sts['metadata']['name']}-0"
    for mount in container["volumeMounts"]:
        if mount["name"] != volume["name"]:
            local = root / mount["name"]
            local.mkdir(parents=True)
            conf = conf.replace(f"{mount['mountPath']}/", f"{local}/")
    server = NatsServer(config=conf, files=config, env=env, monitor=True, store=root / "config")
    return server, env
