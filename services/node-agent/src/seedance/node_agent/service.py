"""The node agent service: device plugins that honour the slicer, MIG plans, pod labels, shares.

Owns the wiring on one node: the bus (``ServiceRuntime``: health and metrics like every
service), the slicer's placements (``PlacementFeed``), one kubelet device plugin per resource
whose Allocate is the ``PlacementAllocator``, registered once the feed's replay is applied and
the grants of the pods already holding devices are rebuilt (those the API server shows
started and those the kubelet's pod-resources ``List`` names), and again whenever the kubelet
restarts (``KubeletWatch``), MIG plans for this node applied through
``MigApplier`` (then the new instances advertised without restarting a plugin), pod labels
from the kubelet's pod-resources API, and per-pod measured shares from NVML. Each container
starts only once the allocator confirms, from the kubelet's pod-resources records, that its
pod is the one its devices were granted for (``PreStartContainer``). Before any plugin
registers, the start is refused where another device plugin (NVIDIA's) serves a resource it
would serve (``plugin_check``). MIG plans go through NVML, or through NVIDIA's mig-manager
where the node's labels show it owns MIG (``mig_manager``). On a development cluster without
GPUs the node's GPUs are simulated (``core.simulated``) and their telemetry published
(``simulated``). ``main()`` only loads settings and builds the objects. It must not place
anything: it enforces and measures.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any, Protocol

import grpc

from seedance.core import ServiceRuntime, WallClock, serve
from seedance.core.clock import Clock
from seedance.core.entry import start_service
from seedance.core.logs import get_logger
from seedance.events.gpus import mig_profile_of_resource
from seedance.events.slicing import MigLayoutPlan
from seedance.events.subjects import telemetry
from seedance.events.tokens import kube_node_token
from seedance.node_agent.allocator import PlacementAllocator
from seedance.node_agent.core.cgroup import pod_of_cgroup
from seedance.node_agent.core.labels import ContainerDevices
from seedance.node_agent.core.placement import NodeDevices, Refusal
from seedance.node_agent.core.share_event import MeasuredPod, pod_shares_event
from seedance.node_agent.core.shares import (
    MemoryPeaks,
    ProcessSample,
    ShareAccumulator,
    pod_memory,
    pod_shares,
)
from seedance.node_agent.core.simulated import SimulatedGpus, parse_mig_layout
from seedance.node_agent.deviceplugin import (
    DeviceKind,
    DevicePluginServer,
    KubeletWatch,
    PluginDevice,
    Registration,
)
from seedance.node_agent.kube import NodePods, ThisNode, connect
from seedance.node_agent.metrics import NodeAgentMetrics
from seedance.node_agent.mig import MigBackend, NvmlMigBackend
from seedance.node_agent.mig_manager import PlanApplier, mig_applier
from seedance.node_agent.nvml import NvmlNode
from seedance.node_agent.placements import PlacementFeed
from seedance.node_agent.plans import PlanFeed
from seedance.node_agent.plugin_check import OWN_SOCKET_PREFIX, refuse_if_served
from seedance.node_agent.podlabels import PodLabeller
from seedance.node_agent.podresources import PodResourcesClient
from seedance.node_agent.settings import NodeAgentSettings
from seedance.node_agent.simulated import SimulatedTelemetry

__all__ = ["NAME", "GpuSource", "NodeAgentService", "advertised", "main"]

NAME = "node-agent"
#: The reason of the Warning Event on a pod whose container start is refused (docs/node-agent.md).
EVENT_DEVICES_REFUSED = "SeedanceDevicesRefused"
#: One MIG instance of whatever profile the slicer placed (a pod asking for "a MIG instance":
#: the SlicingPolicy's default profile).
RES_MIG = "seedance.io/mig"
#: Replicas of one shared GPU the ``seedance.io/gpu-milli`` plugin advertises (thousandths).
MILLI_PER_GPU = 1000

log = get_logger(__name__)


def advertised(resource: str, devices: NodeDevices) -> list[PluginDevice]:
    """What a resource's plugin lists: counts the kubelet allocates from. Which devices a
    container really gets is the placement's (``PlacementAllocator``), not these IDs."""
    if resource == "seedance.io/gpu-milli":
        return [
            PluginDevice(
                id=f"{uuid}::{k}",
                kind=DeviceKind.SHARED,
                uuid=uuid,
                gpu_uuid=uuid,
                active_thread_pct=100,
            )
            for uuid in devices.gpus.values()
            for k in range(MILLI_PER_GPU)
        ]
    if resource.startswith("nvidia.com/mig-") or resource == RES_MIG:
        # seedance.io/mig: an instance of any profile (the slicer's placement names which one:
        # the SlicingPolicy's default profile); nvidia.com/mig-<profile>: of that profile (as
        # NVML names it: the resource's 1g.10gb.me is 1g.10gb+me).
        profile = mig_profile_of_resource(resource.removeprefix("nvidia.com/mig-"))
        return [
            PluginDevice(id=uuid, kind=DeviceKind.MIG, uuid=uuid, gpu_uuid=parent)
            for (parent, prof, _slot), uuid in sorted(devices.mig.items())
            if resource == RES_MIG or prof == profile
        ]
    return [
        PluginDevice(id=uuid, kind=DeviceKind.WHOLE_GPU, uuid=uuid, gpu_uuid=uuid)
        for i, uuid in devices.gpus.items()
        if i not in devices.mig_enabled  # a GPU in MIG mode serves its instances only
    ]


