"""In CI the Kubernetes tier never skips: with ``WORKBENCH_K8S_REQUIRED`` set (``.ci/run`` sets it) a
machine that cannot run the cluster fails the tier, and a failed build fails it with or without the
variable. Each case runs the tier's first test in a pytest of its own, with the cluster's check or build
crafted to say no; no cluster starts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.kubernetes import cluster as kc

pytestmark = [pytest.mark.timeout(120)]

CRAFTED = """
import subprocess, sys, pytest
import tests.kubernetes.cluster as kc
if {cannot_run!r}:
    kc.why_not = lambda built=True: "crafted: not installed: etcd"
else:
    kc.why_not = lambda built=True: None
    def build(timeout=0):
        raise subprocess.CalledProcessError(2, "build.sh")
    kc.build = build
sys.exit(pytest.main(["tests/kubernetes/test_cluster.py", "-q", "-p", "no:cacheprovider", "-rs"]))
"""


def outcome(cannot_run: bool, required: bool) -> str:
    env = {k: v for k, v in os.environ.items() if k != kc.REQUIRED}
    if required:
        env[kc.REQUIRED] = "1"
    code = CRAFTED.format(cannot_run=cannot_run)
    done = subprocess.run([sys.executable, "-c", code], cwd=kc.REPO, env={**env, "PYTHONPATH": str(kc.REPO)},
                          capture_output=True, text=True, timeout=100)
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("cannot_run", "required", "expected"),
    [
        (True, False, "1 skipped"),  # by hand, on a machine without root or the packages
        (True, True, "1 error"),  # CI: the same machine fails the tier
        (False, True, "1 error"),  # a failed build fails it
        (False, False, "1 error"),
    ],
)
def test_the_tier_fails_in_ci_where_it_would_skip(cannot_run, required, expected):
    assert outcome(cannot_run, required).startswith(expected)
