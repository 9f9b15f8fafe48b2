"""Files and directories written whole or not at all (`mathrl_jax.files`): a failed write leaves the old one and
no temporary behind, concurrent writers of one path never clash, and what is written takes the umask."""

import os
import stat
import threading

import pytest

from mathrl_jax import files


class Planted(Exception):
    pass


def test_a_failed_write_leaves_the_old_file_and_nothing_else(tmp_path):
    path = tmp_path / "record.json"
    files.write_json(str(path), {"a": 1})
    with pytest.raises(Planted):
        with files.atomic_write(str(path)) as f:
            f.write('{"a": 2, "half')
            raise Planted
    assert path.read_text() == '{"a": 1}'
    assert os.listdir(tmp_path) == ["record.json"]


def test_concurrent_writers_of_one_path_each_write_whole(tmp_path):
    path = str(tmp_path / "samples.jsonl")
    texts = [f"{i}\n" * 20000 for i in range(8)]
    barrier = threading.Barrier(len(texts))
    errors = []

    def write(text):
        try:
            with files.atomic_write(path) as f:
                barrier.wait()  # all open at once (a fixed ".tmp" name made them clash)
                f.write(text)
        except Exception as error:  # noqa: BLE001 (reported below)
            errors.append(error)

    threads = [threading.Thread(target=write, args=(t,)) for t in texts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert open(path).read() in texts
    assert os.listdir(tmp_path) == ["samples.jsonl"]


def test_what_is_written_takes_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        files.write_json(str(tmp_path / "f.json"), [])
        files.write_directory(str(tmp_path / "d"), lambda d: open(os.path.join(d, "x"), "w").close())
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "f.json").st_mode) == 0o640
    assert stat.S_IMODE(os.stat(tmp_path / "d").st_mode) == 0o750


def test_a_directory_is_replaced_whole_or_kept(tmp_path):
    target = tmp_path / "model"
    files.write_directory(str(target), lambda d: open(os.path.join(d, "v1"), "w").close())
    files.write_directory(str(target), lambda d: open(os.path.join(d, "v2"), "w").close())
    assert os.listdir(target) == ["v2"]

    def half_then_fail(d):
        open(os.path.join(d, "v3"), "w").close()
        raise Planted

    with pytest.raises(Planted):
        files.write_directory(str(target), half_then_fail)
    assert os.listdir(target) == ["v2"]

    def refuse(existing):
        raise Planted(existing)

    with pytest.raises(Planted):
        files.write_directory(str(target), lambda d: None, check_existing=refuse)
    assert os.listdir(target) == ["v2"] and os.listdir(tmp_path) == ["model"]


def test_a_killed_writers_temporaries_are_removed_by_the_next_writer(tmp_path):
    """A writer killed mid-write leaves its temporary (a whole model's copy for an export); the next writer of that
    name removes it, and never a live writer's."""
    import socket
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host = socket.gethostname()
    stale_dir = tmp_path / f".model.{host}.{int(dead.stdout)}.{'a' * 12}.tmp"
    stale_dir.mkdir()
    (stale_dir / "model.safetensors").write_bytes(b"half")
    stale_file = tmp_path / f".record.json.{host}.{int(dead.stdout)}.{'b' * 12}.tmp"
    stale_file.write_text("{")
    live = tmp_path / f".model.{host}.{os.getpid()}.{'c' * 12}.tmp"
    live.mkdir()
    files.write_directory(str(tmp_path / "model"), lambda d: open(os.path.join(d, "v1"), "w").close())
    files.write_json(str(tmp_path / "record.json"), {"a": 1})
    assert sorted(os.listdir(tmp_path)) == sorted([live.name, "model", "record.json"])
