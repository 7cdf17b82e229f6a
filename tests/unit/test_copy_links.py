"""``tpudash copy`` never writes through a symbolic link at ``DEST/<run id>`` or inside it (issue 38, item 9).

Before, a link left at ``DEST/<run id>`` (or at one of its folders, or at
a file's name) took the copy wherever it pointed. Now the copy is refused,
exit 2, naming the link, and nothing is written where it points. The runs
directory DEST itself may be a link: that is where the user keeps runs.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jobs.events import Metric, RunFinished, RunStarted
from tpudash.cli import main as cli
from tpudash.runs.store import RunStore
from tpudash.runs.transfer import copy_run

RUN_ID = "20260101-000000-fit-abcdef"


def record_run(runs_dir: Path) -> None:
    recorder = RunStore(runs_dir).create(RUN_ID, "fit", {"epochs": 1}, {"kind": "CPU"})
    recorder.record(RunStarted(RUN_ID, "fit", {"epochs": 1}, {"kind": "CPU"}, 1.0))
    recorder.record(Metric("loss", 0.5, step=0))
    recorder.record(RunFinished(status="done", summary={}))
    (runs_dir / RUN_ID / "tensorboard").mkdir()
    (runs_dir / RUN_ID / "tensorboard" / "scalars.tfevents").write_bytes(b"\x00" * 10)


@pytest.fixture
def elsewhere(tmp_path) -> Path:
    """Where a link points: nothing of the copy may land here."""
    place = tmp_path / "elsewhere"
    place.mkdir()
    return place


def written_under(place: Path) -> list[str]:
    return sorted(str(path.relative_to(place)) for path in place.rglob("*"))


def test_a_link_at_dest_run_id_is_refused_naming_it_and_nothing_lands_where_it_points(
    isolated_runs_dir, tmp_path, elsewhere, capsys
):
    record_run(isolated_runs_dir)
    destination = tmp_path / "dest"
    destination.mkdir()
    (destination / RUN_ID).symlink_to(elsewhere, target_is_directory=True)

    assert cli.main(["copy", RUN_ID, str(destination)]) == 2

    refusal = capsys.readouterr().err
    assert f"DEST: cannot copy {RUN_ID}: {destination / RUN_ID}: a symbolic link" in refusal
    assert "never writes through one" in refusal
    assert written_under(elsewhere) == []


@pytest.mark.parametrize("inside", ["tensorboard", "events.jsonl", "run.json"])
def test_a_link_inside_dest_run_id_is_refused_before_anything_is_written(
    isolated_runs_dir, tmp_path, elsewhere, capsys, inside
):
    record_run(isolated_runs_dir)
    target = tmp_path / "dest" / RUN_ID
    target.mkdir(parents=True)
    pointed = elsewhere / "pointed"
    if inside == "tensorboard":
        pointed.mkdir()
    else:
        pointed.write_text("the user's own file\n")
    (target / inside).symlink_to(pointed)

    assert cli.main(["copy", RUN_ID, str(tmp_path / "dest")]) == 2

    assert f"{target / inside}: a symbolic link" in capsys.readouterr().err
    assert (target / inside).is_symlink()  # neither written through nor replaced
    assert written_under(elsewhere) == ["pointed"]
    assert pointed.is_dir() or pointed.read_text() == "the user's own file\n"
    assert sorted(os.listdir(target)) == [inside]  # refused before any file was written


def test_a_dangling_link_at_dest_run_id_is_refused_too(isolated_runs_dir, tmp_path, capsys):
    record_run(isolated_runs_dir)
    destination = tmp_path / "dest"
    destination.mkdir()
    (destination / RUN_ID).symlink_to(tmp_path / "not-yet")

    assert cli.main(["copy", RUN_ID, str(destination)]) == 2

    assert f"{destination / RUN_ID}: a symbolic link" in capsys.readouterr().err
    assert not (tmp_path / "not-yet").exists()


def test_a_runs_directory_that_is_itself_a_link_is_copied_into(isolated_runs_dir, tmp_path, elsewhere, capsys):
    record_run(isolated_runs_dir)
    (tmp_path / "dest").symlink_to(elsewhere, target_is_directory=True)  # the user's runs live on a bigger disk

    assert cli.main(["copy", RUN_ID, str(tmp_path / "dest")]) == 0

    assert f"copied {RUN_ID}" in capsys.readouterr().out
    copied = RunStore(elsewhere).load(RUN_ID)
    assert copied.info.status == "done" and copied.info.final_metrics == {"loss": 0.5}
    assert (elsewhere / RUN_ID / "tensorboard" / "scalars.tfevents").read_bytes() == b"\x00" * 10


def test_a_link_put_in_while_the_copy_writes_is_not_written_through(tmp_path, elsewhere):
    """The check before writing is not all: each file is written through descriptors that follow no link."""
    from tpudash.runs.transfer import LinkInTheWay, write_without_links

    run_dir = tmp_path / "dest" / RUN_ID
    run_dir.mkdir(parents=True)
    (run_dir / "events").symlink_to(elsewhere, target_is_directory=True)

    with pytest.raises(LinkInTheWay) as refused:
        write_without_links(run_dir, "events/w-00000001.jsonl", b"{}\n")

    assert refused.value.path == run_dir / "events"
    assert written_under(elsewhere) == []


def test_copying_again_over_a_real_copy_still_works(tmp_path):
    source, destination = RunStore(tmp_path / "runs"), RunStore(tmp_path / "dest")
    record_run(source.root)  # type: ignore[arg-type]

    first = copy_run(source, RUN_ID, destination)
    (tmp_path / "runs" / RUN_ID / "tensorboard" / "more.tfevents").write_bytes(b"\x01")
    again = copy_run(source, RUN_ID, destination)

    assert first.copied == 3 and again.copied == 1 and again.skipped == 3
    assert (tmp_path / "dest" / RUN_ID / "tensorboard" / "more.tfevents").read_bytes() == b"\x01"
    assert not [name for name in os.listdir(tmp_path / "dest" / RUN_ID) if name.endswith(".tmp")]
