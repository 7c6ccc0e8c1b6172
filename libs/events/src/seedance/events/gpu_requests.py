"""What a request's ``--gpu-model`` means: ``match_models`` (``a100`` is any A100, ``a100-80gb``
an 80 GB one, ``H100 80GB HBM3`` that model) against a fleet's names as reported.

Split from ``gpus`` (the identity of one reported name), whose reading it applies: a request is
matched through ``identify``, never by comparing strings, so the slicer and the bridge agree
with the ledger on what a name is. Must not hold GPU facts (they are ``gpus``'s).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

# The identity's own normalisation and index: one reading of a name for both modules.
from seedance.events.gpus import _BY_KEY, _FAMILIES, _key, _tokens, canonical_model, identify

__all__ = ["ModelMatch", "match_models"]

_MEMORY = re.compile(r"^(\d+)GB?$")
_FORMS = {"SXM", "SXM2", "SXM4", "SXM5", "SXM6", "PCIE", "NVL"}


@dataclass(frozen=True, slots=True)
class _Request:
    """What one requested name asks for: a family with optional memory and form, one model,
    or (unknown) the name itself, matched against the fleet's names as written."""

    text: str
    family: str | None = None
    memory_gb: int | None = None
    form: str | None = None
    model: str | None = None

    def accepts(self, fleet_name: str) -> bool:
        got = identify(fleet_name)
        gpu = got.identity
        if self.model is not None:
            return gpu is not None and gpu.model == self.model
        if self.family is None:  # unknown request: the fleet's own (unknown) name, any case
            return _tokens(fleet_name) == _tokens(self.text)
        if gpu is None or gpu.family.upper() != self.family:
            return False
        if self.memory_gb is not None and gpu.memory_gb != self.memory_gb:
            return False
        return self.form is None or gpu.form_factor.upper().startswith(self.form)


def _request(text: str) -> _Request:
    toks = _tokens(text)
    if not toks:
        return _Request(text)
    # ``a100``: any A100, whatever a short name meant; ``a100-80gb`` any 80 GB one (SXM4 or
    # PCIe), ``h100-sxm`` any SXM H100: a family (the longest of several words: ``rtx-4090``,
    # ``rtx-pro-6000-96gb``) with memory and form qualifiers.
    for n in range(len(toks), 0, -1):
        family = "-".join(toks[:n])
        if family not in _FAMILIES:
            continue
        memory: int | None = None
        form: str | None = None
        for t in toks[n:]:
            m = _MEMORY.match(t)
            if m:
                memory = int(m.group(1))
            elif t in _FORMS:
                form = t  # ``SXM`` accepts SXM2/4/5/6; ``SXM4`` only SXM4
            else:
                break
        else:
            return _Request(text, family=family, memory_gb=memory, form=form)
        break
    key = _key(toks)
    gpu = _BY_KEY.get(key) if key else None
    if gpu is not None:  # a name with more than qualifiers (``H100 80GB HBM3``): that model
        return _Request(text, model=gpu.model)
    return _Request(text)  # no model we know, or a qualifier we do not: no guess


@dataclass(frozen=True, slots=True)
class ModelMatch:
    """Which of the fleet's model names a request's ``gpu_models`` accept, and why not."""

    requested: tuple[str, ...]
    #: The fleet's names (as they are written there) any request accepts, sorted.
    matched: tuple[str, ...]
    #: Requests that name no model of the table (matched only by the fleet's own names).
    unknown: tuple[str, ...] = ()
    by_request: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def reason(self, available: Iterable[str]) -> str:
        """A sentence for a user when nothing matched: what was asked and what there is."""
        known = sorted(set(available))
        shown = ", ".join(_describe(n) for n in known) or "none"
        asked = ", ".join(self.requested)
        extra = f" ({', '.join(self.unknown)}: no such GPU model known)" if self.unknown else ""
        return f"gpu_models [{asked}] match none of the fleet's models: {shown}{extra}"


def _describe(name: str) -> str:
    model = canonical_model(name)
    return name if model == name else f"{name} ({model})"


def match_models(requested: Iterable[str], available: Iterable[str]) -> ModelMatch:
    """The names of ``available`` (a fleet's model names, as reported) that any of
    ``requested`` (a job's ``gpu_models``) accepts. No request accepts everything."""
    reqs = tuple(dict.fromkeys(requested))
    names = sorted(set(available))
    parsed = [(r, _request(r)) for r in reqs]
    by_request = {r: tuple(n for n in names if p.accepts(n)) for r, p in parsed}
    matched = tuple(sorted({n for ns in by_request.values() for n in ns}))
    unknown = tuple(r for r, p in parsed if p.family is None and p.model is None)
    return ModelMatch(requested=reqs, matched=matched, unknown=unknown, by_request=by_request)
