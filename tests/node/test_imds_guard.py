"""The optional IMDS lockdown (imds_guard.py): its rules, its fail-open safety, and the real thing.

The real test builds a network namespace in which 169.254.169.254 is a loopback address with a
stand-in IMDS listening on it, applies the rules with the agent's own `--imds-lockdown` step, and
connects as root, as `nobody`, and as `nobody` in the allowed group: only the last two differ.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from real_tools import require_root_and_programs

from hpops_node_agent import imds_guard
from hpops_node_agent.config import AgentConfig, ConfigError

REPO = Path(__file__).resolve().parents[2]
# The system Python: `nobody` may execute it (a virtualenv's interpreter may live under /root).
SYSTEM_PYTHON = "/usr/bin/python3"
AGENT_PATH = "{}:{}".format(REPO / "node", REPO / "layers" / "hpops_core")


class FakeIptables:
    """Records commands; ``fail`` names the first rule word that makes a command fail."""

    def __init__(self, fail: str | None = None, listed: str | None = None) -> None:
        self.commands: list[list[str]] = []
        self.fail, self.listed = fail, listed
        self.chain: list[str] = []
        self.jumps = 0

    def __call__(self, command):
        self.commands.append(list(command))
        args = list(command[2:]) if len(command) > 1 and command[1] == "-w" else list(command[1:])
        code, out = 0, ""
        if self.fail and self.fail in " ".join(args):
            code = 1
        elif args[:1] == ["-A"]:
            self.chain.append(" ".join(args))
        elif args[:1] == ["-S"]:
            out = self.listed if self.listed is not None else "-N HPOPS_IMDS\n" + "\n".join(self.chain) + "\n"
        elif args[:1] == ["-C"]:
            code = 0 if self.jumps else 1
        elif args[:1] == ["-I"]:
            self.jumps += 1
        elif args[:1] == ["-D"]:
            code = 0 if self.jumps else 1
            self.jumps = max(0, self.jumps - 1)
        elif args[:1] == ["-F"]:
            self.chain = []
        return subprocess.CompletedProcess(command, code, out, "refused" if code else "")


def no_ip6tables(fake):
    def run(command):
        if command[0] == "ip6tables":
            raise FileNotFoundError("ip6tables")
        return fake(command)
    return run


def test_root_is_accepted_before_anything_is_rejected_and_allowed_groups_come_next():
    rules = imds_guard.chain_rules((4, 27))
    assert rules[0] == ["-A", "HPOPS_IMDS", "-m", "owner", "--uid-owner", "0", "-j", "ACCEPT"]
    assert [r[-1] for r in rules[1:3]] == ["ACCEPT", "ACCEPT"] and [r[5] for r in rules[1:3]] == ["4", "27"]
    assert all("REJECT" in r for r in rules[3:]) and len(rules) == 5


def test_the_jump_is_added_only_after_the_chain_read_back_safe_and_twice_is_the_same():
    fake = FakeIptables()
    result = imds_guard.apply_lockdown((), run=no_ip6tables(fake))
    assert result.applied and fake.jumps == 1
    inserted = [c for c in fake.commands if "-I" in c]
    assert inserted == [["iptables", "-w", "-I", "OUTPUT", "1", "-d", "169.254.169.254/32", "-j", "HPOPS_IMDS"]]
    assert fake.commands.index(inserted[0]) > max(i for i, c in enumerate(fake.commands) if "-A" in c)
    assert imds_guard.apply_lockdown((), run=no_ip6tables(fake)).applied and fake.jumps == 1


@pytest.mark.parametrize("fake", [FakeIptables(fail="REJECT"), FakeIptables(fail="--uid-owner"),
                                  FakeIptables(listed="-N HPOPS_IMDS\n-A HPOPS_IMDS -j REJECT\n"),
                                  FakeIptables(fail="-I OUTPUT")],
                         ids=["reject-refused", "root-accept-refused", "reads-back-without-root", "jump-refused"])
def test_any_failure_leaves_imds_open_never_half_locked(fake):
    result = imds_guard.apply_lockdown((), run=no_ip6tables(fake))
    assert not result.applied and fake.jumps == 0
    assert ["iptables", "-w", "-X", "HPOPS_IMDS"] in fake.commands  # the chain is taken out again
    assert "left open" in result.reason or "refused" in result.reason


def test_an_unknown_or_invalid_allowed_group_applies_nothing():
    fake = FakeIptables()
    for groups in (("no-such-group-hpops",), ("bad group",)):
        result = imds_guard.apply_lockdown(groups, run=fake)
        assert not result.applied and "IMDS left open" in result.reason
    assert fake.commands == []


def test_without_iptables_nothing_happens_and_it_says_so():
    def missing(command):
        raise FileNotFoundError(command[0])
    result = imds_guard.apply_lockdown((), run=missing)
    assert not result.applied and result.reason == "iptables not found; IMDS left open"


def test_the_probe_reports_only_what_its_child_proved():
    def answers(user_code, root_code):
        return lambda address, port, timeout, user: user_code if user is not None else root_code
    assert imds_guard.probe(connect=answers(0, 0))[0] == "reachable"
    assert imds_guard.probe(connect=answers(3, 0))[0] == "blocked"
    assert imds_guard.probe(connect=answers(4, 4))[0] == "no-imds"
    assert imds_guard.probe(connect=answers(1, 0))[0] == "unknown"  # the child never ran: proves nothing


def test_config_accepts_the_lockdown_keys_and_refuses_bad_values():
    base = {"cluster": "c1", "region": "us-east-1", "reportBus": "b"}
    config = AgentConfig.from_dict(dict(base, imdsLockdown="on", imdsAllowedGroups="adm, hpcadmins"))
    assert config.imds_lockdown == "on" and config.imds_groups == ("adm", "hpcadmins")
    for bad in ({"imdsLockdown": "yes"}, {"imdsAllowedGroups": "a;b"}, {"imdsProbe": "10.0.0.1"}):
        with pytest.raises(ConfigError):
            AgentConfig.from_dict(dict(base, **bad))


# ---------------------------------------------------------------------------- for real, in a netns


@pytest.fixture
def namespace(tmp_path):
    require_root_and_programs(("/usr/sbin/iptables", "/usr/sbin/ip", SYSTEM_PYTHON, "/usr/bin/setpriv"),
                              "the IMDS lockdown's real test", "apt-get install iptables iproute2 util-linux")
    name = "hpops-imds-" + uuid.uuid4().hex[:8]
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:  # no CAP_NET_ADMIN in this container: a property of the machine, not an install
        pytest.skip(f"cannot create a network namespace: {made.stderr.strip()}")
    server = None
    try:
        for command in (["ip", "link", "set", "lo", "up"], ["ip", "addr", "add", "169.254.169.254/32", "dev", "lo"]):
            subprocess.run(["ip", "netns", "exec", name, *command], check=True)
        server = subprocess.Popen(["ip", "netns", "exec", name, SYSTEM_PYTHON, "-m", "http.server", "--bind",
                                   "169.254.169.254", "80"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  cwd=tmp_path)
        yield name
    finally:
        if server:
            server.terminate()
            server.wait(10)
        subprocess.run(["ip", "netns", "del", name], check=False)


def in_ns(name, *command, user=None):
    prefix = ["setpriv", "--reuid", str(user[0]), "--regid", str(user[1]), "--clear-groups"] if user else []
    return subprocess.run(["ip", "netns", "exec", name, *prefix, *command], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, PYTHONPATH=AGENT_PATH), cwd="/")


def reaches(name, user=None) -> bool:
    code = "import socket; socket.create_connection(('169.254.169.254', 80), 3).close()"
    for _ in range(50):  # the stand-in may still be starting (root must reach it before anything counts)
        done = in_ns(name, SYSTEM_PYTHON, "-c", code, user=user)
        if done.returncode == 0 or user is not None:
            return done.returncode == 0
        time.sleep(0.1)
    return False


def lockdown(name, tmp_path, state, groups=""):
    config = tmp_path / "agent.json"
    config.write_text(json.dumps({"cluster": "c1", "region": "us-east-1", "reportBus": "b",
                                  "imdsLockdown": state, "imdsAllowedGroups": groups}))
    done = in_ns(name, SYSTEM_PYTHON, "-m", "hpops_node_agent", "--config", str(config), "--imds-lockdown")
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.netns
def test_only_root_and_the_allowed_group_reach_imds_and_off_opens_it_again(namespace, tmp_path):
    adm = 4  # Debian's and Ubuntu's adm group
    nobody, nobody_in_adm = (65534, 65534), (65534, adm)
    assert reaches(namespace) and reaches(namespace, nobody)

    said = lockdown(namespace, tmp_path, "on", groups="adm")
    assert said.startswith("IMDS lockdown applied")
    assert reaches(namespace), "root must keep IMDS"
    assert not reaches(namespace, nobody), "a user must not reach IMDS"
    assert reaches(namespace, nobody_in_adm), "the allowed group keeps IMDS"
    rules = in_ns(namespace, "iptables", "-S").stdout
    lockdown(namespace, tmp_path, "on", groups="adm")
    assert in_ns(namespace, "iptables", "-S").stdout == rules  # applying twice changes nothing

    probe = in_ns(namespace, SYSTEM_PYTHON, "-c", "from hpops_node_agent import imds_guard; print(imds_guard.probe()[0])")
    assert probe.stdout.strip() == "blocked", probe.stderr

    assert lockdown(namespace, tmp_path, "off").startswith("IMDS lockdown not in place")
    assert reaches(namespace, nobody)
    assert "HPOPS_IMDS" not in in_ns(namespace, "iptables", "-S").stdout
    probe = in_ns(namespace, SYSTEM_PYTHON, "-c", "from hpops_node_agent import imds_guard; print(imds_guard.probe()[0])")
    assert probe.stdout.strip() == "reachable"


def test_the_agent_probes_once_per_heartbeat_and_the_stack_accepts_only_known_answers(tmp_path):
    from hpops_core.node_channel import reports
    from hpops_node_agent.agent import NodeAgent

    asked = []
    config = AgentConfig.from_dict({"cluster": "c1", "region": "us-east-1", "reportBus": "b", "root": str(tmp_path),
                                    "imdsProbe": "169.254.169.254", "imdsLockdown": "on", "heartbeatSeconds": 600})
    agent = NodeAgent(config, session=None, imds_probe=lambda address: asked.append(address) or ("blocked", "ok"))
    first = agent.imds_section(1000.0)
    assert agent.imds_section(1500.0) == first and asked == ["169.254.169.254"]
    assert agent.imds_section(1600.0) == first and len(asked) == 2  # a heartbeat later: probed again
    assert first == {"nonRoot": "blocked", "reason": "ok", "lockdown": "on"}
    event = {"source": "hpops.node", "detail-type": "HyperPod Login Node Report", "detail": {
        "format": "hpops.node.report.v1", "cluster": "c1", "instanceId": "i-0123456789abcdef0", "ip": "10.1.0.5",
        "role": "login", "agentVersion": "1.0.0", "reportedAt": "2026-11-26T12:00:00+00:00", "trigger": "heartbeat",
        "imds": first}}
    assert reports.parse_report_event(event).imds.nonRoot == "blocked"
    with pytest.raises(reports.MalformedNodeReport):
        reports.parse_report_event(dict(event, detail=dict(event["detail"], imds=dict(first, nonRoot="wide open"))))
    assert NodeAgent(AgentConfig.from_dict({"cluster": "c1", "region": "us-east-1", "reportBus": "b",
                                            "root": str(tmp_path)}), session=None).imds_section(0.0) is None
