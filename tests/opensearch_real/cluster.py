"""A real single-node OpenSearch for the real-cluster suite, assembled from Maven Central (no Docker).

    python tests/opensearch_real/cluster.py start   # fetch + assemble once, start, wait for green
    python tests/opensearch_real/cluster.py stop    # stop by pid, print the peak RSS, delete the run folder

``start`` prints ``OPENSEARCH_URL=...`` lines (plus ``OPENSEARCH_DATA_PATH``, ``OPENSEARCH_NODE_UID`` and
``LSR_DJL_KIT`` for the air-gap fixture of ``conftest.py``) and exits 0; where Maven Central, a Java 21+
or the node is not available it prints one ``unavailable: ...`` line and exits 3.

Pinned release: OpenSearch **3.6.0** (Lucene 10.4.0), plugins 3.6.0.0: the newest line whose core
integ-test-zip and all four plugin zips are on Maven Central (3.3.0 lacks ml/neural/job-scheduler zips
there, 2.19.1 lacks ML Commons' libtorch-2.5.1 DJL line). The 3.6.0 integ-test-zip carries every module
(lang-painless, analysis-common, mapper-extras ...), so only analysis-nori is assembled by hand: Central
has its jar for 3.8.0 only; its six classes (OpenSearch ``plugins/analysis-nori``) are packaged with
``lucene-analysis-nori:10.4.0`` (the core's Lucene) under a 3.6.0 descriptor. The node runs without
the DJL PyTorch cache: the suite proves the air-gap failure and fix with the ``airgap-kit`` files.

OpenSearch refuses to run as root (``Bootstrap.initializeNatives``): as root the node runs as
``nobody`` (setpriv) from a world-readable cache (default ``/var/tmp/opensearch-lsr``; else
``~/.cache/opensearch-lsr/opensearch``; ``LSR_OPENSEARCH_CACHE`` overrides).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

VERSION, PLUGIN_VERSION, LUCENE = "3.6.0", "3.6.0.0", "10.4.0"
NORI_JAR_VERSION = "3.8.0"
CORE = f"org.opensearch.distribution.integ-test-zip:opensearch:{VERSION}:zip"
#: install order: job-scheduler before ml (extends it), knn before neural-search (extends it)
PLUGINS = [f"org.opensearch.plugin:{a}:{PLUGIN_VERSION}:zip" for a in
           ("opensearch-job-scheduler", "opensearch-knn", "opensearch-ml-plugin", "neural-search")]
NORI = [f"org.opensearch.plugin:analysis-nori:{NORI_JAR_VERSION}:jar", f"org.apache.lucene:lucene-analysis-nori:{LUCENE}:jar"]
NODE_SETTINGS = {
    "discovery.type": "single-node",
    "network.host": "127.0.0.1",
    "cluster.routing.allocation.disk.threshold_enabled": "false",
    "plugins.ml_commons.only_run_on_ml_node": "false",
    "plugins.ml_commons.allow_registering_model_via_local_file": "true",
    "plugins.ml_commons.jvm_heap_memory_threshold": "100",
    "plugins.ml_commons.disk_free_space_threshold": "1gb",
    "plugins.ml_commons.native_memory_threshold": "100",
}
NOBODY = 65534


class Unavailable(RuntimeError):
    """Maven Central, a JDK or the node is not available here (the suite is skipped, in one line)."""


def cache_root() -> Path:
    if os.environ.get("LSR_OPENSEARCH_CACHE"):
        return Path(os.environ["LSR_OPENSEARCH_CACHE"])
    if os.geteuid() == 0:
        return Path("/var/tmp/opensearch-lsr")
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "opensearch-lsr" / "opensearch"


def _file_name(coords: str) -> str:
    _, artifact, version, packaging, *rest = coords.split(":")
    return f"{artifact}-{version}{'-' + rest[0] if rest else ''}.{packaging}"


def fetch(coords: list[str], dest: Path) -> list[Path]:
    """``mvn dependency:copy`` each artifact into ``dest`` (Maven checks the checksums); cached."""
    if shutil.which("mvn") is None:
        raise Unavailable("mvn is not installed")
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for c in coords:
        path = dest / _file_name(c)
        if not path.is_file():
            proc = subprocess.run(["mvn", "-q", "-B", "dependency:copy", f"-Dartifact={c}", f"-DoutputDirectory={dest}"],
                                  capture_output=True, text=True)
            if proc.returncode or not path.is_file():
                raise Unavailable(f"Maven Central did not give {c} ({(proc.stdout + proc.stderr).strip()[-160:]})")
        out.append(path)
    return out


def find_java() -> Path:
    """A JDK home whose ``java`` is 21+ (OpenSearch 3.x): OPENSEARCH_JAVA_HOME, JAVA_HOME, /usr/lib/jvm/*."""
    candidates = [os.environ.get("OPENSEARCH_JAVA_HOME"), os.environ.get("JAVA_HOME")]
    candidates += sorted((str(p) for p in Path("/usr/lib/jvm").glob("*")), reverse=True)
    for home in filter(None, candidates):
        java = Path(home) / "bin" / "java"
        if not java.is_file():
            continue
        proc = subprocess.run([str(java), "-version"], capture_output=True, text=True)
        words = (proc.stderr or proc.stdout).split('"')
        major = words[1].split(".")[0] if len(words) > 1 else "0"
        if major.isdigit() and int(major) >= 21:
            return Path(home)
    raise Unavailable("no Java 21+ found (OpenSearch 3.x needs one; set OPENSEARCH_JAVA_HOME)")


def _nori_zip(root: Path, jars: list[Path]) -> Path:
    out = root / f"analysis-nori-{VERSION}.zip"
    if out.is_file():
        return out
    descriptor = "\n".join([
        "description=The Korean (nori) Analysis plugin integrates Lucene nori analysis module into opensearch.",
        f"version={VERSION}", "name=analysis-nori", "classname=org.opensearch.plugin.analysis.nori.AnalysisNoriPlugin",
        "java.version=21", f"opensearch.version={VERSION}", "extended.plugins=", "has.native.controller=false", ""])
    tmp = out.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w") as zf:
        zf.writestr("plugin-descriptor.properties", descriptor)
        for jar in jars:
            zf.write(jar, jar.name)
    tmp.rename(out)
    return out


def assemble(root: Path, java: Path) -> Path:
    """Unzip the integ-test-zip and install the plugins once; returns the node's home."""
    home = root / f"opensearch-{VERSION}"
    if (home / ".assembled").is_file():
        return home
    dl = root / "dl"
    [core] = fetch([CORE], dl)
    zips = fetch(PLUGINS, dl)
    zips.append(_nori_zip(root, fetch(NORI, dl)))
    shutil.rmtree(home, ignore_errors=True)
    with zipfile.ZipFile(core) as zf:
        zf.extractall(root)
    for path in (home / "bin").iterdir():
        path.chmod(0o755)
    env = {**os.environ, "OPENSEARCH_JAVA_HOME": str(java)}
    proc = subprocess.run([str(home / "bin" / "opensearch-plugin"), "install", "--batch"]
                          + [f"file://{z}" for z in zips], env=env, capture_output=True, text=True)
    if proc.returncode:
        raise Unavailable(f"plugin install failed: {(proc.stdout + proc.stderr).strip()[-300:]}")
    subprocess.run(["chmod", "-R", "a+rX", str(home)], check=True)
    (home / ".assembled").write_text(json.dumps({"core": CORE, "plugins": PLUGINS, "nori": NORI}), encoding="utf-8")
    return home


def build_djl_kit(root: Path) -> Path:
    """The airgap-kit folder for this release (the package's own command, from Maven Central)."""
    from opensearch_lsr.opensearch import djl_cache

    kit = root / "djl-kit"
    folder = kit / "ml_cache" / "pytorch" / djl_cache.natives_for(VERSION).folder
    if not djl_cache.check_cache(folder) == []:
        djl_cache.fetch_jars(VERSION, root / "dl")
        folder = djl_cache.build_kit(VERSION, root / "dl", kit)
    subprocess.run(["chmod", "-R", "a+rX", str(kit)], check=True)
    return folder


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _health(url: str) -> str | None:
    try:
        with urllib.request.urlopen(f"{url}/_cluster/health?wait_for_status=green&timeout=2s", timeout=5) as r:
            return json.load(r).get("status")
    except OSError:
        return None


def start(heap: str = "2g", timeout_s: float = 240.0) -> dict:
    """Assemble (once), start a node on 127.0.0.1 and wait for green; returns the state saved to ``state.json``."""
    t0 = time.monotonic()
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    java = find_java()
    home = assemble(root, java)
    kit = build_djl_kit(root)
    run = root / "runs" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    for sub in ("data", "logs"):
        (run / sub).mkdir(parents=True)
    shutil.copytree(home / "config", run / "config")
    options = (run / "config" / "jvm.options").read_text(encoding="utf-8")  # relative paths -> the run folder
    options = options.replace("file=logs/", f"file={run}/logs/").replace("HeapDumpPath=data", f"HeapDumpPath={run}/data")
    (run / "config" / "jvm.options").write_text(options.replace("ErrorFile=logs/", f"ErrorFile={run}/logs/"),
                                                encoding="utf-8")
    uid = NOBODY if os.geteuid() == 0 else os.geteuid()
    if os.geteuid() == 0:
        subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(run)], check=True)
        run.parent.chmod(0o755)
    port, tport = _free_port(), _free_port()
    settings = {**NODE_SETTINGS, "http.port": str(port), "transport.port": str(tport),
                "path.data": str(run / "data"), "path.logs": str(run / "logs")}
    cmd = [str(home / "bin" / "opensearch"), "-d", "-p", str(run / "node.pid")]
    cmd += [arg for k, v in settings.items() for arg in ("-E", f"{k}={v}")]
    if os.geteuid() == 0:
        cmd = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"] + cmd
    env = {"PATH": "/usr/bin:/bin", "HOME": str(run), "OPENSEARCH_JAVA_HOME": str(java),
           "OPENSEARCH_PATH_CONF": str(run / "config"), "OPENSEARCH_JAVA_OPTS": f"-Xms{heap} -Xmx{heap}"}
    with open(run / "start.out", "w") as out:  # not a pipe: the daemonized node keeps its stdout open
        proc = subprocess.run(["nice", "-n", "5"] + cmd, env=env, cwd=run, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    state = {"url": url, "run": str(run), "pid": None, "uid": uid, "data": str(run / "data"), "kit": str(kit),
             "version": VERSION, "heap": heap}
    if proc.returncode:
        raise Unavailable(f"the node did not start: {(run / 'start.out').read_text().strip().splitlines()[-1:]}")
    pid_file = run / "node.pid"
    while time.monotonic() - t0 < timeout_s:
        if pid_file.is_file() and pid_file.read_text().strip():
            state["pid"] = int(pid_file.read_text().strip())
            if not Path(f"/proc/{state['pid']}").exists():
                break
        if _health(url) == "green":
            state["start_s"] = round(time.monotonic() - t0, 1)
            (root / "state.json").write_text(json.dumps(state, indent=2), encoding="utf-8")
            return state
        time.sleep(1)
    log = run / "logs" / "opensearch.log"
    last = log.read_text(errors="replace").strip().splitlines()[-1:] if log.is_file() else []
    if state["pid"]:
        _stop_pid(state["pid"])
    raise Unavailable(f"the node was not green within {timeout_s:.0f}s: {last}")


def _peak_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def _stop_pid(pid: int, wait_s: float = 60.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + wait_s
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    if Path(f"/proc/{pid}").exists():
        os.kill(pid, signal.SIGKILL)


def stop(keep: bool = False) -> dict:
    """Stop the node of ``state.json`` by its pid; returns its peak RSS; deletes its run folder."""
    state_file = cache_root() / "state.json"
    if not state_file.is_file():
        return {}
    state = json.loads(state_file.read_text(encoding="utf-8"))
    state["peak_rss_mb"] = _peak_rss_mb(state["pid"]) if state.get("pid") else None
    if state.get("pid"):
        _stop_pid(state["pid"])
    if not keep:
        shutil.rmtree(state["run"], ignore_errors=True)
    state_file.unlink()
    return state


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("--heap", default="2g", help="-Xms and -Xmx of the node")
    parser.add_argument("--keep", action="store_true", help="stop: keep the run folder (data, logs)")
    args = parser.parse_args(argv)
    if args.action == "stop":
        state = stop(keep=args.keep)
        print(f"stopped OpenSearch pid {state.get('pid')}: peak RSS {state.get('peak_rss_mb')} MB" if state
              else "no node was running")
        return 0
    try:
        state = start(heap=args.heap)
    except Unavailable as err:
        print(f"unavailable: {err}")
        return 3
    print(f"OPENSEARCH_URL={state['url']}\nOPENSEARCH_DATA_PATH={state['data']}\nOPENSEARCH_NODE_UID={state['uid']}\n"
          f"LSR_DJL_KIT={state['kit']}\n# OpenSearch {VERSION} green in {state['start_s']}s (pid {state['pid']}, "
          f"heap {state['heap']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
