"""Forecast model versions in the JetStream object store ``seedance-router-models``.

Owns: creating the bucket from the catalogue (`OBJECT_STORES`), the object naming
``<fleet>/g<generation, 8 digits>/<model_id>`` (so names sort by generation and the latest is the
greatest) and the round trip through `ForecastModel.to_bytes` / `from_bytes`. Must not decide
when to train or which model serves (the service does).
"""

from __future__ import annotations

from nats.js.errors import NotFoundError
from nats.js.object_store import ObjectStore

from seedance.core import Bus
from seedance.core.kv import ensure_object_store
from seedance.core.logs import get_logger
from seedance.router.core.forecast import ForecastModel

__all__ = ["MODELS_BUCKET", "ModelStore"]

log = get_logger(__name__)

MODELS_BUCKET = "seedance-router-models"


def object_name(fleet: str, model: ForecastModel) -> str:
    return f"{fleet}/g{model.version.generation:08d}/{model.version.model_id}"


class ModelStore:
    def __init__(self, store: ObjectStore, fleet: str) -> None:
        self._store = store
        self._fleet = fleet

    @classmethod
    async def open(cls, bus: Bus, fleet: str) -> ModelStore:
        return cls(await ensure_object_store(bus, MODELS_BUCKET), fleet)

    async def put(self, model: ForecastModel) -> str:
        name = object_name(self._fleet, model)
        await self._store.put(name, model.to_bytes())
        log.info("forecast_model_stored", name=name, generation=model.version.generation)
        return name

    async def names(self) -> list[str]:
        """This fleet's stored versions, oldest generation first."""
        try:
            infos = await self._store.list(ignore_deletes=True)
        except NotFoundError:
            return []
        prefix = f"{self._fleet}/"
        return sorted(
            i.name for i in infos if i.name and i.name.startswith(prefix) and not i.deleted
        )

    async def latest(self) -> ForecastModel | None:
        """The newest version this code can read; older schemas are skipped with a warning."""
        for name in reversed(await self.names()):
            result = await self._store.get(name)
            try:
                return ForecastModel.from_bytes(result.data or b"")
            except ValueError as exc:
                log.warning("forecast_model_unreadable", name=name, error=str(exc))
        return None
