"""The README stays true: its commands run (or say why not) and its bench figures are measured ones.

Commands: every command line the README shows, in its code blocks and as inline `hpops ...`-style
spans, is either run offline (here: OFFLINE; by the twin test that checks its output: IN_TWIN_TESTS)
or listed with the reason it is not (SKIPPED, and MENTIONS for a command the prose names without its
arguments). A command in none of them fails
test_every_readme_command_is_run_or_skipped, so a new one gets a decision. Run or not, each is
checked against what it names: hpops's own argument parser, the Makefile's targets and
variables, a module's --help.

Figures: what the README quotes from `make bench` is compared with docs/bench.json, the JSON of one
real `make bench JSON=docs/bench.json` run. Counts must be equal. Times and import ratios vary from
run to run, so for them the README's section must say they come from that file, and they must be
near the file's values (no machine's timing is asserted here).
"""

from __future__ import annotations

import itertools
import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
README = REPO_ROOT / "README.md"
BENCH = REPO_ROOT / "docs" / "bench.json"
DOCS = REPO_ROOT / "docs"
README_MAX_LINES = 250


def doc_pages() -> list[Path]:
    """The documentation set: the README (the front door) and the guide's pages under docs/."""
    return [README, *sorted(DOCS.glob("*.md"))]


def docs_text() -> str:
    """Every page of the documentation set, one after the other (a section or table lives in one page)."""
    return "\n\n".join(page.read_text(encoding="utf-8") for page in doc_pages())

# A line (or inline span of two words or more) that starts with one of these is a command.
PROGRAMS = {"hpops", "make", "python", "python3", "pip", "sam", "aws", "bash", "sh", "journalctl", "sshd",
            "ssh-keygen", "ssh", "systemctl", "sacct", "curl"}
# Code blocks that are not commands and have no box-drawing to show it, by their first word.
NOT_COMMANDS = {
    "@cert-authority": "a known_hosts line for users",
    "template.yaml": "the repository's layout (test_architecture.py checks its paths)",
}
FIGURE = re.compile(r"[─│►◄→└┐┘┼]")


@dataclass(frozen=True)
class Offline:
    exit_code: int = 0
    says: str = ""  # text its output must contain
    why_exit: str = "success"


# Run here, from the repository root, as the README shows them; each starts a local twin (no AWS).
OFFLINE = {
    "hpops twin send events/hyperpod-node-health.json events/repair-dry-run.json": Offline(0, "in sync"),
}
# Run as the README shows them by the twin test that asserts what they print (a twin world, and for
# cost a month played in it, is not a unit test's to build a second time): command -> that test file.
IN_TWIN_TESTS = {
    "hpops doctor --twin": "tests/twin/test_doctor_command_twin.py",
    "hpops cost --twin": "tests/twin/test_cost_command_twin.py",
}

