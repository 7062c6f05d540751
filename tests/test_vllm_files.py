"""tests/vllm_files.py: vLLM's batch_shard.py read out of a release's wheel, else a copy beside the checkout,
else a skip that says where it looked (a collection error where CI requires the file)."""

import zipfile

import pytest
import vllm_files

from shardspec.conformance.upstream.source import SHARD_FILE

FIND = vllm_files.batch_shard_file.__wrapped__  # uncached


@pytest.fixture
def nowhere(tmp_path, monkeypatch):
    """No wheel in an empty folder and no copy beside the checkout."""
    monkeypatch.setenv("SHARDSPEC_VLLM_WHEELS", str(tmp_path / "wheels"))
    monkeypatch.setattr(vllm_files, "shared_file", lambda release: tmp_path / "shared" / release / SHARD_FILE)
    monkeypatch.delenv(vllm_files.REQUIRE, raising=False)
    return tmp_path


def test_the_file_is_read_out_of_the_release_wheel(nowhere):
    (nowhere / "wheels").mkdir()
    with zipfile.ZipFile(nowhere / "wheels" / "vllm-9.9.9-cp38-abi3-manylinux_2_28_x86_64.whl", "w") as wheel:
        wheel.writestr(SHARD_FILE, "# the release's file\n")
        wheel.writestr("vllm/__init__.py", "")
    found = FIND("9.9.9")
    assert found.name == "batch_shard.py" and found.read_text() == "# the release's file\n"
    assert FIND("9.9.8") is None  # another release's wheel is not this one's


def test_without_a_wheel_the_copy_beside_the_checkout_is_read(nowhere):
    copy = vllm_files.shared_file("9.9.9")
    copy.parent.mkdir(parents=True)
    copy.write_text("# a copy\n")
    assert FIND("9.9.9") == copy


def test_where_neither_has_it_the_test_skips_saying_where_it_looked(nowhere, monkeypatch):
    monkeypatch.setattr(vllm_files, "batch_shard_file", FIND)
    mark = vllm_files.needs("9.9.9")
    assert mark.args == (True,)
    reason = mark.kwargs["reason"]
    assert "vllm-9.9.9-*.whl" in reason and str(nowhere / "wheels") in reason and "nox -s drift" in reason
    monkeypatch.setenv(vllm_files.REQUIRE, "1")
    with pytest.raises(RuntimeError, match="SHARDSPEC_REQUIRE_VLLM_FILES is set"):
        vllm_files.needs("9.9.9")
