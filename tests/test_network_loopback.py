"""The whole stack (Ray workers, Prefect's embedded server, the CLI) connects to loopback only.

The in-process guard in conftest.py covers the test process; Ray and Prefect start
other processes, so this test runs a real flow under ``strace -f -e trace=connect``
and checks every IPv4/IPv6 ``connect`` goes to 127.0.0.0/8 or ::1.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed (apt-get install strace)")

_INET = re.compile(r"sa_family=AF_INET6?, .*?(?:sin_addr=inet_addr\(\"([^\"]+)\"\)|inet_pton\(AF_INET6?, \"([^\"]+)\")")

SCRIPT = textwrap.dedent(
    """
    import os, sys, tempfile
    from certeval.runtime.envsetup import configure_offline_env, ray_bootstrap_home
    base = tempfile.mkdtemp()
    configure_offline_env(base)
    import ray
    from prefect import flow, task

    old_home = os.environ.get("HOME")
    os.environ["HOME"] = str(ray_bootstrap_home(base))
    ray.init(address="local", num_cpus=1, include_dashboard=False, object_store_memory=80 * 1024**2,
             log_to_driver=False)
    os.environ["HOME"] = old_home or base

    @ray.remote
    class Echo:
        def ping(self, x):
            return x + 1

    @task
    def bump(x: int) -> int:
        return ray.get(Echo.remote().ping.remote(x))

    @flow
    def tiny(x: int) -> int:
        return bump(x)

    assert tiny(1) == 2
    ray.shutdown()
    print("OK")
    """
)


def connect_targets(trace_text: str) -> list[str]:
    """Every IPv4/IPv6 address passed to connect() in an strace log."""
    out = []
    for line in trace_text.splitlines():
        if "connect(" not in line:
            continue
        m = _INET.search(line)
        if m:
            out.append(m.group(1) or m.group(2))
    return out


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1 is IPv4 loopback
    return (mapped or ip).is_loopback


def test_loopback_classification():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("::ffff:127.0.0.1")
    assert not is_loopback("169.254.169.254") and not is_loopback("::ffff:10.0.0.1")


def test_parser_finds_outside_addresses():
    sample = (
        '123 connect(5, {sa_family=AF_INET, sin_port=htons(80), sin_addr=inet_addr("169.254.169.254")}, 16) = -1\n'
        '124 connect(6, {sa_family=AF_INET, sin_port=htons(6379), sin_addr=inet_addr("127.0.0.1")}, 16) = 0\n'
        '125 connect(7, {sa_family=AF_INET6, sin6_port=htons(53), sin6_flowinfo=htonl(0), '
        'inet_pton(AF_INET6, "2001:db8::1", &sin6_addr), sin6_scope_id=0}, 28) = -1\n'
        '126 connect(8, {sa_family=AF_UNIX, sun_path="/tmp/x"}, 110) = 0\n'
    )
    assert connect_targets(sample) == ["169.254.169.254", "127.0.0.1", "2001:db8::1"]


@pytest.mark.slow
def test_ray_and_prefect_touch_loopback_only(tmp_path):
    log = tmp_path / "connect.log"
    env = dict(os.environ)
    env["PREFECT_HOME"] = str(tmp_path / "prefect")
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.run(
        ["strace", "-f", "-qq", "--seccomp-bpf", "-e", "trace=connect", "-o", str(log), sys.executable, "-c", SCRIPT],
        capture_output=True, text=True, timeout=600, env=env, cwd=Path(__file__).resolve().parents[1],
    )
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
    targets = connect_targets(log.read_text())
    assert targets, "strace saw no inet connect at all: the check would be vacuous"
    outside = sorted({t for t in targets if not is_loopback(t)})
    assert not outside, f"connections beyond loopback: {outside}"