AWS = "needs a deployed stack and AWS credentials"
ON_A_NODE = "runs on a HyperPod login node, not on the operator's machine"
TOO_LONG = "too long for a unit test"
SKIPPED = {
    "make demo": f"{TOO_LONG} (a minute or more); what its steps show is tested in tests/twin",
    "make test": f"{TOO_LONG}: the whole suite, this test included",
    "make bench": f"{TOO_LONG} (minutes); docs/bench.json is its output and the figures are checked below",
    "make bench JSON=docs/bench.json": f"{TOO_LONG} (minutes); it writes docs/bench.json, checked below",
    "make chaos": f"{TOO_LONG} (minutes); tests/twin/test_chaos.py runs a reduced version",
    "make checkov": "installs checkov into its own venv and scans the template; part of make test",
    "make lifecycle STACK=S": AWS,
    "hpops demo [--json FILE]": f"{TOO_LONG}: it is make demo",
    "python -m hpops_twin.chaos [--json FILE] [--seeds N] [--parts 1,2,3,4,5]": f"{TOO_LONG}: it is make chaos",
    "hpops node enrollments --stack-name S": AWS,
    "hpops node approve-enrollment --stack-name S --node i-... --fingerprint SHA256:...": AWS,
    "python3 -m hpops_node_agent enroll": f"{ON_A_NODE}, as root: enrolls the agent key now "
                                          "(tests/twin/test_adopt_twin.py runs it through adopt)",
    "ssh-keygen -Y sign": f"{ON_A_NODE}: how the agent signs (tests/unit/test_node_proof.py runs it)",
    "hpops host-keys adopt --stack-name S --from-dir ./etc-ssh-of-login-node-1": AWS,
    "hpops host-keys generate --stack-name S": AWS,
    "hpops host-keys rotate --stack-name S": AWS,
    "hpops repair --stack-name S": AWS,
    "hpops host-keys ca-generate --stack-name S": AWS,
    "hpops host-keys ca-show --stack-name S": AWS,
    "hpops lifecycle --stack-name S --out dist/lifecycle": AWS,
    "aws s3 sync dist/lifecycle/hpops s3://<your-lifecycle-bucket>/<prefix>/hpops/": AWS,
    'bash "$(dirname "$0")/hpops/install.sh"': f"{ON_A_NODE}, as root, from on_create.sh "
                                               "(tests/node/test_provisioning_layouts.py runs it so)",
    'bash "$(dirname "$0")/hpops/install.sh" --enroll-first': f"{ON_A_NODE}, as root, first in on_create.sh "
                                                              "(tests/node/test_provisioning_layouts.py runs it so)",
    "hpops lifecycle --patch on_create.sh": "edits your cluster's on_create.sh; tests/aws/test_operator_cli.py "
                                            "patches a script shaped like AWS's reference one",
    "sam build": "builds the layers with pip for arm64 (network, minutes); make test runs it (make build)",
    "sam deploy": AWS,
    "sam deploy --config-env prod": AWS,
    "aws stepfunctions start-execution --state-machine-arn \"$(aws cloudformation describe-stacks --stack-name "
    "hpops-login-autopilot --query \"Stacks[0].Outputs[?OutputKey=='LoginNodeSyncStateMachineArn'].OutputValue\" "
    "--output text)\" --input '{\"cluster\": \"ml-research\", \"mode\": \"repair\", \"dryRun\": true}'": AWS,
    "hpops repair --stack-name hpops-login-autopilot --dry-run": AWS,
    "hpops repair --stack-name hpops-login-autopilot": AWS,
    "hpops status --stack-name hpops-login-autopilot": AWS,
    "hpops status --stack-name S [--region R] [--json]": AWS,
    "hpops cost --stack-name S [--json | --csv]": AWS,
    "hpops cost subscribe --stack-name S USER EMAIL": AWS,
    "hpops doctor --stack-name S": AWS,
    "hpops doctor --cluster NAME --region R": AWS,
    "hpops cost release --stack-name S USER --reason TEXT": AWS,
    "hpops iam-policy --stack-name S [--role operator | --role administrator] [--region R] [--lifecycle-bucket B]": AWS,
    "hpops iam-policy --stack-name S [--role administrator]": AWS,
    "hpops iam-policy --stack-name S": AWS,
    "sam build && sam deploy": AWS,
    "hpops iam-policy --stack-name S --role administrator": AWS,
    "sam deploy --resolve-s3 --role-arn <ServiceRoleArn>": AWS,
    "aws cloudformation deploy --template-file docs/deployer-role.json --stack-name hpops-login-autopilot-deployer "
    "--capabilities CAPABILITY_IAM --parameter-overrides StackName=hpops-login-autopilot "
    "ClusterExecutionRoleName=<role>": AWS,
    "sshd -t": f"{ON_A_NODE}: what the agent checks before a reload",
    "ssh-keygen -y": f"{ON_A_NODE}: how the agent derives public keys",
    "journalctl -u hpops-node-agent": ON_A_NODE,
    "aws iam attach-role-policy --role-name <controller-role> --policy-arn <NodeAgentPolicyArn>": AWS,
    "aws ce update-cost-allocation-tags-status --cost-allocation-tags-status TagKey=ClusterName,Status=Active": AWS,
    "aws s3 cp s3://<your-lifecycle-bucket>/<prefix>/on_create.sh .": AWS,
    "aws s3 cp on_create.sh s3://<your-lifecycle-bucket>/<prefix>/on_create.sh": AWS,
    "hpops adopt --stack-name S": f"{AWS}; tests/twin/test_adopt_twin.py runs its path against the twin's nodes",
    "hpops adopt --stack-name S --print": AWS,
    "hpops status --stack-name S": AWS,
    "pip install .": "installs the CLI into the current Python; make test's bootstrap does the same (editable)",
    "ssh <user>@<LoadBalancerDnsName>": "a user's login through a deployed stack's load balancer",
    "aws ec2 authorize-security-group-ingress --group-id <cluster-sg> --protocol tcp --port 22 --source-group "
    "<LoadBalancerSecurityGroupId>": f"{AWS}; doctor's nlb-path and verifier-path check the rule (tests/twin/test_doctor_twin.py)",
    "hpops cost --stack-name S": AWS,
    "sam delete --stack-name S": AWS,
    "aws budgets delete-budget --account-id ACCOUNT --budget-name hpops-<cluster>": AWS,
    "make docs": "rewrites docs/parameters.md, docs/deployer-policy.json and docs/deployer-role.json; "
                 "tests/unit/test_generated_docs.py "
                 "runs the same generators and compares",
}
# Commands the prose names without their arguments: skipped as well (they need AWS), and only
# checked to be commands hpops has.
MENTIONS = {
    "hpops cost": f"{AWS}; `hpops cost --twin` runs above",
    "hpops repair": AWS,
    "hpops doctor": f"{AWS}; `hpops doctor --twin` runs above",
    "hpops status": AWS,
    "hpops node approve-enrollment": AWS,
    "hpops adopt": AWS,
    "hpops lifecycle": f"{AWS}; the parameter table names it, `hpops lifecycle --stack-name S ...` is above",
    "hpops iam-policy": AWS,
    "hpops iam-policy --role administrator": AWS,
    "hpops host-keys ca-generate": AWS,
    "hpops host-keys generate": AWS,
    "hpops cost release": AWS,
    "aws ssm start-session": f"{AWS}: what hpops adopt runs per node",
    "sam delete": AWS,
    "aws secretsmanager delete-secret": f"{AWS}: removing a CA secret a deletion or a switch to keys mode kept",
    "aws ec2 create-vpc-endpoint": f"{AWS}: doctor's node-network fix (tests/unit/test_doctor_checks.py checks its words)",
    "aws ec2 create-network-acl-entry": f"{AWS}: doctor's network-acl fix (tests/unit/test_doctor_checks.py checks its words)",
}


# ---------------------------------------------------------------- the README's commands

def code_blocks(text: str) -> list[str]:
    """Fenced blocks, also those indented under a numbered step."""
    return re.findall(r"^ *```[^\n]*\n(.*?)^ *```", text, re.S | re.M)


def block_commands(block: str) -> list[str]:
    """The commands of one code block: continuations joined, `a && b` split, comments dropped
    except an alternative they offer (`# or: make lifecycle STACK=S`)."""
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        line, _, comment = line.partition(" # ")
        alternative = comment.strip().removeprefix("or:") if comment.strip().startswith("or:") else ""
        for part in [*line.strip().split(" && "), alternative]:
            words = part.split()
            if words and words[0] in PROGRAMS:
                commands.append(" ".join(words))
    return commands


def inline_commands(text: str) -> list[str]:
    """Spans of two words or more that start with a program; `hpops status: access denied ...` is
    a message the program prints, not a command."""
    prose = re.sub(r"^ *```.*?^ *```", "", text, flags=re.S | re.M)
    spans = [span.split() for span in re.findall(r"`([^`\n]+)`", prose)]
    return [" ".join(words) for words in spans
            if len(words) > 1 and words[0] in PROGRAMS and not words[1].endswith(":")]


def readme_commands() -> list[str]:
    text = docs_text()
    found = [c for block in code_blocks(text) for c in block_commands(block)] + inline_commands(text)
    return list(dict.fromkeys(found))


