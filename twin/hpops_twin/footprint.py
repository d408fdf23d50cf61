"""`make bench`, footprint: what each Lambda function imports on a cold start, and how big the layers are.

1. Handler import, per function in template.yaml: a fresh `python3.11 -S -c` imports the handler
   module with PYTHONPATH = the function's code, then the layers it attaches (Globals first), as
   Lambda orders sys.path, in Lambda's environment (LAMBDA_TASK_ROOT etc., so Powertools'
   Tracer loads and patches the X-Ray SDK as it does in AWS) and with PYTHONDONTWRITEBYTECODE (the
   layer is read-only there). The time counted is the import of the module plus the imports its
   handler function makes in its own body (a handler that imports paramiko on its first call pays
   for it on a cold start all the same). Each function's run follows a run of `import boto3`
   against the layers every function has, RUNS pairs per function: reported are the median of its
   runs, the median of the boto3 runs and the median of the pair-by-pair ratios, which is what is
   compared with TARGET_RATIO (a slow spell on a shared machine weighs on both sides of a pair). -S
   keeps the interpreter's own site-packages out: a module the layers lack fails the run instead of
   being found elsewhere.
2. Layer size: the sum of the file sizes (what Lambda counts as unzipped) of each layer's build in
   .aws-sam/build/<LayerId> (built here with its Makefile when `sam build` has not run).

The layers are built for the functions' architecture (arm64). On a machine of another architecture
their native modules (cryptography, pydantic_core, ...) cannot be imported, so imports are measured
against the same Makefile and requirements built for this machine (PLATFORM=manylinux2014_<arch>) in
.aws-sam/footprint/<arch>/; the output says which was used. Times are this machine's, indicative;
the ratio to `import boto3` measured alongside is the figure compared with the target.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hpops_twin.template_model import REPO_ROOT, TemplateModel

RUNS = 7
TARGET_RATIO = 1.5  # a handler import costs at most this many `import boto3`
LAYER_LIMIT_MB = 40.0  # unzipped, per layer; MB = 10**6 bytes
BUILD_DIR = REPO_ROOT / ".aws-sam" / "build"
HOST_BUILD_DIR = REPO_ROOT / ".aws-sam" / "footprint"
PRUNE_SCRIPT = REPO_ROOT / "layers" / "hpops_core" / "prune_layer.py"
_ARCH = {"arm64": "aarch64", "x86_64": "x86_64"}  # template.yaml -> platform.machine()


@dataclass(frozen=True)
class FunctionImport:
    """What one function imports on a cold start: statements run in order."""

    logical_id: str
    handler: str
    code_dir: Path
    layers: tuple[str, ...]
    statements: tuple[str, ...]


@dataclass
class ImportRow:
    function: str
    handler: str
    layers: list[str]
    median_ms: float | None
    boto3_median_ms: float | None  # of the `import boto3` runs paired with this function's
    ratio: float | None  # median of the per-pair ratios
    ok: bool
    samples_ms: list[float] = field(default_factory=list)
    error: str | None = None


@dataclass
class LayerRow:
    layer: str
    path: str
    megabytes: float
    files: int
    ok: bool


@dataclass
class Footprint:
    boto3_median_ms: float | None
    boto3_samples_ms: list[float]
    boto3_layers: list[str]
    functions: list[ImportRow]
    layers: list[LayerRow]
    loaded_by_function: dict[str, float]  # MB of layers each function attaches (more than one layer only)
    notes: list[str]

    def verdicts(self) -> dict[str, bool]:
        return {
            f"footprint: every handler import <= {TARGET_RATIO}x `import boto3` (fresh interpreter, same layers)":
                bool(self.functions) and all(r.ok for r in self.functions),
            f"footprint: every layer <= {LAYER_LIMIT_MB:.0f} MB unzipped":
                bool(self.layers) and all(r.ok for r in self.layers),
        }


# ---------------------------------------------------------------- what the template declares

def layer_sources(template: TemplateModel) -> dict[str, Path]:
    """LayerId -> its ContentUri folder (where its Makefile is)."""
    return {logical_id: (template.path.parent / resource["Properties"]["ContentUri"]).resolve()
            for logical_id, resource in template.of_type("AWS::Serverless::LayerVersion").items()}


def layer_architecture(template: TemplateModel, layer_id: str) -> str:
    resource = template.resources[layer_id]
    declared = resource.get("Metadata", {}).get("BuildArchitecture") or \
        (resource["Properties"].get("CompatibleArchitectures") or ["x86_64"])[0]
    return _ARCH[declared]


def _layer_ids(value) -> list[str]:
    ids = []
    for item in value or []:
        if isinstance(item, dict) and "Ref" in item:
            ids.append(item["Ref"])
    return ids


def function_layers(template: TemplateModel, logical_id: str) -> tuple[str, ...]:
    """SAM merges Globals' Layers and the function's own: globals first, as Lambda stacks them."""
    own = template.resources[logical_id]["Properties"].get("Layers")
    return tuple(_layer_ids(template.globals.get("Function", {}).get("Layers")) + _layer_ids(own))


def handler_statements(code_dir: Path, handler: str) -> tuple[str, ...]:
    """`import <module>`, then every import the handler function makes in its own body."""
    module, function = handler.rsplit(".", 1)
    tree = ast.parse((code_dir / f"{module}.py").read_text())
    statements = [f"import {module}"]
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function:
            statements += [ast.unparse(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))]
    return tuple(statements)


def function_imports(template: TemplateModel, code_root: Path | None = BUILD_DIR) -> list[FunctionImport]:
    """Every function's cold-start imports; code from `sam build`'s copy when there is one."""
    found = []
    for logical_id, spec in template.functions().items():
        built = code_root / logical_id if code_root else None
        module = f"{spec.handler.rsplit('.', 1)[0]}.py"
        # A `sam build` older than the source would measure yesterday's code: use the source then.
        fresh = (built is not None and (built / module).exists()
                 and (built / module).read_bytes() == (spec.code_uri / module).read_bytes())
        code_dir = built if fresh else spec.code_uri
        found.append(FunctionImport(logical_id, spec.handler, code_dir, function_layers(template, logical_id),
                                    handler_statements(code_dir, spec.handler)))
    return found


# ---------------------------------------------------------------- running an import as Lambda would

def lambda_environment(function: str, handler: str, code_dir: Path, pythonpath: list[Path]) -> dict[str, str]:
    """What the Lambda runtime sets that an import reads (Powertools enables tracing on LAMBDA_TASK_ROOT)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "AWS_", "POWERTOOLS_", "LAMBDA_", "_X_AMZN"))}
    env.update({
        "PYTHONPATH": os.pathsep.join(str(p) for p in pythonpath),
        "PYTHONDONTWRITEBYTECODE": "1",  # /opt and /var/task are read-only on Lambda
        "LAMBDA_TASK_ROOT": str(code_dir),
        "_HANDLER": handler,
        "AWS_LAMBDA_FUNCTION_NAME": function,
        "AWS_EXECUTION_ENV": "AWS_Lambda_python3.11",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "POWERTOOLS_SERVICE_NAME": "footprint",
    })
    return env


