"""A reader of Prometheus/OpenMetrics text expositions, for comparing what two
servers expose: families (name, type, label names, histogram buckets) and
samples. Lenient on purpose: it reads vLLM's text and ours alike."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_TYPE = re.compile(r"^# TYPE (\S+) (\S+)$")
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})? (\S+)(?: \S+)?$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')
#: Sample-name suffixes by family type.
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
    "info": ("_info",),
}


@dataclass
class Family:
    """One metric family: its type, the label names of its samples (without
    `le`) and, for a histogram, its bucket bounds (without `+Inf`)."""

    name: str
    type: str
    labels: set[str] = field(default_factory=set)
    buckets: list[float] | None = None

    def describe(self) -> dict:
        """A JSON-able summary, as the fixtures keep it."""
        return {"type": self.type, "labels": sorted(self.labels), "buckets": self.buckets}


@dataclass
class Exposition:
    """A parsed exposition: families by name, and every sample as
    `(name, labels, value)`."""

    families: dict[str, Family]
    samples: list[tuple[str, dict[str, str], float]]

    def values(self, name: str, **labels: str) -> list[float]:
        """The values of the samples called `name` whose labels include `labels`."""
        return [v for n, ls, v in self.samples if n == name and labels.items() <= ls.items()]

    def total(self, name: str, **labels: str) -> float:
        """The sum of `values(name, **labels)`; fails when there is none."""
        found = self.values(name, **labels)
        assert found, f"no sample {name}{labels}"
        return sum(found)

    def sample_names(self) -> set[str]:
        """Every sample name."""
        return {n for n, _, _ in self.samples}


def _family_of(sample: str, families: dict[str, Family]) -> Family | None:
    for name, family in families.items():
        for suffix in _SUFFIXES.get(family.type, ("",)):
            if sample == name + suffix:
                return family
    return None


def parse(text: str) -> Exposition:
    """Reads an exposition."""
    families: dict[str, Family] = {}
    samples = []
    for line in text.splitlines():
        if match := _TYPE.match(line):
            families[match[1]] = Family(match[1], match[2])
            continue
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        labels = {k: re.sub(r"\\(.)", r"\1", v) for k, v in _LABEL.findall(match[2] or "")}
        samples.append((match[1], labels, float(match[3])))
        family = _family_of(match[1], families)
        if family is None:
            continue
        family.labels |= labels.keys() - {"le"}
        if match[1] == family.name + "_bucket" and labels.get("le") not in (None, "+Inf"):
            bound = float(labels["le"])
            family.buckets = family.buckets or []
            if bound not in family.buckets:
                family.buckets.append(bound)
    for family in families.values():
        if family.buckets is not None:
            family.buckets.sort()
    return Exposition(families, samples)