def test_every_code_block_is_commands_or_a_figure():
    """A block with commands holds nothing else, so no command hides behind an unknown program name."""
    unclear = []
    for block in code_blocks(docs_text()):
        lines = [re.sub(r"\s+#\s.*$", "", line).strip() for line in block.replace("\\\n", " ").splitlines()]
        lines = [line for line in lines if line]
        if not lines:
            continue
        first_words = [line.split()[0] for line in lines]
        if any(word in PROGRAMS for word in first_words):
            unclear += [line for line, word in zip(lines, first_words) if word not in PROGRAMS]
        elif not FIGURE.search(block) and first_words[0] not in NOT_COMMANDS:
            unclear.append(lines[0])
    assert not unclear, (f"README code lines that are neither a command of {sorted(PROGRAMS)} nor part of a figure: "
                         f"{unclear}; add the program to PROGRAMS or the block to NOT_COMMANDS")


def test_every_readme_command_is_run_or_skipped():
    commands = readme_commands()
    assert "hpops cost --twin" in commands  # the extraction itself works
    undecided = [c for c in commands if not any(c in listed for listed in (OFFLINE, IN_TWIN_TESTS, SKIPPED, MENTIONS))]
    assert not undecided, ("README commands neither run (OFFLINE, IN_TWIN_TESTS) nor skipped with a reason (SKIPPED): "
                           f"{undecided}")
    lists = (OFFLINE, IN_TWIN_TESTS, SKIPPED, MENTIONS)
    twice = {c for one, other in itertools.combinations(lists, 2) for c in set(one) & set(other)}
    assert not twice, f"listed twice: {twice}"


@pytest.mark.parametrize("command", sorted(IN_TWIN_TESTS))
def test_a_command_run_by_a_twin_test_is_run_there_as_shown(command):
    source = (REPO_ROOT / IN_TWIN_TESTS[command]).read_text(encoding="utf-8")
    assert f'"{command}"' in source and "shlex.split(" in source, \
        f"{IN_TWIN_TESTS[command]} no longer runs `{command}` as the README shows it"


def test_no_stale_entries():
    shown = set(readme_commands())
    stale = [c for c in [*OFFLINE, *IN_TWIN_TESTS, *SKIPPED, *MENTIONS] if c not in shown]
    assert not stale, f"no longer in the README, drop them here: {stale}"


def synopsis_variants(command: str) -> list[list[str]]:
    """argv lists for a synopsis: each `[a | b]` group absent or one of its choices."""
    groups = re.findall(r"\[([^\]]*)\]", command)
    fixed = re.sub(r"\s*\[[^\]]*\]", "", command)
    choices = [[""] + [choice.strip() for choice in group.split("|")] for group in groups]
    return [shlex.split(" ".join([fixed, *picked])) for picked in itertools.product(*choices)]


def hpops_parse_error(argv: list[str]) -> str | None:
    from hpops.main import build_parser

    try:
        build_parser().parse_args(argv)
    except SystemExit as stop:
        return None if stop.code == 0 else f"hpops {' '.join(argv)}: exit {stop.code}"
    return None if "--help" not in argv else f"hpops {' '.join(argv)}: no help"


def make_targets_and_variables() -> tuple[set[str], set[str]]:
    text = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    targets = {m for line in re.findall(r"^([A-Za-z][\w .-]*):(?!=)", text, re.M) for m in line.split()}
    return targets, set(re.findall(r"\$\((\w+)\)", text))


def checkable(command: str) -> bool:
    """Commands whose program this test can hold them against: hpops, make, python -m."""
    words = command.split()
    return words[0] in ("hpops", "make") or words[:2] in (["python", "-m"], ["python3", "-m"])


@pytest.mark.parametrize("command", sorted(c for c in [*OFFLINE, *IN_TWIN_TESTS, *SKIPPED, *MENTIONS] if checkable(c)))
def test_command_line_fits_what_it_names(command, capsys):
    """Skipped or not, the command line must be one its program accepts: a renamed option or target
    fails here even though the command itself is not run."""
    words = shlex.split(re.sub(r"\s*\[[^\]]*\]", "", command))
    program = words[0]
    if program == "hpops":
        variants = [words + ["--help"]] if command in MENTIONS else synopsis_variants(command)
        errors = [e for argv in variants if (e := hpops_parse_error(argv[1:]))]
        assert not errors, f"{errors}: {capsys.readouterr().err.strip()}"
    elif program == "make":
        targets, variables = make_targets_and_variables()
        named = [w for w in words[1:] if "=" not in w]
        assigned = [w.split("=", 1)[0] for w in words[1:] if "=" in w]
        assert set(named) <= targets, f"no such make target: {set(named) - targets}"
        assert set(assigned) <= variables, f"the Makefile never reads {set(assigned) - variables}"
    else:
        options = set(re.findall(r"--[\w-]+", command))
        shown = subprocess.run([sys.executable, "-m", words[2], "--help"], capture_output=True, text=True,
                               cwd=REPO_ROOT, timeout=120)
        assert shown.returncode == 0, shown.stderr[-500:]
        missing = {o for o in options if o not in shown.stdout}
        assert not missing, f"python -m {words[2]} --help does not offer {missing}"


@pytest.mark.parametrize("command", sorted(OFFLINE))
def test_offline_command_runs(command):
    """As the README shows it, from the repository root, with the hpops next to this interpreter."""
    expected = OFFLINE[command]
    argv = shlex.split(command)
    argv[0] = str(Path(sys.executable).with_name(argv[0]))
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == expected.exit_code, \
        f"{command}: exit {done.returncode}, expected {expected.exit_code} ({expected.why_exit})\n{output[-3000:]}"
    assert expected.says in done.stdout, output[-3000:]


# ---------------------------------------------------------------- the figures the README quotes

