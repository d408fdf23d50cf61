"""`hpops adopt` in the twin: what `aws ssm start-session --document-name AWS-StartNonInteractiveCommand`
does to a HyperPod node, for the commands adopt sends.

The session is started through the twin's Session Manager (ssm_sessions.py: StartSession, under the
operator's IAM like every other call adopt makes); the command's effect is on the simulated node: the
installer's (the real node agent installed and run once, NodeHosts.install_agent; its output the
installer's last line and the agent key's fingerprint as `ssh-keygen -lf` prints it), or the agent's
`enroll` (the real agent's enroll_now, its "hpops enroll:" line). The session then ends, as a
non-interactive session ends when its command exits.
What the twin does not model: the node's `aws s3 cp` of the bundle (the lifecycle prefix is not read)
and sudo; adopt.py marks both UNCONFIRMED on AWS.
"""

from __future__ import annotations

from typing import Any

import boto3

from hpops.adopt import DOCUMENT, ENROLL_COMMAND, ENROLL_MARK, FINGERPRINT_MARK
from hpops_twin.iam.enforce import acting_as


class TwinSessionRunner:
    def __init__(self, world: Any):
        self.world = world
        self.sessions: list[str] = []  # the session ids adopt started

    def __call__(self, target: str, command: str) -> tuple[int, str]:
        ssm = boto3.session.Session(region_name=self.world.region).client("ssm")
        session_id = ssm.start_session(Target=target, DocumentName=DOCUMENT,
                                       Parameters={"command": [command]})["SessionId"]
        self.sessions.append(session_id)
        instance_id = "i-" + target.rsplit("-i-", 1)[-1]
        try:
            if command == ENROLL_COMMAND:
                agent = self.world.hosts.agents.get(instance_id)
                if agent is None:
                    return 1, "hpops-node-agent is not installed"
                # The agent's own process: its calls are the node role's, as in its ticks.
                with self.world.dispatcher.environment_lock, acting_as("agent"):
                    enrolled, what = agent.enroll_now()
                return (0 if enrolled else 1), f"{ENROLL_MARK} {what}"
            if "hpops/install.sh" not in command:
                return 1, "not the installer"
            if not self.world.hosts.install_agent(instance_id):
                return 1, "hpops install: failed: the twin's agents run on Running login nodes only"
            key = self.world.hosts.agents[instance_id].proof.fingerprint()
            return 0, ("hpops install: node agent installed, first cycle done, hpops-node-agent enabled\n"
                       f"{FINGERPRINT_MARK} 256 {key} hpops-agent (ED25519)")
        finally:
            self.world.sessions.store.end_by_user(session_id)  # the command exited: no TerminateSession
