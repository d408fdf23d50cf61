"""The demo's certificate-mode chapter: a second twin deployed with
HostIdentityMode=certificate. Every login node keeps its own host keys and gets host certificates
from the stack's CA; users trust one @cert-authority line. Steps continue the main demo's table.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

from hpops_core.host_identity.keys import certify_host_keys
from hpops_twin.world import TwinWorld

if TYPE_CHECKING:
    from hpops_twin.demo import Demo

PARAMETERS = {"HostIdentityMode": "certificate", "HostCertificatePrincipals": "login.hpc.example.edu"}


def run_certificate_chapter(main: Demo) -> None:
    from hpops_twin.demo import Demo

    if main.world.resolver.parameters["HostIdentityMode"] == "off":
        main.say("certificate mode: skipped (no ssh-keygen on this machine)")
        return
    main.say("certificate mode: a second stack with HostIdentityMode=certificate (each node keeps its own keys)")
    with TwinWorld(parameters=PARAMETERS, progress=lambda text: main.say(f"        {text}")) as world:
        demo = Demo(world, main.out)
        demo.steps, demo.started = main.steps, main.started  # one table, one clock
        sim, cluster, login = world.sim, world.cluster_name, world.login_group
        trust_line = (f"@cert-authority {world.output('LoadBalancerDnsName')},login.hpc.example.edu "
                      f"{world.host_ca.public_line[:40]}...")
        demo.say(f"        users add one line to known_hosts: {trust_line}")
        own = {n.instance_id: world.presented_fingerprints(n.instance_id) for n in sim.nodes(cluster, login)}

        def certified(nodes) -> bool:
            return all(world.certificate_verdict(n.instance_id).ok for n in nodes)

        demo.step("certificate mode: initial sync (cluster InService event)",
                  lambda: world.publish([sim.state_change_event(cluster)]),
                  "3 nodes certified by the CA, own host keys kept, registered",
                  lambda: len(world.target_ips()) == 3 and certified(sim.nodes(cluster, login))
                  and all(world.presented_fingerprints(i) == f for i, f in own.items()))

        victim = sorted(sim.nodes(cluster, login), key=lambda n: n.ip)[0]
        world.wait(world.publish(sim.replace_node(cluster, victim.instance_id)))
        demo.step("certificate mode: replacement login node provisioned",
                  lambda: world.publish(sim.finish_provisioning(cluster)),
                  "the new node reports its keys, is certified, verified, then registered",
                  lambda: len(world.target_ips()) == 3 and victim.ip not in world.target_ips()
                  and certified([n for n in sim.nodes(cluster, login) if n.status == "Running"]))

        aging = sorted((n for n in sim.nodes(cluster, login) if n.status == "Running"), key=lambda n: n.ip)[-1]
        _expire_soon(world, aging)
        demo.say(f"        {aging.instance_id}'s certificates now expire in 3 days (renewal due 10 days before)")
        demo.step("certificate mode: daily certificate check", lambda: [world.run_schedule("CertificateRenewal")],
                  f"{aging.instance_id} re-signed for 30 days, still registered",
                  lambda: world.certificate_verdict(aging.instance_id).ok and aging.ip in world.target_ips())


def _expire_soon(world: TwinWorld, node) -> None:
    """Re-sign the node's certificates to expire in 3 days (time passing, without waiting)."""
    ssh = world.hosts.root(node.instance_id) / "etc" / "ssh"
    lines = {name: (ssh / f"ssh_host_{name}_key.pub").read_text().strip() for name in ("ed25519", "ecdsa", "rsa")}
    now = datetime.now(timezone.utc)
    bundle = certify_host_keys(world.host_ca, lines, world.certificate_policy().principals_for(node.ip),
                               f"hpops:{world.cluster_name}/{node.instance_id}", now - timedelta(days=27), now + timedelta(days=3))
    for name, cert in bundle.certificates.items():
        (ssh / f"ssh_host_{name}_key-cert.pub").write_text(cert + "\n")
