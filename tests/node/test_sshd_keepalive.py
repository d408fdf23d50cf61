"""sshd keepalives: the interval rule, where the lines go (first value wins in sshd), refusals.

`sshd -t` and the reload are stand-ins here (`true`/`false`); tests/ssh/test_keepalive_real_sshd.py
runs the real sshd behind haproxy."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpops_core.node_channel import ssh_keepalive
from hpops_core.node_channel.ssh_keepalive import BadKeepalive, client_alive_interval
from hpops_node_agent import sshd_keepalive

DEBIAN = "Include /etc/ssh/sshd_config.d/*.conf\n\nPort 22\nUsePAM yes\n"


def node(tmp_path: Path, config: str) -> Path:
    (tmp_path / "etc/ssh/sshd_config.d").mkdir(parents=True)
    (tmp_path / "etc/ssh/sshd_config").write_text(config)
    return tmp_path


def effective(root: Path) -> dict[str, str]:
    """What sshd would use: the first value of each keyword, following Includes in order."""
    seen: dict[str, str] = {}

    def read(path: Path) -> None:
        for line in path.read_text().splitlines():
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            if words[0].lower() == "include":
                directory, glob = words[1].rsplit("/", 1)
                for drop_in in sorted((root / directory.lstrip("/")).glob(glob)):
                    read(drop_in)
            elif words[0].lower() == "match":
                return
            else:
                seen.setdefault(words[0].lower(), words[1])

    read(root / "etc/ssh/sshd_config")
    return seen


@pytest.mark.parametrize("timeout, interval", [(60, 30), (350, 120), (6000, 120), (3, 1)])
def test_interval_is_under_the_idle_timeout(timeout, interval):
    assert client_alive_interval(timeout) == interval
    assert client_alive_interval(timeout) * 2 <= timeout


@pytest.mark.parametrize("bad", [0, 1, 6001, "350", True, None, 350.0])
def test_a_timeout_out_of_range_is_refused(bad):
    with pytest.raises(BadKeepalive):
        client_alive_interval(bad)


def test_debian_layout_gets_a_drop_in_that_wins_and_a_second_run_changes_nothing(tmp_path):
    root = node(tmp_path, DEBIAN)

    first = sshd_keepalive.apply(str(root), 350, "true", "true")
    second = sshd_keepalive.apply(str(root), 350, "false", "false")  # would fail if it ran sshd -t again

    assert (first["result"], second["result"]) == ("changed", "unchanged")
    assert (root / "etc/ssh/sshd_config").read_text() == DEBIAN
    assert effective(root)["clientaliveinterval"] == "120"
    assert effective(root)["clientalivecountmax"] == "3"


@pytest.mark.parametrize("config", [
    "Port 22\nUsePAM yes\n",  # no Include
    "ClientAliveInterval 0\nInclude /etc/ssh/sshd_config.d/*.conf\n",  # its own value comes first
    "Match User admin\n  Include /etc/ssh/sshd_config.d/*.conf\n",  # an Include only for some users
])
def test_without_an_include_that_comes_first_the_lines_go_to_the_top_of_sshd_config(tmp_path, config):
    root = node(tmp_path, config)

    outcome = sshd_keepalive.apply(str(root), 60, "true", "true")

    assert outcome["result"] == "changed"
    assert effective(root)["clientaliveinterval"] == "30"
    assert (root / "etc/ssh/sshd_config").read_text().endswith(config)  # the site's lines are kept


def test_a_new_timeout_replaces_the_block_instead_of_adding_one(tmp_path):
    root = node(tmp_path, "Port 22\n")
    sshd_keepalive.apply(str(root), 60, "true", "true")
    sshd_keepalive.apply(str(root), 350, "true", "true")

    text = (root / "etc/ssh/sshd_config").read_text()
    assert text.count("ClientAliveInterval") == 1 and effective(root)["clientaliveinterval"] == "120"


@pytest.mark.parametrize("sshd_cmd, reload_cmd, what", [("false", "true", "sshd -t"), ("true", "false", "reload")])
def test_a_refused_config_or_failed_reload_rolls_back(tmp_path, sshd_cmd, reload_cmd, what):
    root = node(tmp_path, DEBIAN)

    outcome = sshd_keepalive.apply(str(root), 350, sshd_cmd, reload_cmd)

    assert outcome["result"] == "failed" and "rolled back" in outcome["reason"] and what in outcome["reason"]
    assert not (root / "etc/ssh/sshd_config.d" / sshd_keepalive.DROP_IN_NAME).exists()
    assert (root / "etc/ssh/sshd_config").read_text() == DEBIAN


@pytest.mark.parametrize("text", ["nope", "{}", '{"format": "hpops.node.ssh-keepalive.v1", "listenerIdleTimeoutSeconds": 9999}'])
def test_a_bad_document_is_refused(text):
    with pytest.raises(BadKeepalive):
        ssh_keepalive.parse_document(text)
