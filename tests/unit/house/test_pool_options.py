"""Every PoolConfig field is reachable from the magic's ``%dist start`` and the panel's start request:
both are made from the config's fields (``workbench.config.pool_options``), none kept by hand."""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

import pytest

from workbench.config import PoolConfig, pool_options
from workbench.magics.args import parse_dist, pool_config_options
from workbench.server.start_request import parse_start_request, start_form, start_options

SLURM = {"launcher": "slurm", "interface": "lo"}
KUBE = {"launcher": "kubernetes", "interface": "lo"}
# field -> (a value other than its default, the other fields that value needs to be valid)
SAMPLES = {
    "n": (3, {}),
    "launcher": ("mpi", {}),
    "backend": ("gloo", {}),
    "timeout": (12.5, {}),
    "address": ("127.0.0.2", {"launcher": "mpi"}),
    "interface": ("lo", {}),
    "nodes": (2, SLURM),
    "gpus_per_node": (2, SLURM),
    "partition": ("gpu", SLURM),
    "time": ("30", SLURM),
    "account": ("team", SLURM),
    "hosts": (("a", "b"), {"launcher": "mpi", "interface": "lo"}),
    "namespace": ("team", KUBE),
    "image": ("wb:1", KUBE),
    "gpus_per_pod": (2, KUBE),
    "node_selector": ({"gpu": "a100"}, KUBE),
    "pod_template": ("gpu-pod.yaml", KUBE),
    "pods": ("role=trainer", KUBE),
    "idle_release": (30.0, {}),
    "oversubscribe": (True, {}),
    "name": ("team-a", {}),
    "collective_timeout": (20.0, {}),
    "share_gpus": (True, {}),
    "keep": (True, {}),
    "new_job": (True, SLURM),
    "walltime_warning": (300.0, SLURM),
    "launcher_options": ({"delay": 0}, {"launcher": "mpi"}),
}


def test_every_field_has_a_sample():
    assert set(SAMPLES) == {f.name for f in dataclasses.fields(PoolConfig)}
    for name, (value, _) in SAMPLES.items():
        assert value != next(o.default for o in pool_options() if o.name == name), name


def _flag(name: str, value) -> list[str]:
    option = next(o for o in pool_options() if o.name == name)
    if option.kind == "switch":
        return [option.flag] if value else []
    if option.kind == "hosts":
        return [option.flag, ",".join(value)]
    if option.kind == "mapping":
        return [option.flag, json.dumps(value)]
    return [option.flag, str(value)]


@pytest.mark.parametrize("name", list(SAMPLES))
def test_the_magic_reaches_every_field(name):
    value, needs = SAMPLES[name]
    words = [w for key, v in {**needs, name: value}.items() for w in _flag(key, v)]
    config = PoolConfig(**pool_config_options(parse_dist("start " + shlex.join(words))))
    assert getattr(config, name) == value


@pytest.mark.parametrize("name", list(SAMPLES))
def test_the_panels_request_reaches_every_field(name):
    value, needs = SAMPLES[name]
    body = {**needs, name: list(value) if isinstance(value, tuple) else value}
    config = parse_start_request(body)
    assert getattr(config, name) == value
    # and what the dialog shows again on Retry starts the same pool
    assert dataclasses.asdict(parse_start_request(start_options(config))) == dataclasses.asdict(config)


def test_a_start_line_without_options_is_the_default_config():
    assert dataclasses.asdict(PoolConfig(**pool_config_options(parse_dist("start")))) == \
        dataclasses.asdict(PoolConfig())


# The browser's tests (extension/src/__tests__) render the start dialog from this copy of the server's
# answer to GET /workbench/options, this machine's interfaces replaced by two fixed ones. Written again by
# `python -m tests.unit.house.test_pool_options` when PoolConfig's fields change.
FORM_FIXTURE = Path(__file__).resolve().parents[3] / "extension" / "src" / "__tests__" / "start-form.json"
FIXED_INTERFACES = [{"value": "lo", "label": "lo (127.0.0.1)"}, {"value": "eth0", "label": "eth0 (10.0.0.5)"}]


def browser_form() -> dict:
    form = start_form(default_n=2)
    for option in form["options"]:
        if option["name"] == "interface":
            option["choices"] = FIXED_INTERFACES
    return form


def test_the_browsers_tests_render_the_servers_start_form():
    assert json.loads(FORM_FIXTURE.read_text()) == browser_form(), (
        f"{FORM_FIXTURE} is not what the server answers: write it again with "
        "`python -m tests.unit.house.test_pool_options`")


if __name__ == "__main__":
    FORM_FIXTURE.write_text(json.dumps(browser_form(), indent=2) + "\n")
    print(f"wrote {FORM_FIXTURE}")