@pytest.fixture(scope="module")
def bench() -> dict:
    return json.loads(BENCH.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def readme() -> str:
    return " ".join(docs_text().split())  # one line: claims wrap anywhere


def section(title: str) -> str:
    """One `## ` section of the README or a docs/ page, whitespace collapsed."""
    text = "\n" + docs_text()
    start = text.index(f"\n## {title}")
    end = text.find("\n## ", start + 1)
    return " ".join(text[start:end if end > 0 else None].split())


def number(text: str) -> float:
    return float(text.replace(",", ""))


def claim(text: str, pattern: str) -> tuple[str, ...]:
    found = re.search(pattern, text)
    assert found, f"the README no longer says /{pattern}/: update it or this test"
    return found.groups()


def near(quoted: float, measured: float, share: float = 0.25) -> bool:
    """Timing figures: within a quarter of the measured value (or half a unit of what the README rounds to)."""
    return abs(quoted - measured) <= max(share * measured, 0.5 if quoted == int(quoted) else 0.005)


def rows_of(bench: dict, key: str, scenario: str) -> list[dict]:
    rows = [r for r in bench[key] if r["scenario"] == scenario]
    assert rows, f"docs/bench.json has no {key} row {scenario!r}"
    return rows


def span(text: str) -> tuple[int, int]:
    """'7' -> (7, 7); '7–9' -> (7, 9): a figure that differs between the cluster sizes of one run."""
    low, _, high = text.partition("–")
    return int(number(low)), int(number(high or low))


def measured_span(values) -> tuple[int, int]:
    values = list(values)
    return min(values), max(values)


def named_calls(cell: str) -> dict[str, tuple[int, int]]:
    """'1 `GetParameter`, 2–3 `ListClusterNodes`, `DescribeVpcs` (CA)' -> {'GetParameter': (1, 1), ...}."""
    return {name: span(count or "1") for count, name in re.findall(r"(?:(\d+(?:–\d+)?) )?`(\w+)`", cell)}


def operations(calls: dict, services: tuple[str, ...] | None = None, exclude: tuple[str, ...] = ()) -> dict[str, int]:
    kept = {}
    for key, count in calls.items():
        service, name = key.split(".", 1)
        if (services is None or service in services) and service not in exclude:
            kept[name] = kept.get(name, 0) + count
    return kept


def table(text: str, header: str) -> list[list[str]]:
    """The rows of the markdown table whose header row starts with `header`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {header} |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


# README row label -> the bench's scenario name
SYNC_SCENARIOS = {
    "idle sweep": "idle sweep",
    "one login node replaced, one event → verified, registered": "replacement: one event -> converged",
    "replacement as a 20-event burst": "replacement: 20-event burst",
    "certificate mode: one replacement → certified, verified, registered": "cert mode: replacement -> converged",
    "certificate mode: daily check, nothing due": "cert mode: daily check, nothing due",
}
CHANNEL_SCENARIOS = {
    "node join: Running → verified → registered": "node join: Running -> verified -> registered",
    "rotation: repair publishes → all 4 nodes acknowledged → re-verified": "rotation: publish -> all acknowledged",
}
SYNC_SERVICES = ("sagemaker", "elastic-load-balancing-v2", "dynamodb")


def test_login_node_sync_table(bench):
    """A figure is the same at every cluster size, or the README gives the run's range (`7–9`)."""
    rows = table(docs_text(), "scenario | cluster nodes")
    assert [r[0] for r in rows] == list(SYNC_SCENARIOS), "a row was added or renamed: map it in SYNC_SCENARIOS"
    for label, sizes, sm_elb, ddb, other, transitions in rows:
        measured = rows_of(bench, "rows", SYNC_SCENARIOS[label])
        assert sorted(r["cluster_nodes"] for r in measured) == sorted(int(number(s)) for s in sizes.split("/")), label
        assert span(sm_elb) == measured_span(r["sagemaker_elb_calls"] for r in measured), label
        assert span(ddb.split()[0]) == measured_span(r["dynamodb_calls"] for r in measured), label
        for name, quoted in named_calls(ddb).items():
            assert quoted == measured_span(operations(r["calls"], ("dynamodb",)).get(name, 0) for r in measured), f"{label}: {name}"
        others = [operations(r["calls"], exclude=SYNC_SERVICES) for r in measured]
        assert set(named_calls(other)) == {name for calls in others for name in calls}, label
        for name, quoted in named_calls(other).items():
            assert quoted == measured_span(calls.get(name, 0) for calls in others), f"{label}: {name}"
        assert span(transitions) == measured_span(r["state_transitions"] for r in measured), label


def test_node_channel_table(bench):
    rows = table(docs_text(), "scenario | agent polls per node")
    assert [r[0] for r in rows] == list(CHANNEL_SCENARIOS), "a row was added or renamed: map it in CHANNEL_SCENARIOS"
    for label, polls, reads, agent, transitions in rows:
        (r,) = rows_of(bench, "node_channel", CHANNEL_SCENARIOS[label])
        assert int(polls.split()[0]) == r["max_polls_per_node"], label
        assert int(reads) == r["waits"], label
        per_node = agent.startswith("per node:")
        calls = {name: count / (r["nodes"] if per_node else 1) for name, count in operations(r["agent_calls"]).items()}
        assert named_calls(agent) == {name: (count, count) for name, count in calls.items()}, label
        assert int(transitions) == r["state_transitions"], label
        nodes = re.search(r"all (\d+) nodes", label)
        assert nodes is None or int(nodes[1]) == r["nodes"], label


def test_login_node_sync_sentences(bench, readme):
    idle = {r["state_transitions"] for r in rows_of(bench, "rows", "idle sweep")}
    (transitions,) = claim(readme, r"\((\d+) state transitions, `make bench`")
    assert {int(transitions)} == idle
    (login_nodes,) = claim(readme, r"Measured in the twin with (\d+) login nodes")
    assert int(login_nodes) == bench["config"]["login_nodes"]
    (channel_nodes,) = claim(readme, r"The node channel \(keys mode, (\d+) login nodes")
    assert int(channel_nodes) == bench["config"]["login_nodes"]
    coalesced, executions = claim(readme, r"In a burst, (\d+) of (\d+) executions only touch the lease")
    for r in rows_of(bench, "rows", "replacement: 20-event burst"):
        assert (int(coalesced), int(executions)) == (r["coalesced"], r["executions"]), r["cluster_nodes"]


def test_footprint_table(bench, readme):
    footprint = bench["footprint"]
    functions = footprint["functions"]
    (runs,) = claim(readme, r"(\d+) runs per function")
    assert {len(f["samples_ms"]) for f in functions} == {int(runs)}
    (machine,) = claim(readme, r"imports timed on this (\S+) machine")
    assert machine == bench["run"]["machine"]
    (cpus,) = claim(readme, r"on a noisy (\d+)-CPU machine")
    assert int(cpus) == bench["run"]["cpus"]
    within, total, low, high = claim(readme, r"(\d+) of (\d+) within: ([\d.]+)–([\d.]+)x")
    assert (int(within), int(total)) == (sum(f["ok"] for f in functions), len(functions))
    ratios = [f["ratio"] for f in functions]
    assert near(float(low), min(ratios)) and near(float(high), max(ratios)), (low, high, min(ratios), max(ratios))
    release, record = claim(readme, r"ReleaseLeaseOfEndedSync ([\d.]+)x and RecordNodeReport ([\d.]+)x")
    for name, ratio in (("ReleaseLeaseOfEndedSync", release), ("RecordNodeReport", record)):
        (measured,) = [f["ratio"] for f in functions if f["function"] == f"{name}Function"]
        assert near(float(ratio), measured), (name, ratio, measured)
    layers = {layer["layer"]: layer["megabytes"] for layer in footprint["layers"]}
    (shared,) = claim(readme, r"`SharedCodeLayer` unzipped, [^|]*\| ([\d.]+) MB")
    assert float(shared) == round(layers["SharedCodeLayer"], 1)
    libs, loaded = claim(readme, r"`HostIdentityLibsLayer` unzipped [^|]*\| ([\d.]+) MB \(those functions load ([\d.]+) MB in all\)")
    assert float(libs) == round(layers["HostIdentityLibsLayer"], 1)
    assert {float(loaded)} == {round(mb, 1) for mb in footprint["loaded_by_function"].values()}
    (how_many,) = claim(readme, r"the (\w+) functions that check host keys or agents' signatures only")
    words = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"]
    assert how_many == words[len(footprint["loaded_by_function"]) - 1]
    targets = " ".join(bench["targets"])
    for target in re.findall(r"\| ≤ ([\d.]+ ?(?:x|MB)) \|", readme):
        assert f"<= {target}" in targets, f"no bench target <= {target}"


def test_demo_cost(bench):
    text = section("The local twin")
    cpu, beat = claim(text, r"`make demo` \(`hpops demo \[--json FILE\]`\) runs the real thing without AWS, in about "
                            r"(\d+) s of CPU warm .* a line at least every (\d+) s while a step works")
    assert near(float(cpu), bench["demo"]["cpu_seconds"]) and bench["demo"]["exit_status"] == 0
    from hpops_twin.demo import HEARTBEAT_SECONDS

    assert float(beat) == HEARTBEAT_SECONDS


def test_session_limits_cost(bench):
    text = section("Session limits per user")
    sessions, users = claim(text, r"`make bench`, ([\d,]+) active sessions of (\d+) users")
    assert (int(number(sessions)), int(users)) == (bench["config"]["active_sessions"], bench["config"]["session_users"])
    rows = {r["scenario"]: r for r in bench["session_limits"]}
    (under,) = claim(text, r"a `StartSession` for a user under the limit costs (\d+) call")
    assert {r["total_calls"] for name, r in rows.items() if name.startswith("StartSession, user under limit")} == {int(under)}
    (over,) = claim(text, r"one over the limit (\d+) \(")
    assert int(over) == rows["StartSession, user over limit (1 ended)"]["total_calls"]
    cold, warm = rows["sweep, cold run-as tag cache"], rows["sweep, warm tag cache (< 5 min later)"]
    (pages,) = claim(text, r"A sweep costs (\d+) `DescribeSessions` pages")
    assert int(pages) == cold["calls"]["ssm.DescribeSessions"] == warm["calls"]["ssm.DescribeSessions"]
    tags, cold_seconds = claim(text, r"\((\d+) calls; about ([\d.]+) s in the twin\)")
    assert int(tags) == cold["calls"]["iam.ListRoleTags"]
    assert not [k for k in warm["calls"] if k.startswith("iam.")]
    (warm_seconds,) = claim(text, r"nothing more when warm \(([\d.]+) s\)")
    claim(text, r"times from the run in `docs/bench\.json`")
    assert near(float(cold_seconds), cold["execution_seconds"]) and near(float(warm_seconds), warm["execution_seconds"])


BOUND_SCENARIOS = {
    "SSH login over the limit, worst case (just after a poll)": ("ssh", "worst", "node report and sweep"),
    "SSH login over the limit, typical case (mid-poll)": ("ssh", "typical", "node report and sweep"),
    "Session Manager shell over the limit (its `StartSession` event)": ("ssm", "worst", "StartSession event"),
    "before node reports started checks: SSH, worst case (sweep only)": ("ssh", "worst", "sweep only"),
    "before node reports started checks: SSH, typical case (sweep only)": ("ssh", "typical", "sweep only"),
}


def test_session_limit_bound(bench, readme):
    """The bound from a login over the cluster-wide limit to the session ended, as `make bench` measured it."""
    bound = bench["session_limit_bound"]
    measured = {(r["path"], r["case"], r["checks"]): r for r in bound["rows"]}
    rows = table(docs_text(), "session-limit bound")
    assert [r[0] for r in rows] == list(BOUND_SCENARIOS), "a row was added or renamed: map it in BOUND_SCENARIOS"
    for label, polls, sweeps, seconds, executions, transitions in rows:
        r = measured[BOUND_SCENARIOS[label]]
        assert (int(polls), int(sweeps), int(executions), int(transitions)) == (
            r["polls"], r["sweeps"], r["executions"], r["transitions"]), label
        assert float(seconds) == round(r["seconds"]), label
    text = section("Performance (`make bench`)")
    nodes, poll, sweep = claim(text, r"The session-limit bound \((\d+) login nodes.*?agent polls every (\d+) s, "
                                     r"`SessionSweepSchedule` every (\d+) s")
    assert (int(nodes), float(poll), float(sweep)) == (bound["login_nodes"], bound["poll_seconds"], bound["sweep_seconds"])
    limits = section("Session limits per user")
    polls, worst, typical, jittered = claim(limits, r"ended within \*\*(\d+) agent polls\*\*.*?\*\*(\d+) s\*\* at the "
                                                    r"defaults in the worst case.*? and (\d+) s typically.*?at most (\d+) s")
    assert (int(polls), float(worst), float(typical)) == (
        bound["ssh_worst_polls"], bound["ssh_worst_seconds"], bound["ssh_typical_seconds"])
    assert int(jittered) == round(bound["ssh_worst_seconds"] * (1 + bound["poll_jitter"]))
    before_polls, before_seconds = claim(limits, r"Before, it waited for the sweep: (\d+) polls, (\d+) s")
    assert (int(before_polls), float(before_seconds)) == (
        bound["ssh_worst_polls_sweep_only"], bound["ssh_worst_seconds_sweep_only"])
    (shell_polls,) = claim(limits, r"before any poll \((\d+) polls;")
    assert int(shell_polls) == measured[("ssm", "worst", "StartSession event")]["polls"]
    (transitions,) = claim(limits, r"A crossing costs one execution of (\d+) state transitions")
    assert int(transitions) == bound["transitions_per_crossing"]
    changes, crossings, per_crossing = claim(text, r"every 1,000 changes of a login node's session list cost \$([\d.]+) .*?"
                                                   r"every 1,000 crossings of a session limit \$([\d.]+) more \((\d+) state")
    per_1000 = bench["cost"]["defaults"]["per_1000_events"]
    assert (float(changes), float(crossings)) == (per_1000["session_list_changes"], per_1000["crossings"])
    assert int(per_crossing) == bound["transitions_per_crossing"]
    front_polls, front_seconds = claim(readme, r"an SSH login over the limit is ended within (\d+) agent polls "
                                               r"\((\d+) s at the defaults, worst case")
    assert (int(front_polls), float(front_seconds)) == (bound["ssh_worst_polls"], bound["ssh_worst_seconds"])


def test_budget_guard_cost(bench):
    text = section("Budget guardrails")
    rows = {r["scenario"]: r for r in bench["budget_guard"]}
    quiet = rows["state change, no scale-out"]
    calls, names, transitions = claim(text, r"a state change without a scale-out costs (\d+) calls \(([^)]*)\) and (\d+) state transitions")
    assert int(calls) == quiet["total_calls"]
    assert sorted(n.strip() for n in names.split(",")) == sorted(operations(quiet["calls"]))
    assert int(transitions) == quiet["state_transitions"]
    alert = rows["scale-out -> projected overrun alert"]
    alerts, in_all = claim(text, r"a scale-out that alerts (\d+), one of them the Cost Explorer request.*?\((\d+) calls in all in the bench")
    assert alert["calls"]["cost-explorer.GetCostAndUsage"] == 1
    assert int(alerts) == alert["total_calls"] - alert["calls"].get("pricing.GetProducts", 0)
    assert int(in_all) == alert["total_calls"]
    (sweep,) = claim(text, r"the hourly sweep (\d+)")
    assert int(sweep) == rows["hourly sweep (DescribeCluster)"]["total_calls"]


def test_readme_says_where_the_figures_come_from_and_how_to_refresh_them(bench):
    performance = section("Performance (`make bench`)")
    assert "`docs/bench.json`" in performance and "`make bench JSON=docs/bench.json`" in performance
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", bench["run"]["finished"])  # bench.py's own record


def test_cost_table(bench):
    """Every line and total of "What it costs to run" is the cost model's, in docs/bench.json."""
    from hpops_twin.cost_model import LEAN, cost_section

    cost = bench["cost"]
    assert cost == json.loads(json.dumps(cost_section(bench))), "docs/bench.json's cost is stale: python -m hpops_twin.cost_model"
    text = section("Performance (`make bench`)")
    defaults, lean = cost["defaults"], cost["lean"]
    (recorded,) = claim(text, r"list prices recorded (\d{4}-\d\d-\d\d)")
    assert recorded == defaults["prices_recorded"]
    (nodes,) = claim(text, r"one cluster, (\d+) login nodes")
    assert int(nodes) == defaults["login_nodes"] == bench["config"]["login_nodes"]
    alone, with_lb = claim(text, r"the automation alone about \*\*\$([\d.]+)\*\* a month, \*\*\$([\d.]+)\*\* with the load balancer")
    assert (float(alone), float(with_lb)) == (defaults["automation_usd"], defaults["with_load_balancer_usd"])
    # Each part a parameter switches off, alone, then all of them.
    for switch in cost["switches"]:
        ((name, value),) = switch["parameters"].items()
        alone_usd, lb_usd = claim(text, rf"`{name}={value}`: \$([\d.]+) alone, \$([\d.]+) with the load balancer")
        assert (float(alone_usd), float(lb_usd)) == (switch["automation_usd"], switch["with_load_balancer_usd"]), name
    both = ", ".join(f"`{name}={value}`" for name, value in LEAN.items())
    lean_alone, lean_lb = claim(text, re.escape(both) + r": \$([\d.]+) alone, \$([\d.]+) with the load balancer")
    assert LEAN == lean["parameters"] and len(LEAN) == len(cost["switches"])
    assert (float(lean_alone), float(lean_lb)) == (lean["automation_usd"], lean["with_load_balancer_usd"])
    rows = table(docs_text(), "item | per month")
    assert [r[0] for r in rows] == [line["item"] for line in defaults["lines"]]
    for (item, quantity, before, usd), line in zip(rows, defaults["lines"]):
        amount, unit = quantity.rsplit(" ", 1) if quantity.count(" ") == 1 else quantity.split(" ", 1)
        assert unit == line["unit"] and near(number(amount), line["quantity"], share=0.005), item
        assert float(usd) == line["usd"] and float(before) == line["before_usd"], item
    before_alone, before_lb = claim(text, r"the `before` column: \$([\d.]+) and \$([\d.]+)\)")
    assert (float(before_alone), float(before_lb)) == (defaults["before_automation_usd"], defaults["before_with_load_balancer_usd"])
    # The goals, at the defaults: every feature on, and the optional parts off.
    every = cost["every_feature"]
    every_alone, every_lb = claim(text, r"`HostIdentityMode=certificate` adds.*?: \$([\d.]+) alone, \$([\d.]+) with the load balancer")
    assert (float(every_alone), float(every_lb)) == (every["automation_usd"], every["with_load_balancer_usd"])
    goal_every, goal_lean = claim(text, r"at most \$(\d+) a month with every feature on and at most \$(\d+) with the optional parts off")
    assert (float(goal_every), float(goal_lean)) == (cost["goals"]["every_feature_usd"], cost["goals"]["lean_usd"])
    assert every["automation_usd"] <= cost["goals"]["every_feature_usd"] and defaults["automation_usd"] <= cost["goals"]["every_feature_usd"]
    assert lean["automation_usd"] <= cost["goals"]["lean_usd"]
    # The table is a healthy month; the upper bound (every alarm's metric sent all month) is stated beside the goals.
    upper = claim(text, r"Every alarm's metric sent all month \(a month of pages, the upper bound\): \$([\d.]+) alone and "
                        r"\$([\d.]+) with the load balancer at the defaults, \$([\d.]+) and \$(\d+\.\d\d) with every feature on")
    paged = [defaults["every_alarm_all_month"], every["every_alarm_all_month"]]
    assert [float(q) for q in upper] == [t[k] for t in paged for k in ("automation_usd", "with_load_balancer_usd")]
    metrics = next(line for line in defaults["lines"] if line["item"] == "CloudWatch custom metrics")
    before, now, bound, count = claim(text, r"\*\*Custom metrics, \$([\d.]+) → \$([\d.]+)\.\*\*.*?the upper bound, is "
                                            r"\$([\d.]+) \((\d+) metrics\) at the defaults")
    assert (float(before), float(now)) == (metrics["before_usd"], metrics["usd"])
    assert float(bound) == round(defaults["every_alarm_all_month"]["metrics"] * 0.30, 2)
    assert int(count) == defaults["every_alarm_all_month"]["metrics"]


# ---------------------------------------------------------------- the front door and the guide

def test_readme_is_a_front_door():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail into a docs/ page"


def test_every_docs_page_is_linked():
    linked = set()
    for page in (README, DOCS / "README.md"):
        for target in re.findall(r"\]\(([^)#\s]+)", page.read_text(encoding="utf-8")):
            linked.add((page.parent / target).resolve())
    unlinked = [p.name for p in sorted(DOCS.glob("*.md")) if p.name != "README.md" and p.resolve() not in linked]
    assert not unlinked, f"docs/ pages linked from neither README.md nor docs/README.md: {unlinked}"


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), re.M):
        found.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return found


