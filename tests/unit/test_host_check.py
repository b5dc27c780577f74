"""What `check` says about hosts (builder/serving/check.py check_host_warnings): it is not the serving
process, so never its own usable cores; the machine's CPU and GPUs only where the server is on this
machine (a loopback address); nothing about a remote server's host, which it cannot see."""

from __future__ import annotations

import pytest

from builder.serving.check import check_host_warnings, on_this_machine

BUILT = {"cpu_model": "AMD EPYC 9B14", "isa_flags": ["avx2", "avx512_vnni", "avx512f"], "isa_class": "avx512_vnni",
         "usable_cores": 1}
META = {"host": BUILT}


@pytest.mark.parametrize("address", ["127.0.0.1:8000", "127.0.1.1:8001", "localhost:8000", "LOCALHOST:8000",
                                     "[::1]:8001", "0.0.0.0:8000", "http://127.0.0.1:8000", "app.localhost:80"])
def test_loopback_addresses_are_this_machine(address):
    assert on_this_machine(address)


@pytest.mark.parametrize("address", ["10.1.2.3:8000", "triton.example.com:8000", "[2001:db8::1]:8001",
                                     "localhost.example.com:8000", "8000"])
def test_other_addresses_are_not(address):
    assert not on_this_machine(address)


def test_cores_that_differ_are_not_checks_business():
    """The probe's case: a 1-core build served under taskset -c 0, checked from an unpinned shell."""
    here = {**BUILT, "usable_cores": 2}
    assert check_host_warnings(META, "m", ["127.0.0.1:8000", "127.0.0.1:8001"], here) == []
    assert check_host_warnings(META, "m", ["10.1.2.3:8000"], here) == []


def test_an_isa_that_differs_is_said_only_for_a_server_on_this_machine():
    here = {"cpu_model": "AMD EPYC 7B13", "isa_flags": ["avx2"], "isa_class": "avx2", "usable_cores": 64}
    [line] = check_host_warnings(META, "m", ["localhost:8000"], here)  # the cores are left out
    assert line.startswith("m: variants were measured on AMD EPYC 9B14 (avx512_vnni") and "this host is AMD " \
        "EPYC 7B13 (avx2)" in line
    assert check_host_warnings(META, "m", ["triton.example.com:8000"], here) == []
    # both protocols must reach this machine: a gRPC address elsewhere is another server's host
    assert check_host_warnings(META, "m", ["127.0.0.1:8000", "10.1.2.3:8001"], here) == []


def test_a_malformed_record_is_still_one_line_for_a_local_server():
    [line] = check_host_warnings({"host": "x"}, "m", ["127.0.0.1:8000"], dict(BUILT), source="r/m/1/metadata.yaml")
    assert line.startswith("m: r/m/1/metadata.yaml: host is not a mapping")
    assert check_host_warnings({"host": "x"}, "m", ["10.1.2.3:8000"], dict(BUILT)) == []
