"""What a tritonserver that failed to start (or was killed) leaves in /dev/shm: the python backend's 1 MB
regions and model.py's drift windows. The server's clean-up removes what appeared since its start and no
process maps or holds open (builder/serving/startup.py remove_orphan_shm), in a folder standing in for
/dev/shm here; the real server: tests/integration."""

from __future__ import annotations

import mmap
import os

from builder.serving.startup import remove_orphan_shm, shm_files


def test_only_new_unused_files_of_ours_are_removed(tmp_path):
    (tmp_path / "triton_python_backend_shm_region_before").write_bytes(b"x")
    before = shm_files(tmp_path)
    for name in ("triton_python_backend_shm_region_orphan", "triton_builder_drift_1_m_1_held",
                 "triton_python_backend_shm_region_mapped", "someone_elses"):
        (tmp_path / name).write_bytes(b"\0" * 16)
    held = os.open(tmp_path / "triton_builder_drift_1_m_1_held", os.O_RDWR)  # a live server's drift window
    fd = os.open(tmp_path / "triton_python_backend_shm_region_mapped", os.O_RDWR)
    mapped = mmap.mmap(fd, 16)  # mapped, its descriptor closed: a live stub's region
    os.close(fd)
    try:
        assert remove_orphan_shm(before, tmp_path) == ["triton_python_backend_shm_region_orphan"]
    finally:
        os.close(held)
        mapped.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "someone_elses", "triton_builder_drift_1_m_1_held", "triton_python_backend_shm_region_before",
        "triton_python_backend_shm_region_mapped"]