def test_every_relative_link_resolves():
    broken = []
    for page in doc_pages():
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, f"links that lead nowhere: {broken}"


def test_readme_cost_summary(bench):
    """The front door's two totals are the cost table's (the defaults), in docs/bench.json."""
    text = " ".join(README.read_text(encoding="utf-8").split())
    alone, with_lb = claim(text, r"about \*\*\$([\d.]+)\*\* a month for the automation alone, \*\*\$([\d.]+)\*\* with the load balancer")
    defaults = bench["cost"]["defaults"]
    assert (float(alone), float(with_lb)) == (defaults["automation_usd"], defaults["with_load_balancer_usd"])
    (paged,) = claim(text, r"\$([\d.]+) alone with every alarm's metric sent all month")
    assert float(paged) == defaults["every_alarm_all_month"]["automation_usd"]


def test_hold_bound(bench):
    """The bound from the usage report that crosses a user's limit to the hold, as `make bench` measured it."""
    bound = bench["hold_bound"]
    for page in (section("Budget guardrails"), section("Performance (`make bench`)")):
        reports, polls, minutes = claim(page, r"\*\*(\d+) usage report and (\d+) agent polls?\*\*.*?\*\*([\d.]+) minutes\*\*")
        assert (int(reports), int(polls), float(minutes)) == (bound["usage_reports"], bound["polls"], bound["worst_minutes"])
        (before,) = claim(page, r"hourly sweep: (?:up to )?([\d.]+) minutes")
        assert float(before) == bound["before_minutes"]
    assert bound["sweeps"] == 0


