"""The air-gap kit (``lsr-os airgap-kit``) and deploy-model's hint for an ML node that cannot reach publish.djl.ai.

The real-node proof (deploy fails with "publish.djl.ai", the kit is installed, the same model deploys, no
restart) is ``tests/opensearch_real/conftest.py::djl_cache_ready``; these tests pin the pieces offline.
"""
from __future__ import annotations

import json
import zipfile

import pytest
from click.testing import CliRunner
from double.fixtures import fake_bundle_dir, os_client, os_double  # noqa: F401

from opensearch_lsr.cli import cli
from opensearch_lsr.opensearch.djl_cache import (SUMS_FILE, AirgapError, build_kit, check_cache, install_kit,
                                                 kit_plan, natives_for)
from opensearch_lsr.opensearch.mlcommons import DeployConfig, DeployError, deploy_bundle, deploy_hint

LIBS = {"libtorch.so": b"torch", "libtorch_cpu.so": b"cpu" * 100, "libc10.so": b"c10", "libgomp-98b21ff3.so.1": b"gomp"}


def _fake_jars(folder):
    """The two Maven jars with the entries DJL's artifacts hold (small stand-in bytes)."""
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / "pytorch-native-cpu-2.5.1-linux-x86_64.jar", "w") as zf:
        zf.writestr("native/lib/pytorch.properties", "version=2.5.1-20241113\nflavor=cpu\n")
        for name, data in LIBS.items():
            zf.writestr(f"pytorch/cpu/linux-x86_64/{name}", data)
    with zipfile.ZipFile(folder / "pytorch-jni-2.5.1-0.32.0.jar", "w") as zf:
        zf.writestr("jnilib/linux-x86_64/cpu/libdjl_torch.so", b"jni-cxx11")
        zf.writestr("jnilib/linux-x86_64/cpu-precxx11/libdjl_torch.so", b"jni-precxx11")
    return folder


def test_versions_and_folder_names():
    natives = natives_for("3.6.0")
    assert (natives.djl, natives.pytorch) == ("0.31.1", "2.5.1")
    assert natives.folder == "2.5.1-cpu-precxx11-linux-x86_64" and natives.jni_name == "0.31.1-libdjl_torch.so"
    assert natives_for("3.0.0") == natives_for("3.8.1")
    with pytest.raises(AirgapError, match="1.13.1"):
        natives_for("2.19.1")
    with pytest.raises(AirgapError, match="known: 3.0 to 3.8"):
        natives_for("3.9.0")
    plan = kit_plan("3.6.0", "/var/lib/opensearch")
    assert plan["target_folder"] == "/var/lib/opensearch/ml_cache/pytorch/2.5.1-cpu-precxx11-linux-x86_64"
    assert [a["url"] for a in plan["artifacts"]] == [
        "https://repo1.maven.org/maven2/ai/djl/pytorch/pytorch-native-cpu/2.5.1/pytorch-native-cpu-2.5.1-linux-x86_64.jar",
        "https://repo1.maven.org/maven2/ai/djl/pytorch/pytorch-jni/2.5.1-0.32.0/pytorch-jni-2.5.1-0.32.0.jar"]


def test_kit_is_laid_out_checked_and_installed(tmp_path):
    folder = build_kit("3.6.0", _fake_jars(tmp_path / "jars"), tmp_path / "kit")
    assert folder == tmp_path / "kit" / "ml_cache" / "pytorch" / "2.5.1-cpu-precxx11-linux-x86_64"
    assert {p.name for p in folder.iterdir()} == set(LIBS) | {"0.31.1-libdjl_torch.so", SUMS_FILE}
    assert (folder / "0.31.1-libdjl_torch.so").read_bytes() == b"jni-cxx11"  # the ABI of the cxx11 libtorch
    assert check_cache(folder) == []
    installed = install_kit(folder, tmp_path / "data", link=True)
    assert installed == tmp_path / "data" / "ml_cache" / "pytorch" / folder.name and check_cache(installed) == []
    (installed / "libc10.so").unlink()
    (installed / "libc10.so").write_bytes(b"changed")
    assert check_cache(installed) == ["libc10.so does not match its sha256"]
    (folder / "libtorch.so").unlink()
    with pytest.raises(AirgapError, match="libtorch.so is missing"):
        install_kit(folder, tmp_path / "data2")


