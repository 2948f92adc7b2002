"""The deployment files say what the README and docs/deploy.md promise.

No container engine runs in every CI, so this reads the Dockerfile, compose.yaml and
the systemd unit as data: `.ci/run` builds the image (or lints the Dockerfile with
hadolint) on top of this.
"""

from __future__ import annotations

import configparser
import re
import shlex
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per Dockerfile instruction, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text(encoding="utf-8"))
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def _final_stage() -> list[tuple[str, str]]:
    steps = _instructions()
    last_from = max(i for i, (k, _) in enumerate(steps) if k == "FROM")
    return steps[last_from:]


def _pyproject() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _extras() -> dict[str, list[str]]:
    project = _pyproject()["project"]
    assert isinstance(project, dict)
    extras = project["optional-dependencies"]
    assert isinstance(extras, dict)
    return extras


def _env(steps: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for keyword, rest in steps:
        if keyword == "ENV":
            for pair in shlex.split(rest):
                name, _, value = pair.partition("=")
                env[name] = value
    return env


def test_the_image_is_built_in_two_stages_and_installs_extras_that_exist() -> None:
    steps = _instructions()
    assert sum(1 for k, _ in steps if k == "FROM") >= 2
    installs = [rest for k, rest in steps if k == "RUN" and "pip install" in rest]
    named = {extra for rest in installs for extra in re.findall(r'\.\[([\w,-]+)\]', rest)}
    assert named == {"all"}
    assert named <= set(_extras())


def test_the_all_extra_holds_every_platform_sdk_and_the_otlp_exporter() -> None:
    extras = _extras()
    names = {Requirement(r).name.lower() for r in extras["all"]}
    for platform in ("telegram", "discord", "slack", "matrix"):
        assert {Requirement(r).name.lower() for r in extras[platform]} <= names
    assert "opentelemetry-exporter-otlp-proto-http" in names
    assert "opentelemetry-exporter-otlp-proto-http" in {
        Requirement(r).name.lower() for r in extras["otel"]}


def test_every_copied_path_exists_and_the_public_package_is_copied() -> None:
    copied = []
    for keyword, rest in _instructions():
        if keyword == "COPY" and not rest.startswith("--from"):
            copied += shlex.split(rest)[:-1]
    assert "roost" in copied
    for source in copied:
        assert (ROOT / source).exists(), source


def test_the_service_runs_as_a_numeric_non_root_user() -> None:
    users = [rest for k, rest in _final_stage() if k == "USER"]
    assert users
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0


def test_the_health_server_listens_on_every_interface_and_is_checked() -> None:
    final = _final_stage()
    env = _env(final)
    assert env["ROOST_HTTP_HOST"] == "0.0.0.0"
    assert env["ROOST_HTTP_PORT"] == "8080"
    assert ("EXPOSE", "8080") in final
    checks = [rest for k, rest in final if k == "HEALTHCHECK"]
    assert len(checks) == 1 and "/healthz" in checks[0]


def test_plugins_and_data_live_on_the_volume() -> None:
    final = _final_stage()
    env = _env(final)
    assert env["ROOST_DATA_DIR"] == "/data"
    assert env["ROOST_PLUGINS_DIR"].startswith("/data/")
    assert ("VOLUME", '["/data"]') in final


def test_a_custom_package_index_can_be_given_to_the_build() -> None:
    args = {rest.split("=")[0] for k, rest in _instructions() if k == "ARG"}
    assert {"PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST"} <= args
    assert "PIP_INDEX_URL" in (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")


def test_compose_runs_roost_with_a_volume_an_env_file_and_an_optional_collector() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text(encoding="utf-8"))
    roost = compose["services"]["roost"]
    assert roost["build"]["context"] == "."
    mounts = {m.split(":")[0]: m.split(":")[1] for m in roost["volumes"]}
    assert mounts["roost-data"] == "/data"
    assert "roost-data" in compose["volumes"]
    assert any(e["path"] == ".env" for e in roost["env_file"])
    collector = compose["services"]["otel-collector"]
    assert collector["profiles"] == ["otel"]
    assert "4318" in compose["configs"]["otel-collector"]["content"]


def test_the_systemd_unit_runs_roost_as_its_own_user() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read(ROOT / "docs" / "systemd" / "roost.service", encoding="utf-8")
    service = unit["Service"]
    assert service["ExecStart"].endswith("roost run")
    assert service["User"] not in ("", "root")
    assert service["RestartPreventExitStatus"] == "2"
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_the_license_file_matches_pyproject() -> None:
    project = _pyproject()["project"]
    assert isinstance(project, dict)
    assert project["license"] == "MIT"  # an SPDX expression (PEP 639)
    assert (ROOT / "LICENSE").read_text(encoding="utf-8").startswith("MIT License")


def test_replicas_compose_runs_two_replicas_on_postgresql_behind_a_load_balancer() -> None:
    compose = yaml.safe_load((ROOT / "deploy" / "compose.replicas.yml").read_text(
        encoding="utf-8"))
    services = compose["services"]
    replicas = [services["roost-1"], services["roost-2"]]
    for replica in replicas:
        env = replica["environment"]
        assert env["ROOST_DATABASE_URL"].startswith("postgresql://")
        # The webhooks share the HTTP server, which the balancer health-checks.
        assert env["ROOST_TELEGRAM_WEBHOOK_PORT"] == env["ROOST_SLACK_PORT"] == \
            env["ROOST_HTTP_PORT"]
        assert "roost-workspaces:/data/workspaces" in replica["volumes"]
    assert services["db"]["image"].startswith("postgres:")
    caddyfile = compose["configs"]["caddyfile"]["content"]
    assert "reverse_proxy roost-1:8080 roost-2:8080" in caddyfile
    assert "health_uri /readyz" in caddyfile
    assert "path /telegram /slack/events" in caddyfile and "respond 404" in caddyfile