# docs row label -> (stickiness, access path) of the bench's balance rows
BALANCE_ROWS = {
    "campus NAT, no stickiness": ("none", "nat"),
    "Client VPN (2 subnets), no stickiness": ("none", "client-vpn"),
    "routed (Site-to-Site VPN, Direct Connect), no stickiness": ("none", "routed"),
    "campus NAT, `source_ip` (before)": ("source_ip", "nat"),
    "Client VPN (2 subnets), `source_ip` (before)": ("source_ip", "client-vpn"),
    "routed, `source_ip` (before)": ("source_ip", "routed"),
}


def test_balance_table(bench):
    """How evenly users spread per access path, as `make bench` measured it (key `balance`)."""
    measured = {(r["setting"], r["path"]): r for r in bench["balance"]}
    rows = table(docs_text(), "balance")
    assert [r[0] for r in rows] == list(BALANCE_ROWS), "a row was added or renamed: map it in BALANCE_ROWS"
    for label, source_ips, median, worst, example in rows:
        r = measured[BALANCE_ROWS[label]]
        assert (int(source_ips), float(median), float(worst)) == (
            r["source_ips"], round(r["median_max_over_mean"], 2), round(r["worst_max_over_mean"], 2)), label
        assert [int(n) for n in example.split(",")] == r["example_sessions"], label
    text = section("Performance (`make bench`)")
    nodes, users, seeds = claim(text, r"\(key `balance`; (\d+) login nodes .*?, (\d+) users .*?median over (\d+) seeds")
    first = bench["balance"][0]
    assert (int(nodes), int(users)) == (first["login_nodes"], first["users"]) and int(seeds) == 20
    assert all(r["median_max_over_mean"] <= 1.25 for r in bench["balance"] if r["setting"] == "none")