def test_missing_jar_names_the_download(tmp_path):
    with pytest.raises(AirgapError, match="pytorch-native-cpu-2.5.1-linux-x86_64.jar is missing"):
        build_kit("3.6.0", tmp_path, tmp_path / "kit")


def test_cli_plans_builds_and_checks(tmp_path):
    runner = CliRunner()
    res = runner.invoke(cli, ["airgap-kit", "--opensearch-version", "3.6.0"])
    assert res.exit_code == 0 and json.loads(res.stdout)["target_folder"].startswith("<path.data>/ml_cache/pytorch/")
    res = runner.invoke(cli, ["airgap-kit", "--opensearch-version", "3.6.0", "--jars", str(_fake_jars(tmp_path / "j")),
                              "--out", str(tmp_path / "kit"), "--install-to", str(tmp_path / "data")])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert set(out["sha256"]) == set(LIBS) | {"0.31.1-libdjl_torch.so"} and out["installed"].startswith(str(tmp_path))
    res = runner.invoke(cli, ["airgap-kit", "--opensearch-version", "3.6.0", "--check", str(tmp_path / "data")])
    assert res.exit_code == 0 and json.loads(res.stdout)["problems"] == []
    res = runner.invoke(cli, ["airgap-kit", "--opensearch-version", "3.6.0", "--check", str(tmp_path / "empty")])
    assert res.exit_code == 1 and res.stderr.strip().startswith("Error: the PyTorch cache at") and "missing" in res.stderr
    res = runner.invoke(cli, ["airgap-kit", "--opensearch-version", "2.19.1"])
    assert res.exit_code == 1 and len(res.stderr.strip().splitlines()) == 1
    # options that would be dropped in silence: a plan that names --jars, a check that names what builds a kit
    res = runner.invoke(cli, ["airgap-kit", "--opensearch-version", "3.6.0", "--jars", str(tmp_path / "j")])
    assert res.exit_code == 1 and "--fetch, --jars and --install-to need --out" in res.stderr
    res = runner.invoke(cli, ["airgap-kit", "--opensearch-version", "3.6.0", "--check", str(tmp_path / "data"),
                              "--out", str(tmp_path / "kit2")])
    assert res.exit_code == 1 and "--check only checks an installed cache" in res.stderr
    assert not (tmp_path / "kit2").exists()


def test_hint_recognises_the_djl_download_failure():
    # the task error ML Commons 3.6.0 reports (observed), and the node log's EngineException text
    for error in ('{"nodeId":"publish.djl.ai"}', "Failed to save pytorch index file"):
        hint = deploy_hint(error)
        assert "lsr-os airgap-kit" in hint and "ml_cache/pytorch" in hint
    assert "airgap" not in deploy_hint("Failed to deploy model abc")


def test_deploy_to_an_air_gapped_node_names_the_fix(os_double, os_client, fake_bundle_dir):
    os_double.djl_cache_seeded = False
    config = DeployConfig(apply_settings=True, poll_interval_s=0.01, timeout_s=10, verify=False)
    with pytest.raises(DeployError) as err:
        deploy_bundle(os_client, fake_bundle_dir, config)
    message = str(err.value)
    assert "publish.djl.ai" in message and "lsr-os airgap-kit" in message and "stays registered" in message
    os_double.djl_cache_seeded = True  # the kit was installed: the same registered model deploys, no restart
    ids = deploy_bundle(os_client, fake_bundle_dir, config)
    assert ids["reused"]["sparse_encoding"] == "registered"
