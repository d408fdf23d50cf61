"""The login node sync's configuration: template.yaml sets it in Globals; read at call time."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from hpops_core.common import validation
from hpops_core.common.config import env_choice, env_int, env_str
from hpops_core.login_sync.admission import AdmissionPolicy
from hpops_core.node_channel.leave_notices import MAX_GRACE_MINUTES


@dataclass(frozen=True)
class SyncConfig:
    """Everything the LoginNodeSync functions need; template.yaml sets it in Globals."""

    cluster_name: str
    cluster_arn: str
    login_group: str
    target_group_arn: str
    # Set when the stack created the target group (then its VPC is VpcId); empty for an existing one.
    target_group_vpc_id: str
    ssh_port: int
    state_table: str
    lease_seconds: int
    # "keys" | "certificate": new login nodes take traffic only once their host identity verifies
    host_identity_mode: str
    # How the per-node wait for an agent's report is paced and bounded (read by the ASL map).
    node_report_poll_seconds: int = 10
    node_report_max_polls: int = 18
    # Login-node slots (LoginNodeSlots): slot N's target group is the Nth; empty when off.
    slot_target_group_arns: tuple[str, ...] = ()
    load_balancer_dns_name: str = ""
    # LoadAwareAdmission: only "on" keeps the nodes its record names out of the target group.
    admission_mode: str = "off"
    # LeaveNoticeMinutes: the grace users of a leaving login node are told; None when notices are off.
    leave_notice_minutes: int | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SyncConfig:
        env = os.environ if env is None else env
        return cls(
            cluster_name=env_str(env, "CLUSTER_NAME", validation.CLUSTER_NAME_RE),
            cluster_arn=env_str(env, "CLUSTER_ARN", validation.CLUSTER_ARN_RE),
            login_group=env_str(env, "LOGIN_GROUP_NAME", validation.INSTANCE_GROUP_RE),
            target_group_arn=env_str(env, "TARGET_GROUP_ARN"),
            target_group_vpc_id=env.get("TARGET_GROUP_VPC_ID", "").strip(),
            ssh_port=env_int(env, "SSH_PORT", 1, 65535),
            state_table=env_str(env, "STATE_TABLE_NAME"),
            lease_seconds=env_int(env, "LEASE_SECONDS", 60, 86400),
            host_identity_mode=env_choice(env, "HOST_IDENTITY_MODE", ("keys", "certificate", "off")),
            node_report_poll_seconds=env_int(env, "NODE_REPORT_POLL_SECONDS", 0, 20),
            node_report_max_polls=env_int(env, "NODE_REPORT_MAX_POLLS", 1, 30),
            slot_target_group_arns=tuple(a.strip() for a in env.get("SLOT_TARGET_GROUP_ARNS", "").split(",") if a.strip()),
            load_balancer_dns_name=env.get("LOAD_BALANCER_DNS_NAME", "").strip(),
            admission_mode=env_choice(env, "LOAD_AWARE_ADMISSION", ADMISSION_MODES) if env.get("LOAD_AWARE_ADMISSION")
            else "off",
            leave_notice_minutes=_leave_notice_minutes(env),
        )


def _leave_notice_minutes(env: Mapping[str, str]) -> int | None:
    value = env.get("LEAVE_NOTICE_MINUTES", "off").strip()
    return None if value == "off" else env_int(env, "LEAVE_NOTICE_MINUTES", 0, MAX_GRACE_MINUTES)


ADMISSION_MODES = ("off", "dry-run", "on")
# The admission function runs every 5 minutes and writes its record each time; a record older than
# this means it stopped (failing, or switched off), and the sync then keeps nobody out.
ADMISSION_RECORD_MAX_AGE_SECONDS = 20 * 60


@dataclass(frozen=True)
class AdmissionConfig:
    """LoginAdmissionFunction: how hot is too hot, and where to start the sync that applies a move."""

    cluster_name: str
    target_group_arn: str
    ssh_port: int
    state_table: str
    sync_state_machine_arn: str
    mode: str  # "dry-run" | "on" (the function does not exist when LoadAwareAdmission is off)
    policy: AdmissionPolicy

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AdmissionConfig:
        env = os.environ if env is None else env
        sustain = env_int(env, "ADMISSION_SUSTAIN_MINUTES", 5, 240) * 60
        return cls(
            cluster_name=env_str(env, "CLUSTER_NAME", validation.CLUSTER_NAME_RE),
            target_group_arn=env_str(env, "TARGET_GROUP_ARN"),
            ssh_port=env_int(env, "SSH_PORT", 1, 65535),
            state_table=env_str(env, "STATE_TABLE_NAME"),
            sync_state_machine_arn=env_str(env, "SYNC_STATE_MACHINE_ARN", validation.STATE_MACHINE_ARN_RE),
            mode=env_choice(env, "LOAD_AWARE_ADMISSION", ("dry-run", "on")),
            policy=AdmissionPolicy(
                pressure_margin=float(env_int(env, "ADMISSION_PRESSURE_MARGIN", 5, 90)),
                session_margin=env_int(env, "ADMISSION_SESSION_MARGIN_PERCENT", 10, 1000) / 100,
                sustain_seconds=sustain,
                # Out at least as long as it took to go out, and 15 minutes: the way back is slower than the way out.
                min_out_seconds=max(sustain, 900)),
        )


@dataclass(frozen=True)
class EndedSyncConfig:
    """ReleaseLeaseOfEndedSync: whose leases it may release, and where they are kept."""

    cluster_name: str
    state_table: str
    # Only this stack's sync executions hold its leases; the rule filters on it too.
    sync_state_machine_arn: str

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> EndedSyncConfig:
        env = os.environ if env is None else env
        return cls(
            cluster_name=env_str(env, "CLUSTER_NAME", validation.CLUSTER_NAME_RE),
            state_table=env_str(env, "STATE_TABLE_NAME"),
            sync_state_machine_arn=env_str(env, "SYNC_STATE_MACHINE_ARN", validation.STATE_MACHINE_ARN_RE),
        )
