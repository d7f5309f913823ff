"""The memory budget the model pool plans loads against (docs/models.md): a model's
footprint is `officellm plan`'s arithmetic (weights as held, its KV pool, its KV tiers' RAM),
estimated once from its config and replaced by what it holds once loaded. A load that does
not fit first unloads the least recently used models the pool says may go; if that is not
enough it is refused with a 503 naming what is loaded and what each takes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from officellm.app.errors import APIError, unavailable
from officellm.app.models.served_embedder import ServedEmbedder
from officellm.app.models.served_model import ServedModel
from officellm.app.server_settings import ServerSettings
from officellm.engine import (
    EngineState,
    ModelFootprint,
    default_memory_budget,
    estimate_footprint,
    tier_ram_bytes,
)

logger = logging.getLogger("officellm.server")


def gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 1024**3:.1f} GiB"


class MemoryBudget:
    """--memory-budget (or its default, set at start) and the footprints planned in it."""

    def __init__(self, settings: ServerSettings, budget_bytes: int | None) -> None:
        self.settings = settings
        self.budget_bytes = budget_bytes  # None: the default, set by start()
        self._estimating: asyncio.Future[None] | None = None

    def start(self) -> None:
        if self.budget_bytes is None:
            self.budget_bytes = default_memory_budget(self.settings.engine)

    async def footprint(self, model: ServedModel) -> ModelFootprint:
        """The model's planned footprint (estimated once, from its config only)."""
        if model.footprint is None:
            model.footprint = await asyncio.to_thread(estimate_footprint, model.engine_config())
        return model.footprint

    async def measure(self, model: ServedModel) -> None:
        """A loaded model's footprint as it holds it: weights, KV pool, its tiers' RAM."""
        stats = model.async_engine.stats()
        if stats is None or not stats.bytes_per_token:
            await self.footprint(model)
            return
        # What the engine holds replaces the plan: the weights as loaded (a GGUF's blocks,
        # and the dense copy --quantization auto keeps for large batches where it measured
        # one faster) and the pool it sized.
        config = model.engine_config()
        ranks = config.tensor_parallel_size
        model.footprint = ModelFootprint(stats.weight_bytes * ranks, stats.kv_cache_bytes * ranks,
                                         tier_ram_bytes(config, stats.kv_cache_bytes,
                                                        stats.kv_host.capacity_bytes
                                                        if stats.kv_host is not None else 0),
                                         not config.device.startswith("cuda"))

    def estimate_in_background(self, models: Sequence[ServedModel],
                               embedders: Sequence[ServedEmbedder]) -> None:
        """Estimate the footprints not known yet (reading a .gguf's config takes seconds),
        so the admin's list shows them without waiting."""
        missing = [m for m in models if m.footprint is None]
        # Not while a model loads: reading a .gguf's config imports transformers, and two
        # threads importing it at once can fail with a circular import.
        loading = any(m.async_engine.state is EngineState.LOADING for m in models) or any(
            e.embedder.state is EngineState.LOADING for e in embedders)
        if missing and not loading and (self._estimating is None or self._estimating.done()):
            async def estimate() -> None:
                for model in missing:
                    try:
                        await self.footprint(model)
                    except Exception as exc:  # a bad source: its load will say why
                        logger.warning("Cannot plan the memory of `%s`: %s", model.name, exc)
            self._estimating = asyncio.ensure_future(estimate())

    @staticmethod
    def used_bytes(models: Sequence[ServedModel]) -> int:
        """The planned footprints of the models in memory (or loading)."""
        return sum(m.footprint.total_bytes for m in models
                   if m.in_memory and m.footprint is not None)

    async def make_room(self, model: ServedModel, models: Sequence[ServedModel],
                        unloadable: Sequence[ServedModel],
                        unload: Callable[[ServedModel], Awaitable[bool]],
                        describe: Callable[[ServedModel], str], *, required: bool = True) -> None:
        """Unload the least recently used of `unloadable` until `model` fits the budget;
        503 naming what is loaded (`describe`) if it cannot, unless not `required` (the
        default model, which loaded at start whatever the budget: waking it after an idle
        sleep makes what room it can but is never refused)."""
        if self.budget_bytes is None:
            return
        try:
            need = (await self.footprint(model)).total_bytes
        except ValueError as exc:  # a GPU model without a KV size: nothing to plan with
            raise self.refusal(str(exc)) from exc
        for other in models:
            if other.in_memory:
                await self.measure(other)
        budget = self.budget_bytes
        if need > budget and required:
            raise self.refusal(f"The model `{model.name}` needs {gib(need)} (weights, KV pool "
                               f"and its tiers' RAM), more than the memory budget of "
                               f"{gib(budget)} (--memory-budget).")
        for victim in sorted(unloadable, key=lambda m: m.last_used):
            if self.used_bytes(models) + need <= budget:
                break
            logger.info("Unloading `%s` (least recently used) to make room for `%s`",
                        victim.name, model.name)
            await unload(victim)
        used = self.used_bytes(models)
        if used + need > budget and required:
            held = "; ".join(describe(m) for m in models if m.in_memory)
            raise self.refusal(
                f"The model `{model.name}` needs {gib(need)} but only "
                f"{gib(max(0, budget - used))} of the {gib(budget)} memory budget "
                f"is free. Loaded: {held}. Retry when one is idle, or unload one.")

    async def make_room_for(self, name: str, need: int, held_besides: int,
                            models: Sequence[ServedModel], unloadable: Sequence[ServedModel],
                            unload: Callable[[ServedModel], Awaitable[bool]],
                            describe: Callable[[ServedModel], str]) -> None:
        """make_room for a model that is not a generate model (a speech-to-text model):
        `need` bytes, `held_besides` the bytes others of its kind hold now."""
        if self.budget_bytes is None:
            return
        for other in models:
            if other.in_memory:
                await self.measure(other)
        budget = self.budget_bytes
        if need > budget:
            raise self.refusal(f"The model `{name}` needs {gib(need)}, more than the memory "
                               f"budget of {gib(budget)} (--memory-budget).")
        for victim in sorted(unloadable, key=lambda m: m.last_used):
            if self.used_bytes(models) + held_besides + need <= budget:
                break
            logger.info("Unloading `%s` (least recently used) to make room for `%s`",
                        victim.name, name)
            await unload(victim)
        used = self.used_bytes(models) + held_besides
        if used + need > budget:
            held = "; ".join(describe(m) for m in models if m.in_memory)
            raise self.refusal(
                f"The model `{name}` needs {gib(need)} but only "
                f"{gib(max(0, budget - used))} of the {gib(budget)} memory budget "
                f"is free. Loaded: {held}. Retry when one is idle, or unload one.")

    @staticmethod
    def describe(model: ServedModel, why: str) -> str:
        """A model in memory as a refusal names it: its planned size and why it stays."""
        size = gib(model.footprint.total_bytes) if model.footprint is not None else "?"
        return f"`{model.name}` ({size}, {why})"

    def refusal(self, sentence: str) -> APIError:
        return unavailable(sentence, self.settings.retry_after_s)
