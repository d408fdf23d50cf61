#!/bin/bash
# Install the hpops node agent on a HyperPod node. Runs as root from the lifecycle on_create.sh,
# before the script's final exit (`hpops lifecycle --patch on_create.sh` puts it there):
#
#     bash "$(dirname "$0")/hpops/install.sh"
#
# (this folder, hpops/, sits next to on_create.sh in the lifecycle S3 prefix). On every node it
# copies the agent to /opt/hpops-node-agent and writes /etc/hpops/node-agent.json; it then asks the
# agent for the node's role, which works however AWS provisioned the node (the lifecycle folder's
# provisioning_parameters.json, HyperPod's /opt/ml/config copy for API-driven Slurm configuration,
# or DescribeCluster's SlurmConfig). Compute nodes stop there. Login nodes run one agent cycle
# (--once, so the node joins with the cluster's host keys already in place) and get the
# hpops-node-agent systemd service, which keeps polling. The controller node gets the service too
# (it collects per-user Slurm usage from accounting) unless agent.json sets usageSeconds to 0; no
# first cycle, since Slurm may not be up yet while the lifecycle scripts run.
#
# It never fails the node's provisioning (on_create.sh runs under set -e): whatever goes wrong is
# one line on stderr and exit 0, and the stack keeps a login node without an agent out of the load
# balancer and names it in an alert. HPOPS_REQUIRED=1 makes it fail provisioning instead.
#
# --enroll-first (the line `hpops lifecycle --patch` puts at the TOP of on_create.sh): copy the agent,
# write its config, apply the IMDS lockdown when it is on, and enroll the agent's key (with the instance
# identity document where IMDS serves it), then stop. It runs before the lifecycle scripts set up users'
# directory access, so no user can be on a new node before its agent enrolls, and with the lockdown on
# no user ever reaches IMDS (the role's credentials, the document). The line at the end of on_create.sh
# then does the rest as before.
#
# Options (for tests): --root DIR (or HPOPS_ROOT) installs under DIR; --no-systemd (or
# HPOPS_SYSTEMD=0) skips systemctl. HPOPS_PYTHON picks the interpreter (default /usr/bin/python3,
# else python3 on PATH). SAGEMAKER_RESOURCE_CONFIG_PATH, as the lifecycle scripts honour it, is
# recorded as the agent's resourceConfig.

if [ -z "${HPOPS_INSTALL_STEP:-}" ]; then
    # The work runs in a child shell with set -e; its failure is reported here, not passed on.
    HPOPS_INSTALL_STEP=1 bash "$0" "$@"
    status=$?
    if [ "$status" -ne 0 ]; then
        if [ "${HPOPS_REQUIRED:-0}" = 1 ]; then
            echo "hpops install: failed (exit $status); HPOPS_REQUIRED=1, so this node's provisioning fails"
            exit "$status"
        fi
        echo "hpops install: not installed (exit $status); the node is provisioned without the agent" \
             "(set HPOPS_REQUIRED=1 to fail provisioning instead)"
    fi
    exit 0
fi
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="${HPOPS_ROOT:-/}"
use_systemd="${HPOPS_SYSTEMD:-1}"
enroll_first=0
while [ $# -gt 0 ]; do
    case "$1" in
        --enroll-first) enroll_first=1; shift ;;
        --root) root="$2"; shift 2 ;;
        --root=*) root="${1#--root=}"; shift ;;
        --no-systemd) use_systemd=0; shift ;;
        *) echo "hpops install: unknown option $1" >&2; exit 2 ;;
    esac
done
root="$(cd "$root" && pwd)"
prefix="${root%/}"

say() { echo "hpops install: $*"; }

python="${HPOPS_PYTHON:-}"
if [ -z "$python" ]; then
    if [ -x /usr/bin/python3 ]; then python=/usr/bin/python3; else python="$(command -v python3 || true)"; fi
fi
# What the bundled botocore needs; the bundle builder writes it from the agent's MIN_PYTHON.
min_python="@MIN_PYTHON@"
if [ -z "$python" ] || ! "$python" -c "import sys; sys.exit(0 if sys.version_info >= tuple(int(p) for p in '$min_python'.split('.')) else 1)" 2>/dev/null; then
    echo "hpops install: the node agent needs python3 >= $min_python (found: ${python:-none}$([ -n "$python" ] && "$python" -c 'import sys; print(" " + sys.version.split()[0])' 2>/dev/null)); use the HyperPod Slurm AMI (Python 3.10) or install python3 >= $min_python and re-run" >&2
    exit 78
fi

install_dir="$prefix/opt/hpops-node-agent"
config_dir="$prefix/etc/hpops"
config="$config_dir/node-agent.json"
provisioning_src="$here/../provisioning_parameters.json"

# Replace the code as a whole so a removed module never lingers; the agent's state lives elsewhere.
mkdir -p "$install_dir"
rm -rf "$install_dir/hpops_node_agent" "$install_dir/hpops_core" "$install_dir/lib"
cp -R "$here/hpops_node_agent" "$here/hpops_core" "$install_dir/"
if [ -d "$here/lib" ]; then cp -R "$here/lib" "$install_dir/lib"; else mkdir -p "$install_dir/lib"; fi
find "$install_dir" -name '__pycache__' -prune -exec rm -rf {} +
# The lifecycle folder is a temporary download; keep the one file the agent reads later.
if [ -f "$provisioning_src" ]; then
    install -m 0644 "$provisioning_src" "$install_dir/provisioning_parameters.json"
else
    say "no provisioning_parameters.json in the lifecycle folder: the role comes from /opt/ml/config or DescribeCluster"
