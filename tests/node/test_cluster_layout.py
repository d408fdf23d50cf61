"""Which group has which Slurm role, from the documents AWS gives a node (pure; no files, no AWS)."""

from hpops_node_agent import cluster_layout, usage

PLATFORM = "/opt/ml/config/provisioning_parameters.json"
LIFECYCLE = "/opt/hpops-node-agent/provisioning_parameters.json"
API_GROUPS = [
    {"InstanceGroupName": "controller", "SlurmConfig": {"NodeType": "Controller"}},
    {"InstanceGroupName": "login", "SlurmConfig": {"NodeType": "Login"}},
    {"InstanceGroupName": "p5", "SlurmConfig": {"NodeType": "Compute", "PartitionNames": ["gpu", "debug"]}},
    {"InstanceGroupName": "c5", "SlurmConfig": {"NodeType": "Compute", "PartitionNames": ["cpu", "debug"]}},
]


def test_hyperpods_own_file_is_trusted_before_the_lifecycle_folders():
    layout = cluster_layout.resolve([(PLATFORM, {"controller_group": "ctl", "login_group": "login-a"}),
                                     (LIFECYCLE, {"controller_group": "old", "login_group": "login-b"})])
    assert (layout.login_group, layout.controller_group, layout.source) == ("login-a", "ctl", PLATFORM)


def test_a_file_that_names_no_group_is_passed_over():
    # detect_node.sh reads login_group with `or ''`: a cluster without login nodes writes null.
    layout = cluster_layout.resolve([(PLATFORM, {"login_group": None}), (LIFECYCLE, {"controller_group": "ctl"})])
    assert (layout.login_group, layout.controller_group, layout.source) == (None, "ctl", LIFECYCLE)
    assert cluster_layout.resolve([(PLATFORM, None), (LIFECYCLE, {"worker_groups": []})]) is None


def test_api_driven_roles_and_partitions_come_from_slurm_config():
    layout = cluster_layout.resolve([(PLATFORM, None), (LIFECYCLE, None)], API_GROUPS)
    assert (layout.login_group, layout.controller_group) == ("login", "controller")
    assert layout.source == "DescribeCluster SlurmConfig"
    # debug is served by two groups of different instance types: left out and named, as from a file.
    partitions = usage.partition_groups_of_pairs(layout.partition_pairs, source=layout.partition_source)
    assert partitions.groups == {"cpu": "c5", "gpu": "p5"}
    assert "partitions served by more than one instance group: debug" in partitions.reason


def test_slurm_config_partitions_are_preferred_to_a_files_worker_groups():
    files = [(PLATFORM, {"controller_group": "controller", "login_group": "login",
                         "worker_groups": [{"instance_group_name": "p5", "partition_name": "dev"}]})]
    layout = cluster_layout.resolve(files, API_GROUPS)
    assert layout.source == PLATFORM and layout.partition_source == "DescribeCluster SlurmConfig.PartitionNames"
    assert ("gpu", "p5") in layout.partition_pairs and ("dev", "p5") not in layout.partition_pairs


def test_the_login_and_controller_groups_are_never_workers():
    terraform = {"controller_group": "controller-machine", "login_group": "login-nodes",
                 "worker_groups": [{"instance_group_name": "login-nodes", "partition_name": "dev"},
                                   {"instance_group_name": "controller-machine", "partition_name": "dev"},
                                   {"instance_group_name": "compute-nodes", "partition_name": "dev"}]}
    layout = cluster_layout.resolve([(LIFECYCLE, terraform)])
    assert usage.partition_groups_of_pairs(layout.partition_pairs).groups == {"dev": "compute-nodes"}
    assert usage.partition_groups(terraform).groups == {"dev": "compute-nodes"}


def test_two_groups_claiming_the_login_type_name_neither():
    groups = API_GROUPS + [{"InstanceGroupName": "login2", "SlurmConfig": {"NodeType": "Login"}}]
    layout = cluster_layout.resolve([], groups)
    assert layout.login_group is None and layout.controller_group == "controller"
    assert cluster_layout.role_of_group("login", layout) == "compute"


def test_hostile_group_names_name_no_role():
    layout = cluster_layout.resolve([(PLATFORM, {"controller_group": "ctl;rm -rf /", "login_group": ["login"]})])
    assert layout is None
