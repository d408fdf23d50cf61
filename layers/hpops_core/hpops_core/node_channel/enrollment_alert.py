"""The platform team hears of every enrollment conflict: someone presented a second key for a node.

A conflict is the one sign that a user holding the node role tried to act as a node (or raced a new
node's agent), so it goes to the AlertTopic, not only to a log line or an unalarmed count. At most
once an hour per instance (common/notices.py's record): whoever keeps presenting new keys
cannot flood the team's inbox, and the hourly reminder says the node is still contested.
"""

from __future__ import annotations

from hpops_core.common.clients import client, transient_errors_named
from hpops_core.common import notices


def conflict_message(cluster: str, instance_id: str, outcome: str, fingerprint: str, enrolled: str | None) -> tuple[str, str]:
    """(subject, message) for an enrollment conflict; fingerprints are public (SHA256 of public keys)."""
    subject = f"hpops {cluster}: second enrollment key for {instance_id}"[:100]
    if outcome == "contest":
        effect = ("two keys raced for this new node's enrollment and neither came with a verified instance identity "
                  "document, so the stack cannot tell which is its agent: the node is contested, kept out of the "
                  "load balancer unless it already serves, and its reports and secrets stop")
    elif outcome == "displace":
        effect = ("a key without an instance identity document had claimed this new node; the presented key came with "
                  "the node's verified document and replaced it (nothing for you to approve); what the replaced key "
                  "left was discarded")
    else:
        effect = "the node's enrolled key stands; the new key was refused"
    message = (f"A second agent key was presented for {instance_id} on cluster {cluster}: {effect}.\n"
               f"Presented: {fingerprint}\nEnrolled: {enrolled or '(none)'}\n"
               "Any user of a node holding the execution role can make this request: find who, and if the node's own "
               "agent is the one refused, read its key on the node as root (hpops-node-agent identity) and run "
               f"hpops node approve-enrollment --node {instance_id} --fingerprint <its SHA256>.")
    return subject, message


def alert_conflict(topic_arn: str, table: str, cluster: str, instance_id: str, outcome: str, fingerprint: str,
                   enrolled: str | None, now_epoch: int) -> bool:
    """Publish the conflict to the AlertTopic unless this instance's was sent within the hour; True if sent.
    Without a topic (a harness running the function outside the stack) the log line is all there is."""
    if not topic_arn:
        return False
    key = notices.notice_key(cluster, "enrollment-conflict", instance_id)
    if notices.sent_recently(table, key, now_epoch):
        return False
    subject, message = conflict_message(cluster, instance_id, outcome, fingerprint, enrolled)
    with transient_errors_named("sns:Publish"):
        client("sns").publish(TopicArn=topic_arn, Subject=subject, Message=message)
    notices.record_sent(table, key, now_epoch)
    return True
