"""A Ray submission carries the whole runtime_env the control plane builds, and no control-plane secret."""

from __future__ import annotations

from types import SimpleNamespace

from orchestrator.services.launch import Launch, driver_env, runtime_env
from orchestrator.settings import Settings
from tests.fakes import FakeBackend

SECRETS = {
    "admin_token": "adm_secret_one,adm_secret_two",
    "database_url": "postgresql+psycopg://orch:db_secret@127.0.0.1:5432/orch",
}


def test_the_runtime_env_holds_the_drivers_env_vars_and_no_control_plane_secret():
    settings = Settings(**SECRETS)
    env = runtime_env("jcl_claim_code", settings)
    assert set(env) == {"env_vars"}
    assert env["env_vars"] == driver_env("jcl_claim_code", settings)
    # The driver's one-use claim code, which it exchanges for the run's token at its start: Ray lists a job's
    # runtime_env to the whole cluster, so no token is ever in it
    # (docs/security.md, "Run tokens are never in Ray's job table").
    assert env["env_vars"]["ORCHESTRATOR_CLAIM_CODE"] == "jcl_claim_code"
    assert not any("TOKEN" in name for name in env["env_vars"])
    assert all(isinstance(value, str) for value in env["env_vars"].values())  # Ray's env_vars are strings
    text = repr(env)
    for secret in ("adm_secret_one", "adm_secret_two", "db_secret", settings.database_url):
        assert secret not in text


def test_the_backend_is_handed_the_runtime_env_as_built():
    settings = Settings(**SECRETS)
    run = SimpleNamespace(id="abc123", attempt=2, submission_id="abc123-2", project_id="p1")
    launch = Launch.of(run)
    backend = FakeBackend()
    launch.submit(backend, "jcl_claim_code", settings)
    assert backend.runtime_envs == [runtime_env("jcl_claim_code", settings)]
    assert backend.submitted == [(launch.submission_id, launch.entrypoint, driver_env("jcl_claim_code", settings))]


def test_with_code_the_working_dir_is_the_stored_packages_name_in_rays_store_and_pip_its_requirements():
    from orchestrator.services.launch import CodeMount, ray_package_uri

    settings = Settings(**SECRETS)
    code = CodeMount("p1", "a" * 64, "b" * 64, 123, ("scipy==1.14.1",))
    env = runtime_env("jcl_claim_code", settings, code)
    assert env["working_dir"] == ray_package_uri("b" * 64) == f"gcs://_ray_pkg_{'b' * 64}.zip"
    assert env["pip"] == ["scipy==1.14.1"]
    assert env["env_vars"] == driver_env("jcl_claim_code", settings)
    assert "pip" not in runtime_env("jcl_claim_code", settings, CodeMount("p1", "a" * 64, "b" * 64, 123))


def test_a_local_ray_node_never_inherits_the_control_planes_settings():
    """Every driver and worker inherits `ray start`'s environment: the admin token and the database URL,
    set as ORCHESTRATOR_* variables for the control plane, must not be in it (docs/security.md,
    "What a worker's environment holds")."""
    from orchestrator.backend.local_cluster import node_env

    environ = {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "ORCHESTRATOR_ADMIN_TOKEN": "adm_secret",
        "ORCHESTRATOR_DATABASE_URL": "postgresql://u:pw@db/x",
        "PGPASSWORD": "pw",
    }
    assert node_env(environ) == {"PATH": "/usr/bin", "HOME": "/root"}
