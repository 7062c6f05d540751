"""``python -m shardspec.conformance report`` reads regular files only and writes its pages only as regular
files of its folder: a page that is a link is refused, not written through, and a FIFO is not waited on."""

import os
import pathlib
import threading

from shardspec.conformance.report.html import main

DATA = pathlib.Path(__file__).resolve().parent / "data"


def test_a_page_that_is_a_link_is_not_written_through(tmp_path, capsys):
    target = tmp_path / "target.txt"
    target.write_text("not ours\n")
    out = tmp_path / "html"
    out.mkdir()
    (out / "index.html").symlink_to(target)
    assert main([str(DATA / "run-v2.json"), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "index.html is a symbolic link" in err, err
    assert target.read_text() == "not ours\n" and (out / "index.html").is_symlink()


def test_a_report_that_is_a_fifo_is_refused(tmp_path, capsys):
    fifo = tmp_path / "r.json"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR)  # the code before the change waited for a writer's end...
    os.write(writer, b"{}")
    closing = threading.Timer(5, os.close, (writer,))  # ...which comes after a while, not for ever
    closing.start()
    try:
        assert main([str(fifo), "-o", str(tmp_path / "html")]) == 2
    finally:
        closing.join()
    assert f"{fifo}: is a FIFO, not a regular file" in capsys.readouterr().err


def test_pages_are_written_again_over_earlier_pages(tmp_path):
    out = tmp_path / "html"
    assert main([str(DATA / "run-v2.json"), "-o", str(out)]) == 0
    assert main([str(DATA / "run-v2.json"), "-o", str(out)]) == 0
    assert (out / "index.html").is_file() and not (out / "index.html").is_symlink()


def test_a_plot_is_not_copied_through_a_link(tmp_path):
    import pytest
    from png import tiny_png

    from shardspec.conformance.report.bench import load_bench
    from shardspec.conformance.report.model import ReportError

    results = tmp_path / "results"
    results.mkdir()
    (results / "step.png").write_bytes(tiny_png(5, 2))
    target = tmp_path / "target.txt"
    target.write_text("not ours\n")
    (tmp_path / "site" / "bench").mkdir(parents=True)
    (tmp_path / "site" / "bench" / "step.png").symlink_to(target)
    with pytest.raises(ReportError, match="is a symbolic link"):
        load_bench([str(results)], tmp_path / "site")
    assert target.read_text() == "not ours\n"