def run_imports(python: str, statements: tuple[str, ...] | list[str], env: dict[str, str], *, isolated: bool = True,
                report: str = "ms", timeout: float = 120) -> str:
    """Run the statements in a fresh interpreter. report="ms": the milliseconds they took;
    report="modules": the JSON list of sys.modules after them. Raises RuntimeError on failure."""
    tail = {"ms": "print(round((time.perf_counter() - began) * 1000, 3))",
            "modules": "import json; print(json.dumps(sorted(sys.modules)))"}[report]
    code = "\n".join(["import sys, time", "began = time.perf_counter()", *statements, tail])
    argv = [python, *(["-S"] if isolated else []), "-c", code]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        lines = (done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}").splitlines()
        raise RuntimeError(lines[-1])
    return done.stdout.strip().splitlines()[-1]


def interpreter() -> str:
    """The real python3.11 (not a version manager's shim, whose start-up is not ours to count)."""
    found = shutil.which("python3.11")
    if found:
        done = subprocess.run([found, "-c", "import sys; print(sys.executable)"], capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip()
    if sys.version_info[:2] == (3, 11):
        return sys.executable
    raise RuntimeError("python3.11 is required: the layers hold bytecode for 3.11")


# ---------------------------------------------------------------- layers

def _inputs_digest(source: Path, platform_tag: str) -> str:
    digest = hashlib.sha256(platform_tag.encode())
    for path in sorted([*source.rglob("*"), PRUNE_SCRIPT]):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def build_layer(layer_id: str, source: Path, out: Path, platform_tag: str | None = None) -> None:
    """The same command `sam build` runs (BuildMethod: makefile)."""
    argv = ["make", "--no-print-directory", "--makefile", str(source / "Makefile"), f"build-{layer_id}",
            f"ARTIFACTS_DIR={out}"]
    if platform_tag:
        argv.append(f"PLATFORM={platform_tag}")
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    done = subprocess.run(argv, cwd=source, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"building {layer_id} failed: {(done.stderr.strip() or done.stdout.strip())[-600:]}")


def deployed_layer(layer_id: str, source: Path, notes: list[str]) -> Path:
    """.aws-sam/build/<LayerId>; built with its Makefile if `sam build` has not run."""
    out = BUILD_DIR / layer_id
    if not (out / "python").is_dir():
        notes.append(f"{layer_id}: no `sam build` output, so built now with {source.relative_to(REPO_ROOT)}/Makefile "
                     f"into {out.relative_to(REPO_ROOT)}")
        build_layer(layer_id, source, out)
    return out


def importable_layer(template: TemplateModel, layer_id: str, source: Path, notes: list[str]) -> Path:
    """The layer this machine can import: the deployed build when the architectures agree, else the
    same recipe built for this machine (cached until its inputs change)."""
    wanted, here = layer_architecture(template, layer_id), platform.machine()
    if wanted == here:
        return deployed_layer(layer_id, source, notes)
    tag = f"manylinux2014_{here}"
    out = HOST_BUILD_DIR / here / layer_id
    stamp = out / ".inputs"
    digest = _inputs_digest(source, tag)
    if not (stamp.exists() and stamp.read_text() == digest and (out / "python").is_dir()):
        build_layer(layer_id, source, out, tag)
        stamp.write_text(digest)
        notes.append(f"{layer_id}: built for {here} with PLATFORM={tag} into {out.relative_to(REPO_ROOT)}")
    return out


def unzipped_size(path: Path) -> tuple[int, int]:
    """(bytes, files): the sum of the sizes of the files under path, as Lambda counts unzipped size."""
    total = files = 0
    for entry in path.rglob("*"):
        if entry.is_file() and not entry.is_symlink():
            total += entry.stat().st_size
            files += 1
    return total, files


# ---------------------------------------------------------------- the measurement

def measure(runs: int = RUNS, template: TemplateModel | None = None,
            progress: Callable[[str], None] = lambda text: None) -> Footprint:
    """progress: told when the layers are read or built and when each import round starts (a first
    run builds the layers with pip, and each round starts two interpreters per function: minutes
    with nothing else to show)."""
    template = template or TemplateModel()
    notes: list[str] = []
    sources = layer_sources(template)

    layer_rows = []
    progress("  footprint: layers (built with pip first if `sam build` has not run or their inputs changed)")
    for layer_id, source in sources.items():
        out = deployed_layer(layer_id, source, notes)
        size, files = unzipped_size(out)
        layer_rows.append(LayerRow(layer_id, str(out.relative_to(REPO_ROOT)), size / 1e6, files, size / 1e6 <= LAYER_LIMIT_MB))
    sizes = {r.layer: r.megabytes for r in layer_rows}

    python = interpreter()
    importable = {layer_id: importable_layer(template, layer_id, source, notes) / "python" for layer_id, source in sources.items()}
    arches = {layer_architecture(template, layer_id) for layer_id in sources}
    if arches != {platform.machine()}:
        notes.append(f"imports measured on {platform.machine()} against the layers' recipe built for this machine "
                     f"({HOST_BUILD_DIR.relative_to(REPO_ROOT)}/{platform.machine()}/): the deployed {', '.join(sorted(arches))} "
                     "build's native modules cannot load here; its sizes are the deployed build's")
    else:
        notes.append(f"imports measured against the deployed layer builds ({BUILD_DIR.relative_to(REPO_ROOT)})")

    targets = function_imports(template)
    built = [t for t in targets if BUILD_DIR in t.code_dir.parents]
    notes.append(f"function code from {'`sam build` (.aws-sam/build/<FunctionId>)' if len(built) == len(targets) else 'the source folders (functions/)'}"
                 + ("" if len(built) in (0, len(targets)) else f" for {len(built)} of {len(targets)}"))
    baseline_layers = tuple(_layer_ids(template.globals.get("Function", {}).get("Layers")))

    samples: dict[str, list[float]] = {t.logical_id: [] for t in targets}
    paired: dict[str, list[float]] = {t.logical_id: [] for t in targets}  # the boto3 run just before each
    errors: dict[str, str] = {}
    boto3_samples: list[float] = []
    boto3_env = lambda_environment("Boto3Baseline", "none.none", REPO_ROOT, [importable[l] for l in baseline_layers])
    for round_number in range(runs):
        progress(f"  footprint: import round {round_number + 1}/{runs}, {len(targets)} functions, each after `import boto3`")
        # Each function's run follows an `import boto3` run against the layers every function has:
        # the ratio is taken pair by pair, so a slow spell on the machine weighs on both sides. The
        # order turns each round, so such a spell does not land on the same functions every time.
        order = targets[round_number % len(targets):] + targets[:round_number % len(targets)] if targets else []
        for target in order:
            if target.logical_id in errors:
                continue
            env = lambda_environment(target.logical_id, target.handler, target.code_dir,
                                     [target.code_dir] + [importable[l] for l in target.layers])
            try:
                baseline = float(run_imports(python, ["import boto3"], boto3_env))
            except (RuntimeError, subprocess.TimeoutExpired) as error:
                raise RuntimeError(f"footprint: `import boto3` against {', '.join(baseline_layers)} failed: {error}") from None
            try:
                measured = float(run_imports(python, target.statements, env))
            except (RuntimeError, subprocess.TimeoutExpired) as error:
                errors[target.logical_id] = str(error)
                continue
            boto3_samples.append(baseline)
            samples[target.logical_id].append(measured)
            paired[target.logical_id].append(baseline)

    boto3_ms = statistics.median(boto3_samples) if boto3_samples else None
    rows = []
    for target in targets:
        values, baselines = samples[target.logical_id], paired[target.logical_id]
        failed = target.logical_id in errors
        median = statistics.median(values) if values and not failed else None
        ratio = statistics.median(v / b for v, b in zip(values, baselines)) if median is not None else None
        rows.append(ImportRow(target.logical_id, target.handler, list(target.layers), median,
                              statistics.median(baselines) if baselines and not failed else None, ratio,
                              ratio is not None and ratio <= TARGET_RATIO, values, errors.get(target.logical_id)))

    loaded = {t.logical_id: sum(sizes.get(l, 0.0) for l in t.layers) for t in targets if len(t.layers) > 1}
    return Footprint(boto3_ms, boto3_samples, list(baseline_layers), rows, layer_rows, loaded, notes)


# ---------------------------------------------------------------- output

def render(result: Footprint) -> str:
    runs = max((len(r.samples_ms) for r in result.functions), default=0)
    lines = [f"footprint: handler import on a cold start (fresh python3.11, module + its handler's own imports), "
             f"{runs} runs per function, each after an `import boto3` run; target <= {TARGET_RATIO}x"]
    header = f"{'function':<36} {'handler':<54} {'import ms':>9} {'boto3 ms':>8} {'x boto3':>7}"
    lines += [header, "-" * len(header)]
    for r in result.functions:
        if r.median_ms is None:
            lines.append(f"{r.function:<36} {r.handler:<54} {'-':>9} {'-':>8} {'-':>7}  MISS  {r.error or 'no runs'}")
            continue
        lines.append(f"{r.function:<36} {r.handler:<54} {r.median_ms:9.1f} {r.boto3_median_ms:8.1f} {r.ratio:7.2f}  "
                     f"{'ok' if r.ok else 'MISS'}")
    baseline = f"{result.boto3_median_ms:.1f}" if result.boto3_median_ms is not None else "-"
    lines.append(f"{'import boto3, all runs':<36} {'(' + ' + '.join(result.boto3_layers) + ')':<54} {'':>9} {baseline:>8}")
    lines.append("")
    lines.append(f"{'layer (unzipped: sum of file sizes)':<36} {'build':<54} {'MB':>9} {'files':>7}")
    for r in result.layers:
        lines.append(f"{r.layer:<36} {r.path:<54} {r.megabytes:9.1f} {r.files:>7}  {'ok' if r.ok else 'MISS'}")
    groups: dict[tuple[str, ...], list[str]] = {}
    for r in result.functions:
        if r.function in result.loaded_by_function:
            groups.setdefault(tuple(r.layers), []).append(r.function.removesuffix("Function"))
    for layers, functions in groups.items():
        megabytes = result.loaded_by_function[functions[0] + "Function"]
        lines.append(f"{' + '.join(layers) + ' (all loaded)':<91} {megabytes:9.1f}  by {', '.join(functions)}")
    lines += [f"  note: {n}" for n in result.notes]
    return "\n".join(lines)


def footprint_section(runs: int = RUNS, progress: Callable[[str], None] = lambda text: None) -> tuple[Footprint, dict[str, bool]]:
    """For bench.py: measure, print, and return the verdicts."""
    result = measure(runs, progress=progress)
    print()
    print(render(result), flush=True)
    return result, result.verdicts()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Cold-start imports per Lambda function and layer sizes.")
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    result, verdicts = footprint_section(args.runs)
    print()
    for text, ok in verdicts.items():
        print(f"{'ok  ' if ok else 'MISS'} {text}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"footprint": asdict(result), "targets": verdicts}, handle, indent=2)
    return 0 if all(verdicts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