def test_admission_figures(bench):
    """Load-aware admission as `make bench` measured it (key `admission`) and what a move costs."""
    record = bench["admission"]
    idle, leave, back = record["rows"]
    text = section("Load-aware admission")
    calls, out_transitions, back_transitions, landed, users, fewest = claim(
        text, r"makes (\d+) AWS calls and no state transition; a node leaving rotation is one sync of (\d+) state "
              r"transitions, its return one of (\d+) .*?while a node is out, (\d+) of (\d+) new connections land on it; "
              r"with three of four nodes hot, never fewer than (\d+) nodes")
    assert int(calls) == sum(idle["calls"].values()) and idle["state_transitions"] == 0
    assert (int(out_transitions), int(back_transitions)) == (leave["state_transitions"], back["state_transitions"])
    assert (int(landed), int(users), int(fewest)) == (
        record["new_connections_on_the_hot_node"], record["new_connections"], record["fewest_nodes_in_rotation"])
    (per_move,) = claim(text, r"A move costs one LoginNodeSync execution \(\$([\d.]+),")
    per_1000 = bench["cost"]["defaults"]["per_1000_events"]["admission_moves"]
    assert float(per_move) == round(per_1000 / 1000, 4)
    cost = section("Performance (`make bench`)")
    low, high, tasks_low, tasks_high, usd = claim(cost, r"every 1,000 moves \(a node leaving or rejoining rotation: the "
                                                        r"LoginNodeSync it starts, (\d+) to (\d+) transitions and (\d+) to "
                                                        r"(\d+) Lambda tasks\) cost \$([\d.]+)")
    moves = [leave, back]
    assert (int(low), int(high)) == (min(r["state_transitions"] for r in moves), max(r["state_transitions"] for r in moves))
    assert (int(tasks_low), int(tasks_high)) == (min(r["lambda_invocations"] for r in moves) - 1,
                                                 max(r["lambda_invocations"] for r in moves) - 1)
    assert float(usd) == per_1000


