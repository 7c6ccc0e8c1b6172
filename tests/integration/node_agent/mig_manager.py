"""A test mig-manager: NVIDIA's k8s-mig-manager as the node agent meets it, through the API
server (real HTTP) and a constructed NVML MIG backend.

What the real one does (k8s-mig-manager and mig-parted's documentation): it watches its node's
``nvidia.com/mig.config`` label; when the label names a layout other than the one applied, it
sets ``nvidia.com/mig.config.state=pending``, reads the named layout from its ConfigMap of
mig-parted layouts (key ``config.yaml``), and applies it with mig-parted: every GPU whose
layout differs has all its instances destroyed and the layout's created, the driver choosing
each GPU instance's placement; then ``success`` (``failed`` when it could not: an unknown
layout name, a profile the GPU does not offer). Here the driver's choice is the constructed
backend's lowest free start slot the profile allows, larger profiles first.

Not covered (the real one does): pausing the GPU operator's own operands
(``nvidia.com/gpu.deploy.*=paused-for-mig-change``) and host GPU clients; MIG mode changes and
the GPU reset or reboot they need (``rebooting``); ``devices: all`` with device filters by
model; compute-instance profiles other than one spanning the GPU instance; its own restart.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import yaml
from kubernetes_asyncio import client, watch

from tests.unit.node_agent.nvml_mig import H200_PROFILES, ConstructedNvmlMig

__all__ = ["TestMigManager"]

CONFIG = "nvidia.com/mig.config"
STATE = "nvidia.com/mig.config.state"


class TestMigManager:
    __test__ = False  # not a pytest class

    def __init__(
        self,
        api_client: client.ApiClient,
        node: str,
        config_map: tuple[str, str],
        nvml: ConstructedNvmlMig,
        *,
        gate: asyncio.Event | None = None,
        hold: asyncio.Event | None = None,
    ) -> None:
        """``gate``: a new layout is acted on only once it is set (a manager that has not
        seen the label yet). ``hold``: once set, the state is written after the layout is
        applied (a real one writes ``success`` seconds after the GPU's instances exist: it
        applies GPU after GPU, then checks)."""
        self.core = client.CoreV1Api(api_client)
        self.gate = gate
        self.hold = hold
        self.node = node
        self.namespace, self.name = config_map
        self.nvml = nvml
        #: The layouts applied, in order.
        self.applied: list[str] = []
        self._current = ""
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        node = await self.core.read_node(self.node)
        self._current = (node.metadata.labels or {}).get(CONFIG, "")
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        """Level-triggered, as a controller: the Node read, acted on, then watched from its
        version until the watch ends (then read again); only ADDED and MODIFIED events carry
        the Node (BOOKMARK and ERROR events do not)."""
        while True:
            node = await self.core.read_node(self.node)
            await self._reconcile(node.metadata.labels or {})
            w = watch.Watch()
            async with w.stream(
                self.core.list_node,
                field_selector=f"metadata.name={self.node}",
                resource_version=node.metadata.resource_version,
                timeout_seconds=60,
            ) as events:
                async for event in events:
                    if event["type"] in ("ADDED", "MODIFIED"):
                        await self._reconcile(event["object"].metadata.labels or {})

    async def _reconcile(self, labels: dict[str, str]) -> None:
        wanted = labels.get(CONFIG, "")
        if wanted and wanted != self._current:
            if self.gate is not None:
                await self.gate.wait()
            self._current = wanted
            await self._label(STATE, "pending")
            ok = await self._apply(wanted)
            if self.hold is not None:
                await self.hold.wait()
            await self._label(STATE, "success" if ok else "failed")

    async def _label(self, key: str, value: str) -> None:
        await self.core.patch_node(
            self.node,
            {"metadata": {"labels": {key: value}}},
            _content_type="application/merge-patch+json",
        )

    async def _apply(self, name: str) -> bool:
        cm = await self.core.read_namespaced_config_map(self.name, self.namespace)
        configs = (yaml.safe_load((cm.data or {}).get("config.yaml", "")) or {}).get(
            "mig-configs", {}
        )
        if name not in configs:
            return False
        for group in configs[name]:
            devices = group["devices"]
            indices = range(len(self.nvml.gpus)) if devices == "all" else devices
            for index in indices:
                if not self._apply_gpu(index, group):
                    return False
        self.applied.append(name)
        return True

    def _apply_gpu(self, index: int, group: dict[str, Any]) -> bool:
        if not group.get("mig-enabled"):
            return not self.nvml.gpus[index].mig_enabled  # no MIG mode change here
        want = dict(group.get("mig-devices") or {})
        have: dict[str, int] = {}
        for i in self.nvml.gpu_instances(index):
            have[i.profile] = have.get(i.profile, 0) + 1
        if have == want:
            return True  # mig-parted leaves a GPU already in its layout alone
        for i in self.nvml.gpu_instances(index):
            for ci in i.ci_ids:
                self.nvml.destroy_compute_instance(index, i.gi_id, ci)
            self.nvml.destroy_gpu_instance(index, i.gi_id)
        order = sorted(want, key=lambda p: -H200_PROFILES[p][0] if p in H200_PROFILES else 0)
        for profile in order:
            if profile not in H200_PROFILES:
                return False
            for _ in range(want[profile]):
                slot = self._free_slot(index, profile)
                if slot is None:
                    return False
                gi = self.nvml.create_gpu_instance(index, profile, slot)
                self.nvml.create_compute_instance(index, gi)
        return True

    def _free_slot(self, index: int, profile: str) -> int | None:
        size, starts = H200_PROFILES[profile]
        used = {
            s
            for i in self.nvml.gpu_instances(index)
            for s in range(i.start_slot, i.start_slot + H200_PROFILES[i.profile][0])
        }
        return next((s for s in starts if not set(range(s, s + size)) & used), None)
