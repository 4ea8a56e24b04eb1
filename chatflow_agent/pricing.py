"""What a model call cost: a price book over the ``genai-prices`` library with per-model overrides.

Prices are USD. The library (https://github.com/pydantic/genai-prices, maintained price data per
provider and model, dated) prices a call from its provider and model; an override, per model
name, wins over it (a negotiated rate, a model the library lacks, a self-hosted model). A model
neither knows gets no cost (``None``), never ``0``; so does a call whose token counts are unknown,
and a call of a provider-agnostic engine (demo, scripted) unless an override names its model.

A call has two model names: the one the provider answered with (``ModelCallUsage.model``, often
dated: ``gpt-4o-mini-2024-07-18``) and the one the agent was configured with (``gpt-4o-mini``).
Both are looked up, in this order: an override for the answered name, an override for the
configured name, the library for the answered name, the library for the configured name. The
priced call says which matched (``price_source``, ``priced_as``).

Overrides in the environment (``CHATFLOW_MODEL_PRICES``) or passed in are JSON-shaped: model name →
``{"input": …, "output": …, "cached_input": …, "cache_write": …}``, USD per million tokens (numbers
or numeric strings; ``cached_input`` and ``cache_write`` default to ``input``)::

    CHATFLOW_MODEL_PRICES='{"gpt-4o-mini": {"input": "0.15", "output": "0.60", "cached_input": "0.075"}}'
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from chatflow_agent.types import ModelCallUsage

__all__ = ["PRICES_ENV", "ModelPrice", "PriceBook", "PriceSource"]

logger = logging.getLogger("chatflow_agent.pricing")

#: The environment variable :meth:`PriceBook.from_env` reads.
PRICES_ENV = "CHATFLOW_MODEL_PRICES"
_PER = Decimal(1_000_000)
#: Where a call's price came from: the price book's overrides or the genai-prices library.
PriceSource = Literal["override", "genai-prices"]
# Our engines' provider names → genai-prices provider ids. Unlisted providers (ollama, gemma: local
# servers) are not priced by the library.
_LIBRARY_PROVIDER = {
    "openai": "openai",
    "anthropic": "anthropic",
    "gemini": "google",
    "google": "google",
    "grok": "x-ai",
    "xai": "x-ai",
    "deepseek": "deepseek",
    "groq": "groq",
}


class ModelPrice(BaseModel):
    """One model's prices in USD per million tokens; ``cached_input`` / ``cache_write`` default to ``input``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: Decimal
    output: Decimal
    cached_input: Decimal | None = None
    cache_write: Decimal | None = None

    def cost(self, usage: ModelCallUsage) -> Decimal | None:
        """The call's cost in USD, or ``None`` when its input or output token count is unknown."""
        if usage.input_tokens is None or usage.output_tokens is None:
            return None
        cached = usage.cached_tokens or 0
        written = usage.cache_write_tokens or 0
        fresh = max(usage.input_tokens - cached - written, 0)
        total = (
            fresh * self.input
            + cached * (self.cached_input if self.cached_input is not None else self.input)
            + written * (self.cache_write if self.cache_write is not None else self.input)
            + usage.output_tokens * self.output
        )
        return total / _PER


class PriceBook:
    """Prices model calls: ``overrides`` (model name → :class:`ModelPrice` or its JSON shape) first,
    then, when ``library`` is true, genai-prices for the call's provider and model.

    Raises ``ValueError`` (naming the model) for a malformed override.
    """

    def __init__(self, overrides: Mapping[str, ModelPrice | Mapping[str, Any]] | None = None, *,
                 library: bool = True) -> None:
        self.overrides: dict[str, ModelPrice] = {}
        for model, price in (overrides or {}).items():
            try:
                parsed = price if isinstance(price, ModelPrice) else ModelPrice.model_validate(price)
                self.overrides[str(model)] = parsed
            except ValidationError as err:
                raise ValueError(f"Price override for model {model!r} is malformed: {err}") from err
        self.library = library
        if library:
            import genai_prices  # noqa: F401  # load its price data now, not on the event loop at the first call

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, library: bool = True) -> PriceBook:
        """A price book with the overrides of ``CHATFLOW_MODEL_PRICES`` (JSON object; unset or empty: none).

        Raises ``ValueError`` naming the variable when it is not a JSON object of valid prices.
        """
        raw = (os.environ if environ is None else environ).get(PRICES_ENV, "").strip()
        if not raw:
            return cls(library=library)
        try:
            data = json.loads(raw)
            if not isinstance(data, dict):
                raise ValueError("expected a JSON object of model name → prices")
            return cls(data, library=library)
        except ValueError as err:
            raise ValueError(f"{PRICES_ENV} is malformed: {err}") from err

    def cost(self, usage: ModelCallUsage, configured_model: str | None = None) -> Decimal | None:
        """The call's cost in USD, or ``None`` (unknown model, unknown tokens, unpriced provider);
        ``configured_model``: the model the agent asked for, looked up after ``usage.model``."""
        return self.price(usage, configured_model)[0]

    def price(self, usage: ModelCallUsage,
              configured_model: str | None = None) -> tuple[Decimal | None, PriceSource | None, str | None]:
        """``(cost, source, name)``: the call's cost in USD, where its price came from (``"override"`` or
        ``"genai-prices"``) and the model name it was found under; ``(None, None, None)`` when no price
        applies or the call's token counts are unknown (see the module docstring for the order in which
        the two names are tried)."""
        names = [n for n in dict.fromkeys((usage.model, configured_model)) if n]
        for name in names:
            override = self.overrides.get(name)
            if override is not None:  # (None when the call's token counts are unknown)
                cost = override.cost(usage)
                return (cost, "override", name) if cost is not None else (None, None, None)
        if not self.library or usage.estimated or usage.input_tokens is None or usage.output_tokens is None:
            return None, None, None
        provider_id = _LIBRARY_PROVIDER.get((usage.provider or "").lower())
        if provider_id is None:
            return None, None, None
        for name in names:
            cost = _library_cost(usage, name, provider_id)
            if cost is not None:
                return cost, "genai-prices", name
        return None, None, None

    def priced(self, usage: ModelCallUsage, configured_model: str | None = None, *,
               agent_name: str | None = None) -> ModelCallUsage:
        """``usage`` with its ``cost``, ``price_source`` and ``priced_as`` set from this book (and its
        ``agent_name``, when given); ``usage`` itself when that changes nothing (it is immutable)."""
        cost, source, name = self.price(usage, configured_model)
        update: dict[str, object] = {"cost": cost, "price_source": source, "priced_as": name}
        if agent_name is not None:
            update["agent_name"] = agent_name
        if all(getattr(usage, field) == value for field, value in update.items()):
            return usage
        return usage.model_copy(update=update)


def _library_cost(usage: ModelCallUsage, model: str, provider_id: str) -> Decimal | None:
    from genai_prices import Usage, calc_price  # importing it loads its price data: only when needed

    tokens = Usage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
                   cache_read_tokens=usage.cached_tokens, cache_write_tokens=usage.cache_write_tokens)
    try:
        price = calc_price(tokens, model, provider_id=provider_id)
    except LookupError:
        return None  # a model (or provider) the library does not know
    except (ValueError, TypeError) as err:  # counts the library refuses (cached > input …)
        logger.warning("No cost for %s/%s: genai-prices refused the usage (%s)", provider_id, model, err)
        return None
    return Decimal(price.total_price)
