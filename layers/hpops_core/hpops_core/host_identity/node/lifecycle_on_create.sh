#!/bin/bash
# HyperPod lifecycle (on-create) snippet: install the canonical SSH host identity at node creation,
# for clusters where SSM Run Command cannot reach the nodes. The same script the stack's SSM
# document runs; copy install_host_keys.py next to this file in your lifecycle S3 prefix and call
# this from on_create.sh (after sshd is running), e.g.:
#   bash ./lifecycle_on_create.sh arn:aws:secretsmanager:REGION:ACCOUNT:secret:NAME REGION
# The node's execution role needs secretsmanager:GetSecretValue on the secret (the stack grants it
# when ClusterExecutionRoleName is set). The verifier still checks the node before it takes traffic.
set -euo pipefail
secret_id="$1"
region="$2"
here="$(cd "$(dirname "$0")" && pwd)"
python3 "$here/install_host_keys.py" --secret-id "$secret_id" --region "$region"