class GpuSource(Protocol):
    """The node's GPUs as the agent reads them: NVML's (``NvmlNode``) or simulated ones."""

    def devices(self) -> NodeDevices: ...
    def process_samples(self, gpu_index: int, since_us: int = 0) -> list[ProcessSample]: ...
    def process_memory_mib(self, gpu_index: int) -> dict[int, float | None]: ...


class NodeAgentService:
    def __init__(
        self,
        runtime: ServiceRuntime,
        settings: NodeAgentSettings,
        *,
        kube_client: Any,
        nvml: GpuSource,
        mig: MigBackend | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._rt = runtime
        self._s = settings
        self._kube = kube_client
        self._nvml = nvml
        self._clock = clock or WallClock()
        self.metrics = NodeAgentMetrics(runtime.registry)
        self._devices = nvml.devices()
        self._feed: PlacementFeed | None = None
        self._plugins: list[DevicePluginServer] = []
        #: The read of the devices after a plan failed: the labels loop tries it again.
        self._devices_stale = False
        self._watch: KubeletWatch | None = None
        self._mig_backend = mig
        #: How a MIG plan is applied here (chosen at start from the node's labels); None: no
        #: MIG backend (simulated GPUs).
        self._mig: PlanApplier | None = None
        self._plans: PlanFeed | None = None
        self._node = ThisNode(kube_client, settings.node_name)
        self._pods = PodResourcesClient(settings.pod_resources_socket)
        self._allocator: PlacementAllocator | None = None
        self._labeller: PodLabeller | None = None
        self._shares: dict[int, ShareAccumulator] = {}  # GPU index -> its per-process cursors
        self._memory: dict[int, MemoryPeaks] = {}  # GPU index -> the window's memory peaks

    async def start(self) -> None:
        if self._feed is not None:
            return
        # Before anything connects or registers: a node where another plugin (NVIDIA's)
        # serves these resources is refused with what to switch off (StartRefused).
        await refuse_if_served(
            node=self._node,
            pods=self._pods,
            resources=self._s.resource_names,
            plugin_dir=self._s.device_plugin_dir,
            clock=self._clock,
            metrics=self.metrics,
            wait_s=self._s.plugin_conflict_wait_s,
        )
        await self._choose_mig()
        # Not ready until the plugins serve: the replay waits for the node agents' mirror to
        # have copied the decisions (seedance.core.mirror), then applies them.
        self._rt.waiting_on = "placement_replay"
        await self._rt.start()
        self._feed = PlacementFeed(self._rt.bus, self._s.node_name)
        await self._feed.start()
        pods = NodePods(self._kube, self._s.node_name)
        self._allocator = PlacementAllocator(
            node=self._s.node_name,
            book=self._feed.book,
            pending=pods.pending,
            devices=lambda: self._devices,
            kubelet=self._pods.list_pods,
            metrics=self.metrics,
            placement_news=self._feed.news,
            placement_wait_s=self._s.placement_wait_s,
            warn=lambda pod, message: pods.warn(
                *pod, EVENT_DEVICES_REFUSED, message, self._clock.now()
            ),
        )
        self._feed.on_end = self._allocator.job_ended
        # Registered only once the replay is applied: the kubelet may send an Allocate the
        # moment a plugin registers, and it must be checked against every placement the
        # stream holds, not refused for one not read yet.
        await self._feed.catch_up()
        # And once the grants of the pods past Allocate are rebuilt (checked against that
        # replay): else the first Allocate could hand a device such a pod holds to another
        # pod. An API server that does not answer fails the start (the DaemonSet restarts the
        # agent); a kubelet that does not answer only narrows the view to the API server's.
        await self._restore_grants(pods)
        self._labeller = PodLabeller(
            self._pods, self.metrics, known_uuids=self._known_uuids, granted=self._granted
        )
        if isinstance(self._nvml, SimulatedGpus):
            # The node's inventory is on the bus before its plugins register: the slicer
            # places on it only once it knows it.
            telemetry_ = SimulatedTelemetry(
                self._rt.bus,
                self._nvml,
                self._node,
                self._feed.book.placements,
                clock=self._clock,
                metrics=self.metrics,
                sample_interval_s=self._s.simulated_sample_interval_s,
            )
            await telemetry_.publish_inventory()
            self._rt.loop(telemetry_.run)
        for resource in self._s.resource_names:
            await self._serve_plugin(resource)
        self._watch = KubeletWatch(
            self._plugins,
            os.path.join(self._s.device_plugin_dir, "kubelet.sock"),
            poll_interval_s=self._s.kubelet_poll_interval_s,
            on_registered=self._registered,
            on_failed=self._register_failed,
            clock=self._clock,
        )
        await self._watch.check()  # registers now if the kubelet is there; else when it is
        # Plans are read from their stream with the node's own reader, bound before start
        # returns: a plan stored at any time from the bind on, and those stored before it
        # (while the agent was down), are read; none depends on where the slicer published it
        # in a NATS cluster (a core subscription did: plans.py).
        if self._mig is not None:
            self._plans = PlanFeed(
                self._rt.bus,
                self._s.node_name,
                apply=self._apply_plan,
                in_effect=self._mig.in_effect,
                skipped=lambda outcome: self.metrics.mig_plans_total.labels(outcome).inc(),
                clock=self._clock,
            )
            await self._plans.start()
            self._rt.loop(self._plans_loop)
        self._rt.loop(self._feed.run)
        self._rt.waiting_on = None
        self._rt.loop(self._labels_loop)
        self._rt.loop(self._shares_loop)
        self._rt.loop(self._watch.run)

    async def _choose_mig(self) -> None:
        """NVML, or mig-manager where the node's labels show it owns MIG (looked at once, at
        start: a mig-manager deployed later is seen at the agent's next start)."""
        if self._mig_backend is None:
            return
        labels = ((await self._node.get()).get("metadata") or {}).get("labels") or {}
        self._mig = mig_applier(
            self._mig_backend,
            labels,
            self._s,
            api_client=self._kube,
            node=self._node,
            gpus=lambda: sorted(self._devices.gpus),
            allocated=self._pods_on_gpu,
            clock=self._clock,
        )

    def _read_devices(self) -> NodeDevices:
        raw = self._nvml.devices()
        manager = self._mig.manager if self._mig is not None else None
        return raw if manager is None else manager.devices(raw)

    async def _restore_grants(self, pods: NodePods) -> None:
        assert self._allocator is not None
        rows = await self._kubelet_allocated()
        allocated = {(r.namespace, r.pod) for r in rows}
        restored = self._allocator.restore(
            await pods.holding(allocated), self._s.resource_names, rows
        )
        for r in restored:
            outcome = "refused" if isinstance(r.result, Refusal) else "restored"
            self.metrics.restored_grants_total.labels(r.resource, outcome).inc()
        log.info(
            "node_agent_grants_restored",
            restored=sum(not isinstance(r.result, Refusal) for r in restored),
            refused=sum(isinstance(r.result, Refusal) for r in restored),
            kubelet_reported=len(allocated),
        )

    async def _kubelet_allocated(self) -> list[ContainerDevices]:
        """The kubelet's pod-resources ``List`` rows of containers holding devices of a served
        resource (their pods are past Allocate even while their containers wait: the API
        server cannot tell those). Empty when the kubelet does not answer: the restore goes on
        with the API server's view (a kubelet that comes back is ``KubeletWatch``'s)."""
        served = set(self._s.resource_names)
        try:
            rows = await self._pods.list_pods()
        except grpc.RpcError as exc:
            self.metrics.pod_resources_failures_total.labels("restore").inc()
            log.warning("pod_resources_unreachable", use="restore", error=str(exc))
            return []
        return [r for r in rows if r.resource in served and r.device_ids]

    async def _serve_plugin(self, resource: str) -> None:
        assert self._allocator is not None
        name = resource.replace("/", "_").replace(".", "-")
        plugin = DevicePluginServer(
            resource_name=resource,
            socket_path=os.path.join(self._s.device_plugin_dir, f"{OWN_SOCKET_PREFIX}{name}.sock"),
            devices=advertised(resource, self._devices),
            mps_pipe_directory=self._s.mps_pipe_directory or None,
            allocate=self._counted(resource),
            # The kubelet calls PreStartContainer before each container start: the agent's
            # check that the pod holding the devices is the one they were granted for.
            pre_start=self._allocator.pre_start,
        )
        await plugin.start()
        self._plugins.append(plugin)

    def _registered(self, resource: str, why: Registration) -> None:
        self.metrics.plugin_registrations_total.labels(resource, why.value).inc()

    def _register_failed(self, resource: str) -> None:
        self.metrics.plugin_registration_failures_total.labels(resource).inc()

    def _counted(self, resource: str) -> Any:
        assert self._allocator is not None
        allocate = self._allocator.allocate

        async def counted(res: str, ids: Any) -> Any:
            try:
                out = await allocate(res, ids)
            except Exception:
                self.metrics.allocations_total.labels(resource, "refused").inc()
                raise
            self.metrics.allocations_total.labels(resource, "granted").inc()
            return out

        return counted

    def _known_uuids(self) -> list[str]:
        return [*self._devices.gpus.values(), *self._devices.mig.values()]

    def _granted(self) -> dict[tuple[str, str], tuple[str, ...]]:
        assert self._allocator is not None
        return self._allocator.granted_by_pod()

    def _pods_on_gpu(self, gpu_index: int) -> list[str]:
        uuid = self._devices.gpus.get(gpu_index, "")
        mig = {u for (parent, _p, _s), u in self._devices.mig.items() if parent == uuid}
        owners = self._labeller.owners if self._labeller else {}
        return sorted({f"{o.namespace}/{o.pod}" for u in {uuid, *mig} for o in owners.get(u, [])})

    async def _plans_loop(self) -> None:
        assert self._plans is not None
        assert self._labeller is not None
        # The pods holding each GPU first: a plan (one read back at a start too) is applied
        # only to a GPU no pod holds, which the labeller knows once the kubelet has answered
        # it. Until then no plan is read (the stream keeps them); the labels loop asks again.
        try:
            await self._labeller.refresh()
        except grpc.RpcError as exc:
            self.metrics.pod_resources_failures_total.labels("plans").inc()
            log.warning(
                "mig_plans_deferred",
                reason="the kubelet's pod-resources List did not answer: which pods hold each "
                "GPU is unknown; plans wait until it answers",
                error=str(exc),
            )
            await self._labeller.answered.wait()
            log.info("mig_plans_resumed")
        await self._plans.run()

    async def _apply_plan(self, plan: MigLayoutPlan) -> None:
        assert self._mig is not None
        result = await self._mig.apply(plan)
        self.metrics.mig_plans_total.labels(result.outcome.value).inc()  # its one count
        await self._refresh_devices()

    async def _refresh_devices(self) -> None:
        """The node's devices read again and advertised (new instances without a plugin
        restart). A failure is the refresh's own, counted and logged, and tried again by the
        labels loop: raised, it counted the plan applied before as failed too, and the
        plugins kept advertising the devices from before it."""
        try:
            self._devices = self._read_devices()
            for plugin in self._plugins:
                await plugin.set_devices(advertised(plugin.resource_name, self._devices))
        except Exception as exc:
            self._devices_stale = True
            self.metrics.device_refresh_failures_total.inc()
            log.error("node_agent_devices_refresh_failed", error=f"{type(exc).__name__}: {exc}")
            return
        self._devices_stale = False

    async def _labels_loop(self) -> None:
        assert self._labeller is not None
        assert self._feed is not None
        while True:
            self.metrics.placements.set(len(self._feed.book))
            if self._devices_stale:
                await self._refresh_devices()
            try:
                await self._labeller.refresh()
            except grpc.RpcError as exc:  # the kubelet restarting: its socket comes back
                self.metrics.pod_resources_failures_total.labels("labels").inc()
                log.warning("pod_resources_unreachable", use="labels", error=str(exc))
            await self._clock.sleep(self._s.labels_interval_s)

    async def _shares_loop(self) -> None:
        """Each window: every GPU's per-pod shares to the metrics and, as one
        ``gpu.pod_share.v1`` of the node, to the bus (the ledger bills shared GPUs by it)."""
        start = self._clock.now()
        node = kube_node_token(self._s.node_name)
        for index in self._devices.gpus:  # the first window's periods start with it
            self._shares.setdefault(index, ShareAccumulator(self._now_us()))
        # Memory is read `reads` times a window, evenly, the last at its end: its peak is sent.
        reads = max(1, round(self._s.shares_interval_s / self._s.memory_sample_s))
        while True:
            for _ in range(reads):
                await self._clock.sleep(self._s.shares_interval_s / reads)
                for index in self._devices.gpus:
                    used = self._nvml.process_memory_mib(index)
                    self._memory.setdefault(index, MemoryPeaks()).add(
                        pod_memory(used, self._pod_of_pid)
                    )
            measured = [
                m for index, uuid in self._devices.gpus.items()
                for m in self._publish_shares(index, uuid)
            ]  # fmt: skip
            end = self._clock.now()
            # Published even when no pod ran: a window without a pod's share then reads as 0
            # for it (the ledger averages a job's share over all the node's windows).
            event = pod_shares_event(node, start, end, measured)
            await self._rt.bus.publish(telemetry.pod_share(node), event)
            start = end

    def _now_us(self) -> int:
        # NVML stamps its samples with CPU time (µs since the epoch): periods end on that clock.
        return int(self._clock.now().timestamp() * 1e6)

    def _pod_of_pid(self, pid: int) -> str | None:
        try:
            text = (Path(self._s.proc_root) / str(pid) / "cgroup").read_text()
        except OSError:
            return None  # the process ended since the sample
        found = pod_of_cgroup(text)
        return None if found is None else found.pod_uid

    def _publish_shares(self, index: int, uuid: str) -> list[MeasuredPod]:
        """One GPU's per-pod shares into the metrics; returned with each pod's placement."""
        assert self._allocator is not None
        acc = self._shares.get(index)
        peaks = self._memory.pop(index, None)
        if acc is None:  # a GPU new since: its first period starts now (older samples are not ours)
            self._shares[index] = ShareAccumulator(self._now_us())
            return []
        samples = self._nvml.process_samples(index, acc.since_us)
        per_pod = pod_shares(acc.close_period(samples, self._now_us()), self._pod_of_pid)
        memory = {} if peaks is None else peaks.close()
        periods = acc.last_slots
        names = self._allocator.names_by_uid()
        owners = self._labeller.owners.get(uuid, []) if self._labeller else []
        out = []
        # Only pods NVML sampled: a pod holding memory without samples of its own is not read
        # as idle, since under MPS the clients' utilisation is the MPS server's (docs).
        for pod_uid, share in per_pod.items():
            ns, name = names.get(pod_uid, ("", pod_uid))
            containers = sorted({o.container for o in owners if (o.namespace, o.pod) == (ns, name)})
            container = containers[0] if len(containers) == 1 else ""
            self.metrics.pod_sm_share_ratio.labels(uuid, name, ns, container).set(
                share.sm_pct / 100
            )
            self.metrics.pod_mem_share_ratio.labels(uuid, name, ns, container).set(
                share.mem_pct / 100
            )
            tenant, job = self._placement_of(pod_uid)
            out.append(
                MeasuredPod(
                    gpu_index=index,
                    gpu_uuid=uuid,
                    pod_uid=pod_uid,
                    share=share,
                    periods=periods,
                    namespace=ns,
                    pod=name if pod_uid in names else "",
                    tenant=tenant,
                    job_id=job,
                    mem_used_mib=memory.get(pod_uid),
                )
            )
        return out

    def _placement_of(self, pod_uid: str) -> tuple[str, str]:
        """(tenant, job) of the slicer's placement the pod was granted against; empty if none
        (the tenant is the slicer's, never the pod's annotation)."""
        assert self._allocator is not None
        assert self._feed is not None
        grant = self._allocator.allocations.granted(pod_uid)
        placed = self._feed.book.get(grant.tenant, grant.job_id) if grant is not None else None
        return (placed.tenant, placed.job_id) if placed is not None else ("", "")

    async def run(self) -> None:
        await self.start()
        await self._rt.run()

    async def stop(self) -> None:
        await self._rt.stop()

    async def close(self) -> None:
        if self._plans is not None:
            await self._plans.close()
        for plugin in self._plugins:
            await plugin.stop()
        self._plugins.clear()
        if self._feed is not None:
            await self._feed.close()
        await self._pods.close()
        await self._rt.close()


async def _serve(settings: NodeAgentSettings, runtime: ServiceRuntime) -> None:
    kube = await connect(settings.kubeconfig or os.environ.get("KUBECONFIG") or None)
    gpus: GpuSource
    mig: MigBackend | None
    if settings.simulated_gpus:
        # A development cluster without GPUs: NVML is never loaded.
        gpus = SimulatedGpus(
            node=settings.node_name,
            model=settings.simulated_gpu_model,
            count=settings.simulated_gpus,
            pool=settings.simulated_pool,
            mig_gpus=settings.simulated_mig_gpus,
            mig_layout=parse_mig_layout(settings.simulated_mig_layout),
        )
        # The slicer's MIG plans are applied to the simulated instances as NVML's would be.
        mig = gpus.mig if settings.simulated_mig_gpus else None
    else:
        gpus, mig = NvmlNode(), NvmlMigBackend()
    service = NodeAgentService(runtime, settings, kube_client=kube, nvml=gpus, mig=mig)
    try:
        await serve(service)  # stops and closes the service
    finally:
        await kube.close()


SUMMARY = (
    "The node agent (one per GPU node, a DaemonSet): the kubelet's device plugin that enforces "
    "the slicer's placements on the node, applies MIG plans, and measures what each pod uses. "
    "The API server from KUBECONFIG (or SEEDANCE_NODE_AGENT_KUBECONFIG), else the pod's "
    "service account."
)


def main() -> None:
    settings, bus = start_service(NAME, NodeAgentSettings, summary=SUMMARY)
    runtime = ServiceRuntime(NAME, bus, http_host=settings.http_host, http_port=settings.http_port)
    asyncio.run(_serve(settings, runtime))
