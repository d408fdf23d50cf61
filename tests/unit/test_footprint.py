"""What a cold start loads, and what the layers ship. Deterministic: nothing here is timed (the times
are `make bench`'s, hpops_twin/footprint.py).

* Each function's handler module, imported in a fresh interpreter as Lambda would (plus the imports
  its handler makes in its own body), loads pydantic only if the function validates events, and
  paramiko only if it is the verifier.
* The layer keeps the AWS service models of every service our code makes a client for, and a
  client for each kept service can be made from the pruned tree.
* Each built layer is at most 40 MB unzipped, holds bytecode Lambda uses as it is, and no package
  is in two layers.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hpops_twin import footprint
from hpops_twin.template_model import REPO_ROOT, TemplateModel

TEMPLATE = TemplateModel()
FUNCTIONS = footprint.function_imports(TEMPLATE, code_root=None)  # the source folders, not a build
LAYERS = footprint.layer_sources(TEMPLATE)
BUILT = {layer_id: footprint.BUILD_DIR / layer_id / "python" for layer_id in LAYERS}

# The functions that validate events with pydantic (Powertools Parser models or our own). The two
# that also call AWS (ReleaseLeaseOfEndedSync, RecordNodeReport) check their few fields with the
# validation rules instead: pydantic on top of boto3 broke the cold-start target.
PARSE_EVENTS = {"ParseTriggerFunction", "BudgetParseTriggerFunction", "ParseSessionTriggerFunction"}
VERIFIER = "VerifyNodeIdentityFunction"


def _prune_layer_module():
    spec = importlib.util.spec_from_file_location("prune_layer", footprint.PRUNE_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PRUNE = _prune_layer_module()


# ---------------------------------------------------------------- what a cold start imports

def _loaded_modules(target: footprint.FunctionImport) -> set[str]:
    env = footprint.lambda_environment(target.logical_id, target.handler, target.code_dir, [target.code_dir])
    out = footprint.run_imports(sys.executable, target.statements, env, isolated=False, report="modules")
    return set(__import__("json").loads(out))


@pytest.fixture(scope="module")
def loaded() -> dict[str, set[str]]:
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip([t.logical_id for t in FUNCTIONS], pool.map(_loaded_modules, FUNCTIONS)))


def test_the_measurement_covers_every_function_and_what_its_handler_imports():
    assert {t.logical_id for t in FUNCTIONS} == set(TEMPLATE.functions())
    assert PARSE_EVENTS | {VERIFIER} <= {t.logical_id for t in FUNCTIONS}
    [signer] = [t for t in FUNCTIONS if t.logical_id == "SignHostCertificatesFunction"]
    assert any("certificates" in s for s in signer.statements[1:]), "imports in the handler's body are counted"


@pytest.mark.parametrize("logical_id", [t.logical_id for t in FUNCTIONS])
def test_a_function_loads_pydantic_only_if_it_parses_events(loaded, logical_id):
    loads = "pydantic" in loaded[logical_id]
    if logical_id in PARSE_EVENTS:
        assert loads, "a parser that loads no pydantic: is its handler's import still measured?"
    else:
        assert not loads, f"{logical_id} loads pydantic on a cold start but parses no event"


@pytest.mark.parametrize("logical_id", [t.logical_id for t in FUNCTIONS])
def test_only_the_verifier_loads_paramiko(loaded, logical_id):
    assert ("paramiko" in loaded[logical_id]) == (logical_id == VERIFIER)


# ---------------------------------------------------------------- AWS service models

CLIENT_CALL = re.compile(r"""\b(?:client|resource)\(\s*["']([a-z0-9-]+)["']""")


def services_our_code_calls() -> set[str]:
    found = set()
    for root in ("layers", "functions"):
        for path in (REPO_ROOT / root).rglob("*.py"):
            found |= set(CLIENT_CALL.findall(path.read_text()))
    return found


def test_every_service_our_code_makes_a_client_for_is_kept():
    called = services_our_code_calls()
    assert len(called) >= 8, f"the grep found too little to be right: {sorted(called)}"
    assert called <= set(PRUNE.AWS_SERVICES), f"not kept in the layer: {sorted(called - set(PRUNE.AWS_SERVICES))}"


@pytest.fixture(scope="module")
def pruned_data(tmp_path_factory) -> tuple[Path, Path]:
    """(botocore/data, boto3/data) of the built layer; without a build, the venv's pruned the same way."""
    built = BUILT["SharedCodeLayer"]
    if (built / "botocore" / "data").is_dir():
        return built / "botocore" / "data", built / "boto3" / "data"
    import boto3
    import botocore

    root = tmp_path_factory.mktemp("layer")
    shutil.copytree(Path(botocore.__file__).parent / "data", root / "botocore" / "data")
    shutil.copytree(Path(boto3.__file__).parent / "data", root / "boto3" / "data")
    PRUNE.prune_service_data(root)
    return root / "botocore" / "data", root / "boto3" / "data"


def test_the_pruned_tree_keeps_exactly_the_listed_services_newest_version_and_the_shared_files(pruned_data):
    botocore_data, boto3_data = pruned_data
    services = sorted(p.name for p in botocore_data.iterdir() if p.is_dir())
    assert services == sorted(PRUNE.AWS_SERVICES)
    for service in services:
        assert len([p for p in (botocore_data / service).iterdir() if p.is_dir()]) == 1, service
    for name in ("_retry.json", "endpoints.json", "partitions.json", "sdk-default-configuration.json"):
        assert (botocore_data / name).is_file(), name
    assert {p.name for p in boto3_data.iterdir() if p.is_dir()} <= set(PRUNE.AWS_SERVICES)


@pytest.mark.parametrize("service", PRUNE.AWS_SERVICES)
def test_a_client_for_each_kept_service_can_be_made_from_the_pruned_tree(pruned_data, service):
    from botocore.loaders import Loader
    from botocore.session import Session

    botocore_data, boto3_data = pruned_data
    session = Session()
    session.register_component("data_loader", Loader(extra_search_paths=[str(botocore_data)],
                                                     include_default_search_paths=False))
    client = session.create_client(service, region_name="us-east-1", aws_access_key_id="testing",
                                   aws_secret_access_key="testing")
    assert client.meta.service_model.service_name == service
    if (boto3_data / service).is_dir():  # boto3's resource model (dynamodb: budget_guard's alert table)
        Loader(extra_search_paths=[str(boto3_data)], include_default_search_paths=False).load_service_model(service, "resources-1")


# ---------------------------------------------------------------- the built layers

def _built(layer_id: str) -> Path:
    path = BUILT[layer_id]
    if not path.is_dir():
        message = f"{path.relative_to(REPO_ROOT)} is missing: run `make build` first"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.mark.parametrize("layer_id", sorted(LAYERS))
def test_each_layer_is_at_most_40_mb_unzipped(layer_id):
    size, _ = footprint.unzipped_size(_built(layer_id).parent)
    assert size <= footprint.LAYER_LIMIT_MB * 1e6, f"{layer_id}: {size / 1e6:.1f} MB"


@pytest.mark.parametrize("layer_id", sorted(LAYERS))
def test_each_layer_ships_bytecode_lambda_uses_without_checking_the_source(layer_id):
    root = _built(layer_id)
    sources = [p for p in root.rglob("*.py") if "__pycache__" not in p.parts]
    assert sources
    for source in sources:
        compiled = source.parent / "__pycache__" / f"{source.stem}.cpython-311.pyc"
        assert compiled.is_file(), source.relative_to(root)
        flags = int.from_bytes(compiled.read_bytes()[4:8], "little")
        assert flags == 0b01, f"{compiled.relative_to(root)}: not unchecked-hash (flags {flags})"


def test_no_package_is_in_two_layers():
    tops = {layer_id: {p.name for p in _built(layer_id).iterdir() if p.name != "__pycache__"} for layer_id in sorted(LAYERS)}
    seen: dict[str, str] = {}
    for layer_id, names in tops.items():
        for name in names:
            assert name not in seen, f"{name} is in {seen[name]} and {layer_id}"
            seen[name] = layer_id


def test_layers_are_built_for_the_functions_architecture():
    [architecture] = TEMPLATE.globals["Function"]["Architectures"]
    for layer_id, source in LAYERS.items():
        resource = TEMPLATE.resources[layer_id]
        assert resource["Properties"]["CompatibleArchitectures"] == [architecture], layer_id
        assert resource["Metadata"] == {"BuildMethod": "makefile", "BuildArchitecture": architecture}, layer_id
        platform = re.search(r"^PLATFORM \?= (\S+)$", (source / "Makefile").read_text(), re.M).group(1)
        assert platform == f"manylinux2014_{footprint._ARCH[architecture]}", layer_id