fi

mkdir -p "$config_dir"
HPOPS_INSTALL_ROOT="$root" HPOPS_INSTALL_DIR="$install_dir" "$python" - "$here/agent.json" "$config.tmp" <<'PY'
import json, os, sys
with open(sys.argv[1]) as handle:
    config = json.load(handle)
root = os.environ["HPOPS_INSTALL_ROOT"]
config.setdefault("provisioningParameters", os.path.join(os.environ["HPOPS_INSTALL_DIR"], "provisioning_parameters.json"))
if os.environ.get("SAGEMAKER_RESOURCE_CONFIG_PATH"):
    config.setdefault("resourceConfig", os.environ["SAGEMAKER_RESOURCE_CONFIG_PATH"])
if root != "/":
    config.setdefault("root", root)
with open(sys.argv[2], "w") as handle:
    json.dump(config, handle, indent=2, sort_keys=True)
    handle.write("\n")
PY
chmod 0644 "$config.tmp"
mv "$config.tmp" "$config"

agent() {
    PYTHONPATH="$install_dir/lib:$install_dir" PYTHONDONTWRITEBYTECODE=1 "$python" -m hpops_node_agent --config "$config" "$@"
}

# Optional IMDS lockdown (agent.json imdsLockdown "on"), on every node: a user on a compute node
# holds the same role. The step never fails the install (a failure leaves IMDS open and says so);
# a boot unit re-applies the rules before the network comes up, as iptables rules do not survive a
# reboot. "off" removes rules and unit a previous install left (and touches nothing otherwise).
unit_dir="$prefix/etc/systemd/system"
lockdown="$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1])).get("imdsLockdown", "off"))' "$config")"
if [ "$lockdown" = on ] || [ -f "$unit_dir/hpops-imds-lockdown.service" ]; then
    agent --imds-lockdown || say "warning: IMDS lockdown step failed (exit $?); IMDS left as it was"
fi
if [ "$lockdown" = on ]; then
    mkdir -p "$unit_dir"
    sed "s|@PYTHON@|$python|g" "$here/hpops-imds-lockdown.service" > "$unit_dir/hpops-imds-lockdown.service.tmp"
    chmod 0644 "$unit_dir/hpops-imds-lockdown.service.tmp"
    mv "$unit_dir/hpops-imds-lockdown.service.tmp" "$unit_dir/hpops-imds-lockdown.service"
    if [ "$use_systemd" = 1 ]; then
        systemctl daemon-reload && systemctl enable hpops-imds-lockdown.service \
            || say "warning: could not enable hpops-imds-lockdown.service; the rules are lost at the next reboot"
    fi
elif [ -f "$unit_dir/hpops-imds-lockdown.service" ]; then
    if [ "$use_systemd" = 1 ]; then systemctl disable hpops-imds-lockdown.service || true; fi
    rm -f "$unit_dir/hpops-imds-lockdown.service"
fi

if ! role="$(agent --print-role)"; then
    say "cannot tell this node's role (the agent's line on stderr says why)"
    exit 78
fi
say "node role: $role"
if [ "$role" = "controller" ] && ! "$python" -c 'import json, sys; sys.exit(0 if json.load(open(sys.argv[1])).get("usageSeconds", 1) else 1)' "$config"; then
    say "controller node: Slurm usage collection is off (usageSeconds 0); nothing more to install"
    exit 0
fi
if [ "$role" != "login" ] && [ "$role" != "controller" ]; then
    say "$role node: nothing more to install"
    exit 0
fi

# The unit names both directories in ReadWritePaths, which systemd needs to exist on every role.
mkdir -p -m 0700 "$prefix/var/lib/hpops-node-agent" "$prefix/var/backups/hpops-host-keys"
if [ "$enroll_first" = 1 ]; then
    # First thing on a new node: the key, enrolled now. A refusal never fails provisioning; the agent
    # asks again once it runs (the install line at the end of on_create.sh).
    if said="$(agent enroll)"; then
        say "${said#hpops enroll: }"
    else
        say "warning: enrollment not done yet: ${said#hpops enroll: }"
    fi
    exit 0
fi
# The login message's directory (present on Ubuntu): the unit may write there only where it exists.
[ "$role" != "login" ] || mkdir -p -m 0755 "$prefix/etc/profile.d"
# The agent's own key (root-only): the stack trusts only what it signs. A failure here must not fail
# provisioning: the agent makes the key at start if it is missing.
if fingerprint="$(agent identity)"; then
    say "agent key: $fingerprint"
else
    say "warning: could not make the agent key now (the agent's line on stderr says why); the service retries"
fi
if [ "$role" = "login" ]; then
    # A failed first cycle must not fail the node's provisioning: the service retries and reports.
    if agent --once; then
        say "first cycle done"
    else
        say "warning: first cycle did not converge (exit $?); the service will keep trying"
    fi
fi

mkdir -p "$unit_dir"
sed "s|@PYTHON@|$python|g" "$here/hpops-node-agent.service" > "$unit_dir/hpops-node-agent.service.tmp"
chmod 0644 "$unit_dir/hpops-node-agent.service.tmp"
mv "$unit_dir/hpops-node-agent.service.tmp" "$unit_dir/hpops-node-agent.service"
if [ "$use_systemd" = 1 ]; then
    systemctl daemon-reload
    systemctl enable --now hpops-node-agent.service
    systemctl restart hpops-node-agent.service  # a re-run (UpdateClusterSoftware) loads the new code
    say "hpops-node-agent.service enabled and running"
else
    say "skipped systemctl (--no-systemd)"
fi