def test_sessions_at_scale(bench):
    """The scale table: each size's sessions, report and item sizes, read units, outcomes, memory and cost,
    as the scale section of `make bench` measured them."""
    measured = {(r["login_nodes"], r["users"]): r for r in bench["scale_sessions"]["rows"]}
    rows = table(docs_text(), "sessions at scale")
    assert len(rows) == len(measured), "a size was added or dropped: the table and the bench disagree"
    for label, sessions, busiest, report_kb, item_kb, before, now, writes, ended, targets, peaks, usd in rows:
        nodes, users, logged_in = claim(label, r"(\d+) login nodes, ([\d,]+) users \(([\d,]+) logged in\)")
        r = measured[(int(nodes), int(number(users)))]
        assert int(number(logged_in)) == r["logged_in"] and int(number(sessions)) == r["sessions"], label
        assert busiest == f"{r['busiest_node_sessions']:,} ({r['busiest_node_listed']:,} listed)", label
        assert (float(report_kb), float(item_kb)) == (round(r["max_report_bytes"] / 1024, 1),
                                                      round(r["max_item_bytes"] / 1024, 1)), label
        assert before == (f"{r['before_items_read']} / {r['before_bytes_read'] / 1024:.1f} / "
                          f"{r['before_read_units']}"), label
        assert now == f"{r['check_items_read']} / {r['check_bytes_read'] / 1024:.1f} / {r['check_read_units']}", label
        assert float(writes) == r["change_write_units"], label
        assert (ended, targets) == ("yes" if r["ended_right"] else "no", "yes" if r["targets_right"] else "no"), label
        quoted = [number(mb) for mb in claim(peaks, r"(\d+) / (\d+) / (\d+) of (\d+)")]
        functions = ("RecordNodeReportFunction", "CheckReportedSessionsFunction", "EnforceSessionLimitsFunction")
        assert all(near(q, r["peak_mb"][f]) for q, f in zip(quoted, functions)), label
        assert quoted[3] == r["memory_mb"]["EnforceSessionLimitsFunction"], label
        assert float(usd.strip("$")) == r["monthly_usd"], label
    text = section("Performance (`make bench`)")
    from hpops_twin.scale_sessions_bench import SIZES

    costs = [measured[size[:2]]["cost"] for size in SIZES]
    quoted = claim(text, r"every 1,000 session changes cost \$([\d.]+) at 4 login nodes, \$([\d.]+) at 12 and "
                         r"\$([\d.]+) at 50.*?each logged-in user \$([\d.]+) a month")
    assert [float(q) for q in quoted[:3]] == [c["per_1000_session_changes_usd"] for c in costs]
    assert float(quoted[3]) == costs[0]["per_active_user_usd"]
    # The goals, in a healthy month from the key's year 3, each with its upper bound (every alarm all month).
    mid, mid_paged = claim(text, r"at 12 login nodes and 2,000 users holds: \$([\d.]+) \(\$([\d.]+) with every alarm's metric")
    assert (float(mid), float(mid_paged)) == (costs[1]["automation_by_year_usd"]["3"],
                                              costs[1]["every_alarm_all_month_by_year_usd"]["3"])
    years = claim(text, r"holds in a healthy month: \$([\d.]+) in year 1, \$([\d.]+) in year 2 and \$([\d.]+) from year 3")
    assert [float(q) for q in years] == [costs[0]["automation_by_year_usd"][y] for y in ("1", "2", "3")]
    paged = claim(text, r"a month of pages\) \$([\d.]+), \$([\d.]+) and \$(\d+\.\d\d)")
    assert [float(q) for q in paged] == [costs[0]["every_alarm_all_month_by_year_usd"][y] for y in ("1", "2", "3")]
    (longest,) = claim(text, r"Rotated every 2,560 days a healthy month stays \$([\d.]+) through year 7")
    longest_rotation = costs[0]["automation_by_rotation_usd"]["2560"]  # no rotation before year 8
    assert float(longest) == longest_rotation["1"] == longest_rotation["3"]
    with_lb = claim(text, r"\$([\d.]+), \$([\d.]+) and \$([\d.]+) a month with the load balancer at the three")
    assert [float(q) for q in with_lb] == [c["with_load_balancer_usd"] for c in costs]

