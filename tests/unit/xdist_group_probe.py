"""Run only by test_suite_layout.py, in a pytest of its own over two xdist workers: each test writes its
worker and the node id xdist scheduled it by, so the caller sees which group each one went to."""

import os

import pytest

def _record(request) -> None:
    with open(os.environ["HPOPS_GROUP_PROBE_OUT"], "a", encoding="utf-8") as out:
        out.write(f"{os.environ.get('PYTEST_XDIST_WORKER', '-')} {request.node.nodeid}\n")


@pytest.mark.realssh
@pytest.mark.parametrize("n", range(4))
def test_probe_ssh(request, n):
    _record(request)


@pytest.mark.realslurm
@pytest.mark.parametrize("n", range(4))
def test_probe_slurm(request, n):
    _record(request)


@pytest.mark.parametrize("n", range(4))
def test_probe_free(request, n):
    _record(request)
