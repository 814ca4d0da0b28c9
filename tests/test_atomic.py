"""minitf.atomic: what a write may replace. Only a regular file: a FIFO, a socket (or a device; the tests make
no device node, a FIFO takes its place) at the path is refused in one line naming it and left as it was, with
nothing written; a symbolic link is written through (its target replaced atomically, the link kept). The
writers on top (write_atomic, write_json_atomic, pretrained.write_weights/write_json) and ``minitf.inspect
--out`` all go through ``atomic_writer``."""
import json
import os
import socket
import stat

import pytest

from minitf import atomic
from minitf.inspect import main as inspect_main
from minitf.training.files import write_json_atomic


def fifo(tmp_path, name="pipe"):
    path = tmp_path / name
    os.mkfifo(path)
    return path


def refused(path, write, kind):
    """``write()`` raises the one-line refusal naming ``path`` and ``kind``; nothing is written beside it."""
    before = sorted(p.name for p in path.parent.iterdir())
    with pytest.raises(ValueError) as error:
        write()
    assert str(error.value) == f"{path} is {kind}, not a regular file; give a file path"
    assert isinstance(error.value, OSError) and error.value.filename == str(path)  # callers that catch OSError
    assert sorted(p.name for p in path.parent.iterdir()) == before  # no temp file left


@pytest.mark.parametrize("writer", ["write_atomic", "atomic_writer", "write_json_atomic"])
def test_a_fifo_or_socket_is_refused_and_left_as_it_was(tmp_path, writer):
    def write(path):
        if writer == "write_atomic":
            atomic.write_atomic(path, "text")
        elif writer == "write_json_atomic":
            write_json_atomic(path, {"a": 1})
        else:
            with atomic.atomic_writer(path) as handle:
                handle.write(b"bytes")

    pipe = fifo(tmp_path)
    refused(pipe, lambda: write(pipe), "a FIFO (named pipe)")
    assert stat.S_ISFIFO(os.lstat(pipe).st_mode)
    with socket.socket(socket.AF_UNIX) as server:
        sock = tmp_path / "sock"
        server.bind(str(sock))
        refused(sock, lambda: write(sock), "a socket")
        assert stat.S_ISSOCK(os.lstat(sock).st_mode)
    link = tmp_path / "to-pipe"
    link.symlink_to(pipe.name)
    refused(pipe, lambda: write(link), "a FIFO (named pipe)")  # named as what the link leads to
    assert link.is_symlink() and stat.S_ISFIFO(os.lstat(pipe).st_mode)


def test_a_symbolic_link_is_written_through_and_kept(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "links").mkdir()
    target = tmp_path / "real" / "page.html"
    target.write_text("old")
    link = tmp_path / "links" / "page.html"
    link.symlink_to(os.path.join("..", "real", "page.html"))  # relative, into another folder
    chain = tmp_path / "links" / "again.html"
    chain.symlink_to("page.html")

    atomic.write_atomic(link, "new")
    assert link.is_symlink() and os.readlink(link) == os.path.join("..", "real", "page.html")
    assert target.read_text() == "new" and not target.is_symlink()
    atomic.write_atomic(chain, "newer")  # a link to a link: the file at the end
    assert chain.is_symlink() and link.is_symlink() and target.read_text() == "newer"
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["page.html"]  # no temp file in either
    assert sorted(p.name for p in (tmp_path / "links").iterdir()) == ["again.html", "page.html"]

    dangling = tmp_path / "links" / "new.json"
    dangling.symlink_to(os.path.join("..", "real", "made.json"))
    write_json_atomic(dangling, {"b": 2})  # a link to nothing: the file it names is made
    assert dangling.is_symlink() and json.loads((tmp_path / "real" / "made.json").read_text()) == {"b": 2}


def test_a_folder_is_still_not_replaced(tmp_path):
    (tmp_path / "folder").mkdir()
    with pytest.raises(IsADirectoryError):
        atomic.write_atomic(tmp_path / "folder", "text")
    assert (tmp_path / "folder").is_dir() and [p.name for p in tmp_path.iterdir()] == ["folder"]


def test_inspect_refuses_a_fifo_out_in_one_line_before_reading_the_model(tmp_path, capsys):
    pipe = fifo(tmp_path)
    code = inspect_main(["--checkpoint", str(tmp_path / "no-model"), "--text", "a b", "--out", str(pipe)])
    err = capsys.readouterr().err
    assert code != 0 and err == (f"minitf.inspect: error: {pipe} is a FIFO (named pipe), not a regular file; "
                                 "give a file path\n"), err  # said before the missing model
    assert stat.S_ISFIFO(os.lstat(pipe).st_mode) and sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


def test_a_written_file_has_the_mode_of_the_file_it_replaces_or_the_umasks(tmp_path):
    old_umask = os.umask(0o027)
    try:
        atomic.write_atomic(tmp_path / "new.txt", "a")  # not mkstemp's 0600: what open() would give
        assert stat.S_IMODE(os.stat(tmp_path / "new.txt").st_mode) == 0o640
        kept = tmp_path / "kept.txt"
        kept.write_text("old")
        os.chmod(kept, 0o604)
        (tmp_path / "link").symlink_to("kept.txt")
        atomic.write_atomic(kept, "b")
        atomic.write_atomic(tmp_path / "link", "c")
        assert stat.S_IMODE(os.stat(kept).st_mode) == 0o604 and kept.read_text() == "c"
    finally:
        os.umask(old_umask)
