"""Every export format by name: what `cruxctl hints --format` and the periodic export write."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cruxd.hints import bandwidth
from cruxd.hints.bandwidth import BandwidthSample
from cruxd.hints.fabric_view import SCHEMA_VERSION, FabricView

FORMATS = ("spiderflow", "arnold", "volcano", "slurm", "labels", "bandwidth")
FILE_NAMES = {"spiderflow": "spiderflow.json", "arnold": "arnold.json",
              "volcano": "volcano-hypernodes.yaml", "slurm": "topology.conf",
              "labels": "node-labels.json", "bandwidth": "bandwidth.json"}


@dataclass(frozen=True)
class Rendered:
    format: str
    version: int
    media_type: str
    text: str


def _json(doc: Any) -> str:
    return json.dumps(doc, indent=1, allow_nan=False) + "\n"


def _spiderflow(view: FabricView, samples: list[BandwidthSample]) -> Rendered:
    from cruxd.hints import spiderflow

    return Rendered("spiderflow", SCHEMA_VERSION, "application/json",
                    _json(spiderflow.export(view)))


def _arnold(view: FabricView, samples: list[BandwidthSample]) -> Rendered:
    from cruxd.hints import arnold

    return Rendered("arnold", SCHEMA_VERSION, "application/json", _json(arnold.export(view)))


def _volcano(view: FabricView, samples: list[BandwidthSample]) -> Rendered:
    from cruxd.hints import volcano

    return Rendered("volcano", SCHEMA_VERSION, "application/yaml",
                    volcano.to_yaml(volcano.hypernodes(view)))


def _labels(view: FabricView, samples: list[BandwidthSample]) -> Rendered:
    from cruxd.hints import volcano

    return Rendered("labels", SCHEMA_VERSION, "application/json",
                    _json(volcano.node_labels(view)))


def _slurm(view: FabricView, samples: list[BandwidthSample]) -> Rendered:
    from cruxd.hints import slurm

    return Rendered("slurm", SCHEMA_VERSION, "text/plain", slurm.topology_conf(view))


def _bandwidth(view: FabricView, samples: list[BandwidthSample]) -> Rendered:
    return Rendered("bandwidth", SCHEMA_VERSION, "application/json",
                    _json(bandwidth.export(view, samples)))


_RENDER: dict[str, Callable[[FabricView, list[BandwidthSample]], Rendered]] = {
    "spiderflow": _spiderflow, "arnold": _arnold, "volcano": _volcano, "slurm": _slurm,
    "labels": _labels, "bandwidth": _bandwidth}


def render(fmt: str, view: FabricView, samples: list[BandwidthSample] | None = None
           ) -> Rendered:
    fn = _RENDER.get(fmt)
    if fn is None:
        raise ValueError(f"unknown hints format {fmt!r}; formats: {', '.join(FORMATS)}")
    return fn(view, samples or [])
