"""The login group must be one of the cluster's, and the Login group where Slurm roles are API-driven."""

from hpops_core.cluster.login_group import login_group_problem

FILE_CONFIGURED = {"controller-machine": None, "login": None, "gpu-workers": None}
API_DRIVEN = {"controller": "Controller", "login": "Login", "gpu": "Compute"}


def test_a_group_of_the_cluster_is_accepted_with_or_without_slurm_config():
    assert login_group_problem("login", FILE_CONFIGURED) is None
    assert login_group_problem("login", API_DRIVEN) is None


def test_a_missing_group_names_the_groups_the_cluster_has():
    problem = login_group_problem("login-nodes", API_DRIVEN)
    assert problem == ("LoginGroupName 'login-nodes' is not an instance group of the cluster; its groups: "
                       "'controller' ('Controller'), 'gpu' ('Compute'), 'login' ('Login')")
    assert login_group_problem("login", {}).endswith("its groups: none")


def test_a_group_slurm_runs_as_compute_names_the_login_group():
    assert login_group_problem("gpu", API_DRIVEN) == (
        "LoginGroupName 'gpu' has SlurmConfig NodeType 'Compute', not Login; the Login group is 'login'")


def test_hostile_group_names_are_shown_escaped():
    problem = login_group_problem("login", {"evil\n\x1b[31m": None})
    assert "\n" not in problem and "\x1b" not in problem
