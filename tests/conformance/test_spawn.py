"""Starting groups of ranks: the rank server forks every group from one preloaded process."""

import json
import os
import signal
import subprocess
import sys
import time

from shardspec.conformance.harness.spawn import RankServer


def _server(tmp_path):
    return RankServer("rank_probe", [], dict(os.environ), tmp_path / "server.log")


def _ranks(folder, world_size):
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(world_size)]


def test_groups_of_any_size_are_forked_from_one_preloaded_server(tmp_path, plugins_on_path):
    server = _server(tmp_path)
    try:
        for world_size in (3, 2):
            folder = tmp_path / f"group{world_size}"
            folder.mkdir()
            group = server.start(world_size, [str(folder), "-1"], tmp_path / f"group{world_size}.log")
            assert group.wait(timeout=60) == 0
            ranks = _ranks(folder, world_size)
            assert [int(r["RANK"]) for r in ranks] == list(range(world_size))
            assert {r["WORLD_SIZE"] for r in ranks} == {str(world_size)}
            assert len({r["MASTER_PORT"] for r in ranks}) == 1
            assert {tuple(r["preloaded_by"]) for r in ranks} == {(server.proc.pid,)}
    finally:
        server.close()
    assert not server.alive


def test_a_failing_rank_stops_its_peers_and_gives_the_status(tmp_path, plugins_on_path):
    server = _server(tmp_path)
    try:
        group = server.start(3, [str(tmp_path), "1"], tmp_path / "group.log")
        assert group.wait(timeout=20) == 3  # the peers sleep 30 s unless stopped
        assert server.alive  # ready for the next launch
    finally:
        server.close()


def test_killing_a_group_ends_its_ranks_and_the_server_serves_the_next(tmp_path, plugins_on_path):
    server = _server(tmp_path)
    try:
        first = tmp_path / "first"
        first.mkdir()
        group = server.start(2, [str(first), "5"], tmp_path / "first.log")  # no rank fails: both sleep 30 s
        while len(list(first.glob("rank*.json"))) < 2:
            time.sleep(0.05)
        started = time.monotonic()
        group.kill()
        assert time.monotonic() - started < 5 and group.returncode == -signal.SIGKILL and group.culprit is None
        assert server.alive
        second = tmp_path / "second"
        second.mkdir()
        assert server.start(2, [str(second), "-1"], tmp_path / "second.log").wait(timeout=20) == 0
        assert {tuple(r["preloaded_by"]) for r in _ranks(second, 2)} == {(server.proc.pid,)}
    finally:
        server.close()


def test_processes_mode_starts_every_rank_and_reports_a_failure(tmp_path, plugins_on_path):
    command = [sys.executable, "-m", "shardspec.conformance.harness.spawn", "2", "rank_probe", str(tmp_path)]
    assert subprocess.run(command + ["-1"], timeout=60).returncode == 0
    assert [int(r["RANK"]) for r in _ranks(tmp_path, 2)] == [0, 1]
    assert subprocess.run(command + ["0"], timeout=20).returncode == 3
