"""MIG plans applied through NVIDIA's mig-manager, on nodes where the GPU operator runs it.

Owns the agent's side of mig-manager's contract (``core.migparted`` says what the contract is
and what it cannot express): for a plan, the node's layout with the plan applied is added to
the ConfigMap of named layouts mig-manager reads (``SEEDANCE_NODE_AGENT_MIG_MANAGER_CONFIG``;
read, then replaced at the resourceVersion read, so agents of several nodes adding layouts at
once never lose one another's), the node's ``nvidia.com/mig.config`` label set to its name, and
the result awaited: ``nvidia.com/mig.config.state`` ``success`` with NVML showing the plan's
instances on the GPU (a ``success`` left from an earlier layout is not taken for this one), or
``failed``, or the timeout. The same refusals as the NVML path come first (MIG mode off, a
compute process or a pod on the GPU). The slicer's start slots are then paired with the ones
mig-manager created (``slot_of``), which Allocate resolves through.

``refusing`` is the applier where mig-manager runs but the agent was not given its ConfigMap:
every plan is refused with what to set (the agent never creates instances beside mig-manager).
It must not create or destroy MIG instances itself, nor touch another node's label.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from seedance.core.clock import Clock
from seedance.core.logs import get_logger
from seedance.events.slicing import MigLayoutPlan
from seedance.node_agent.core.mig import MigInstance
from seedance.node_agent.core.migparted import (
    CONFIG_KEY,
    MIG_CONFIG_LABEL,
    MIG_STATE_LABEL,
    LayoutError,
    layout_entry,
    layout_name,
    mig_manager_present,
    pair_slots,
    target_layouts,
    with_layout,
)
from seedance.node_agent.core.placement import NodeDevices
from seedance.node_agent.kube import ThisNode
from seedance.node_agent.mig import MigApplier, MigBackend, MigOutcome, MigResult, drained_refusal
from seedance.node_agent.settings import NodeAgentSettings

__all__ = ["ApplyPlan", "MigManagerApplier", "PlanApplier", "mig_applier", "refusing"]

log = get_logger(__name__)

#: Concurrent writers of the ConfigMap (other nodes' agents) make a replace fail with 409; the
#: read-modify-write is tried again this many times.
_WRITE_ATTEMPTS = 8

#: What a call to the API server raises when it refuses (an error status), breaks off or does
#: not answer in time (``ThisNode``'s bound): the plan fails with it (the allocator's set).
_API_ERRORS = (client.ApiException, aiohttp.ClientError, TimeoutError, OSError)


#: How the agent applies a plan on this node (NVML, mig-manager, or a refusal).
ApplyPlan = Callable[[MigLayoutPlan], Awaitable[MigResult]]


@dataclass(frozen=True, slots=True)
class PlanApplier:
    """How plans are applied on this node: ``apply``; ``in_effect``, whether the node shows a
    plan done (None where it cannot tell: `core.mig.plans_to_apply`); and the mig-manager
    applier where it applies them (Allocate resolves the slicer's slots through it)."""

    apply: ApplyPlan
    in_effect: Callable[[MigLayoutPlan], bool] | None
    manager: MigManagerApplier | None


def mig_applier(
    backend: MigBackend,
    labels: Mapping[str, str],
    settings: NodeAgentSettings,
    *,
    api_client: Any,
    node: ThisNode,
    gpus: Callable[[], list[int]],
    allocated: Callable[[int], list[str]],
    clock: Clock,
) -> PlanApplier:
    """How plans are applied on a node with these ``labels``: through NVML where mig-manager
    does not own MIG, through it where the agent was given its ConfigMap, else refused."""
    config_map = settings.mig_manager_config_map
    manager = None
    in_effect: Callable[[MigLayoutPlan], bool] | None = None
    if not mig_manager_present(labels):
        nvml = MigApplier(backend, allocated=allocated)

        async def apply(plan: MigLayoutPlan) -> MigResult:
            return await asyncio.to_thread(nvml.apply, plan)

        in_effect = nvml.in_effect
        via = "nvml"
    elif config_map is None:
        refuse = refusing(str(labels.get(MIG_CONFIG_LABEL, "")))

        async def apply(plan: MigLayoutPlan) -> MigResult:
            return refuse(plan)

        via = "mig-manager-unconfigured"
    else:
        manager = MigManagerApplier(
            backend,
            api_client,
            node,
            config_map,
            gpus=gpus,
            allocated=allocated,
            clock=clock,
            timeout_s=settings.mig_manager_timeout_s,
            poll_s=settings.mig_manager_poll_s,
        )
        apply = manager.apply
        via = "mig-manager"
    log.info("mig_plans_applied_through", via=via, config_map=settings.mig_manager_config)
    return PlanApplier(apply, in_effect, manager)


def refusing(label: str) -> Callable[[MigLayoutPlan], MigResult]:
    """The applier of a node where mig-manager owns MIG and no ConfigMap was configured."""
    reason = (
        f"NVIDIA's mig-manager owns MIG layouts on this node ({MIG_CONFIG_LABEL}={label!r}): "
        "the agent does not create instances beside it. Set SEEDANCE_NODE_AGENT_MIG_MANAGER_CONFIG "
        "(deploy/k8s/components/mig-manager) to apply plans through it"
    )

    def apply(plan: MigLayoutPlan) -> MigResult:
        log.warning("mig_plan_refused", plan=plan.id, gpu=plan.gpu_index, reason=reason)
        return MigResult(MigOutcome.REFUSED, reason=reason)

    return apply


class MigManagerApplier:
    def __init__(
        self,
        backend: MigBackend,
        api_client: Any,
        node: ThisNode,
        config_map: tuple[str, str],
        *,
        gpus: Callable[[], list[int]],
        allocated: Callable[[int], list[str]],
        clock: Clock,
        timeout_s: float,
        poll_s: float,
    ) -> None:
        self._backend = backend
        self._core = client.CoreV1Api(api_client)
        self._node = node
        self._namespace, self._name = config_map
        self._gpus = gpus
        self._allocated = allocated
        self._clock = clock
        self._timeout_s = timeout_s
        self._poll_s = poll_s
        self._applied: set[str] = set()
        #: GPU index -> the slicer's view of its instances, (profile, start slot).
        self._planned: dict[int, list[tuple[str, int]]] = {}
        #: (GPU index, profile, the slicer's start slot) -> the instance's real start slot.
        self._slots: dict[tuple[int, str, int], int] = {}

    def devices(self, raw: NodeDevices) -> NodeDevices:
        """``raw`` (NVML's) with each MIG instance keyed by the slicer's start slot where the
        two differ, so that Allocate finds the instance the slicer's placement names."""
        index_of = {uuid: i for i, uuid in raw.gpus.items()}
        real_to_planned = {
            (gpu, profile, real): planned for (gpu, profile, planned), real in self._slots.items()
        }
        mig = {}
        for (parent, profile, slot), uuid in raw.mig.items():
            planned = real_to_planned.get((index_of.get(parent, -1), profile, slot), slot)
            mig[(parent, profile, planned)] = uuid
        return NodeDevices(gpus=raw.gpus, mig=mig)

    async def apply(self, plan: MigLayoutPlan) -> MigResult:
        if plan.id in self._applied:
            return MigResult(MigOutcome.ALREADY)
        gpu = plan.gpu_index
        refusal = drained_refusal(self._backend, self._allocated, gpu)
        if refusal is not None:
            log.warning("mig_plan_refused", plan=plan.id, gpu=gpu, reason=refusal)
            return MigResult(MigOutcome.REFUSED, reason=refusal)
        current = {
            g: (self._backend.mig_enabled(g), self._backend.gpu_instances(g)) for g in self._gpus()
        }
        planned = self._planned_after(gpu, current[gpu][1] if gpu in current else [], plan)
        try:
            layouts = target_layouts(current, plan)
        except LayoutError as exc:
            return MigResult(MigOutcome.REFUSED, reason=str(exc))
        entry = layout_entry(layouts)
        name = layout_name(entry)
        want = next(g for g in layouts if g.index == gpu)
        try:
            await self._add_layout(name, entry)
            await self._node.set_labels({MIG_CONFIG_LABEL: name})
            log.info("mig_layout_requested", plan=plan.id, gpu=gpu, layout=name)
            outcome = await self._await(name, gpu, want.devices)
        except (LayoutError, *_API_ERRORS) as exc:
            # The ConfigMap's text, or the API server refused or did not answer: the plan fails
            # with the reason. Raised on, an error of the API server would end in nats-py's
            # error callback, the plan neither counted nor logged.
            outcome = MigResult(MigOutcome.FAILED, reason=f"layout {name}: {exc}")
        if outcome.outcome is MigOutcome.FAILED:
            log.error("mig_plan_failed", plan=plan.id, gpu=gpu, layout=name, error=outcome.reason)
        if outcome.outcome is MigOutcome.APPLIED:
            self._applied.add(plan.id)
            self._planned[gpu] = planned
            actual = self._backend.gpu_instances(gpu)
            self._slots = {k: v for k, v in self._slots.items() if k[0] != gpu}
            self._slots.update(
                {(gpu, p, s): real for (p, s), real in pair_slots(planned, actual).items()}
            )
            log.info("mig_plan_applied", plan=plan.id, gpu=gpu, layout=name, via="mig-manager")
        return outcome

    def _planned_after(
        self, gpu: int, instances: list[MigInstance], plan: MigLayoutPlan
    ) -> list[tuple[str, int]]:
        before = self._planned.get(gpu)
        if before is None:  # first plan for the GPU: the slicer's view is what NVML shows
            before = [(i.profile, i.start_slot) for i in instances]
        gone = {(d.profile, d.start_slot) for d in plan.destroy}
        after = [p for p in before if p not in gone]
        created = [(c.profile, c.start_slot) for c in plan.create]
        return after + [p for p in created if p not in after]

    async def _add_layout(self, name: str, entry: list[dict[str, Any]]) -> None:
        for _ in range(_WRITE_ATTEMPTS):
            cm = await self._core.read_namespaced_config_map(self._name, self._namespace)
            text = with_layout((cm.data or {}).get(CONFIG_KEY, ""), name, entry)
            if text is None:
                return  # already there (another node's agent, or an earlier plan)
            cm.data = {**(cm.data or {}), CONFIG_KEY: text}
            try:
                # metadata.resourceVersion is the one read: a write in between is a 409.
                await self._core.replace_namespaced_config_map(self._name, self._namespace, cm)
                return
            except client.ApiException as exc:
                if exc.status != 409:
                    raise
        raise LayoutError(
            f"ConfigMap {self._namespace}/{self._name} changed under every one of "
            f"{_WRITE_ATTEMPTS} writes"
        )

    async def _await(self, name: str, gpu: int, want: tuple[tuple[str, int], ...]) -> MigResult:
        deadline = self._clock.monotonic() + self._timeout_s
        state = ""
        while self._clock.monotonic() < deadline:
            # NVML first, then the labels. mig-manager sets "pending" before it touches a GPU
            # and "success" after its last one, so the plan's instances seen before a label
            # read that says "success" are this layout's success. The other way round, a
            # "success" left from the earlier layout, answered just before mig-manager's
            # "pending", was paired with instances created after it: the plan counted applied
            # while mig-manager was still applying (and could yet fail).
            have = tuple(
                sorted(_count(i.profile for i in self._backend.gpu_instances(gpu)).items())
            )
            labels = ((await self._node.get()).get("metadata") or {}).get("labels") or {}
            state = str(labels.get(MIG_STATE_LABEL, ""))
            if labels.get(MIG_CONFIG_LABEL) != name:
                reason = f"{MIG_CONFIG_LABEL} changed to {labels.get(MIG_CONFIG_LABEL)!r} meanwhile"
                return MigResult(MigOutcome.FAILED, reason=reason)
            if state == "failed":
                return MigResult(MigOutcome.FAILED, reason=f"mig-manager failed layout {name}")
            if state == "success" and have == want:
                return MigResult(MigOutcome.APPLIED, steps=1)
            await self._clock.sleep(self._poll_s)
        return MigResult(
            MigOutcome.FAILED,
            reason=f"mig-manager did not apply layout {name} within {self._timeout_s:g} s "
            f"({MIG_STATE_LABEL}={state!r})",
        )


def _count(profiles: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in profiles:
        out[p] = out.get(p, 0) + 1
    return out
