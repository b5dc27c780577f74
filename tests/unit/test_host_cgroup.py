"""cgroup_cpu_limit (builder/core/host.py) against fake /proc and /sys trees: the quota of the process's OWN
group and of every group above it binds, for cgroup v1 and v2, in a namespaced container and not."""

from __future__ import annotations

from builder.core.host import cgroup_cpu_limit, host_profile, usable_cores

V1_CPU_MOUNT = "32 31 0:29 {root} /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
V2_MOUNT = "41 31 0:38 {root} {point} rw,relatime - cgroup2 cgroup2 rw\n"
OTHER_MOUNTS = ("31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
                "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
                "33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n")


def fake_host(tmp_path, cgroup: str, mountinfo: str):
    """A reader of absolute paths inside tmp_path, with /proc/self/cgroup and mountinfo written."""
    proc = tmp_path / "proc" / "self"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text(cgroup)
    (proc / "mountinfo").write_text(OTHER_MOUNTS + mountinfo)
    return lambda path: (tmp_path / path.lstrip("/")).read_text()


def v1_group(tmp_path, group: str, quota: int, period: int = 100000) -> None:
    folder = tmp_path / "sys/fs/cgroup/cpu" / group.strip("/")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    (folder / "cpu.cfs_period_us").write_text(f"{period}\n")


def v2_group(tmp_path, group: str, cpu_max: str | None, top: str = "sys/fs/cgroup") -> None:
    folder = tmp_path / top / group.strip("/")
    folder.mkdir(parents=True, exist_ok=True)
    if cpu_max is not None:
        (folder / "cpu.max").write_text(cpu_max + "\n")


def test_v1_quota_on_the_process_own_group_counts(tmp_path):
    """The probe's case: a 0.5-CPU group under an unlimited root gave 2 usable cores on a 2-core host."""
    read = fake_host(tmp_path, "4:memory:/\n1:cpu:/probe\n2:cpuacct:/\n0::/\n",
                     V1_CPU_MOUNT.format(root="/") + V2_MOUNT.format(root="/", point="/sys/fs/cgroup/unified"))
    v1_group(tmp_path, "/", -1)
    v1_group(tmp_path, "/probe", 50000)
    v2_group(tmp_path, "/", None, top="sys/fs/cgroup/unified")  # hybrid host: v2 has no cpu controller
    assert cgroup_cpu_limit(read) == 0.5
    assert usable_cores(affinity=2, quota=cgroup_cpu_limit(read)) == 1


def test_v2_nested_groups_the_smallest_quota_on_the_way_up_binds(tmp_path):
    read = fake_host(tmp_path, "0::/user.slice/app.service\n", V2_MOUNT.format(root="/", point="/sys/fs/cgroup"))
    v2_group(tmp_path, "/", None)  # the v2 root group has no cpu.max at all
    v2_group(tmp_path, "/user.slice", "150000 100000")
    v2_group(tmp_path, "/user.slice/app.service", "max 100000")
    assert cgroup_cpu_limit(read) == 1.5  # the parent's limit binds the unlimited child
    v2_group(tmp_path, "/user.slice/app.service", "50000 100000")
    assert cgroup_cpu_limit(read) == 0.5  # and a child's smaller one binds under it


def test_v1_nested_groups_the_parent_binds(tmp_path):
    read = fake_host(tmp_path, "1:cpu,cpuacct:/a/b\n", V1_CPU_MOUNT.format(root="/"))
    v1_group(tmp_path, "/", -1)
    v1_group(tmp_path, "/a", 300000, 100000)
    v1_group(tmp_path, "/a/b", -1)
    assert cgroup_cpu_limit(read) == 3.0


def test_no_limit_anywhere_is_none(tmp_path):
    read = fake_host(tmp_path, "1:cpu:/a\n0::/a\n",
                     V1_CPU_MOUNT.format(root="/") + V2_MOUNT.format(root="/", point="/sys/fs/cgroup/unified"))
    v1_group(tmp_path, "/", -1)
    v1_group(tmp_path, "/a", -1)
    v2_group(tmp_path, "/a", "max 100000", top="sys/fs/cgroup/unified")
    v2_group(tmp_path, "/", "max", top="sys/fs/cgroup/unified")
    assert cgroup_cpu_limit(read) is None


def test_container_whose_group_path_is_the_root(tmp_path):
    """A cgroup namespace makes the container's group '/': its limit is at the mount point."""
    read = fake_host(tmp_path, "0::/\n", V2_MOUNT.format(root="/", point="/sys/fs/cgroup"))
    v2_group(tmp_path, "/", "200000 100000")
    assert cgroup_cpu_limit(read) == 2.0


def test_container_without_a_namespace_sees_its_group_at_the_mount_point(tmp_path):
    """docker --cgroupns=host on v1: /proc/self/cgroup names /docker/ID, which the container's mount
    shows at /sys/fs/cgroup/cpu itself (mountinfo's root field is /docker/ID)."""
    read = fake_host(tmp_path, "3:cpu,cpuacct:/docker/abc\n",
                     "32 31 0:29 /docker/abc /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n")
    folder = tmp_path / "sys/fs/cgroup/cpu,cpuacct"
    folder.mkdir(parents=True)
    (folder / "cpu.cfs_quota_us").write_text("150000\n")
    (folder / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_limit(read) == 1.5


def test_a_mount_point_with_a_space_and_a_group_outside_the_namespace(tmp_path):
    read = fake_host(tmp_path, "0::/../other\n", V2_MOUNT.format(root="/", point="/cg\\040root"))
    v2_group(tmp_path, "/", "100000 100000", top="cg root")
    assert cgroup_cpu_limit(read) == 1.0  # only the namespace's top can be seen


def test_without_proc_the_tops_of_the_usual_mounts_are_read(tmp_path):
    read = lambda path: (tmp_path / path.lstrip("/")).read_text()  # noqa: E731
    assert cgroup_cpu_limit(read) is None
    v1_group(tmp_path, "/", 250000)
    assert cgroup_cpu_limit(read) == 2.5


def test_host_profile_records_the_own_group_quota(tmp_path):
    read = fake_host(tmp_path, "1:cpu:/probe\n", V1_CPU_MOUNT.format(root="/"))
    v1_group(tmp_path, "/", -1)
    v1_group(tmp_path, "/probe", 100000)
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("model name : Test CPU\nflags : avx2\n")
    profile = host_profile(cpuinfo, read, with_gpu=False)
    assert profile["cgroup_cpu_quota"] == 1.0 and profile["usable_cores"] == 1
