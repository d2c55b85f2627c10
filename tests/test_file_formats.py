"""models/file_formats.py: every format a message suggests is one that front-end then accepts.

Before the table, Blender's cut-out error suggested .webp, which Blender's own output check then
refused; these checks would catch that for any row added later.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from lean_image_ai.models import file_formats
from lean_image_ai.models.batch import image_files
from lean_image_ai.models.outputs import OutputPolicy
from lean_image_ai.runtime.errors import LeanImageError

WRITERS = (file_formats.COMMAND_LINE, file_formats.BLENDER_WRITER)


def suggested(message: str) -> list[str]:
    return re.findall(r"\.[a-z0-9]+(?=[ ,.]|$)", message.split("Use ", 1)[1])


@pytest.mark.parametrize("writer", WRITERS, ids=lambda w: w.name)
def test_a_cut_out_to_a_file_without_alpha_suggests_only_what_that_front_end_writes_with_alpha(writer):
    with pytest.raises(LeanImageError) as refused:
        OutputPolicy.of("ben2", writer).check(Path("matte.jpg"))
    names = suggested(str(refused.value))
    assert names
    if writer is file_formats.BLENDER_WRITER:
        assert names == [".png", ".exr", ".tif"]  # not .webp: Blender's output check refuses it
    for suffix in names:
        assert writer.writes(suffix) and file_formats.find(suffix).alpha, suffix
        OutputPolicy.of("ben2", writer).check(Path(f"matte{suffix}"))  # accepted: no error


def test_every_format_the_command_line_suggests_it_can_write(tmp_path):
    with pytest.raises(image_files.ImageFileError) as refused:
        image_files.check_writable_format(tmp_path / "out.xyz")
    names = suggested(str(refused.value))
    assert names == [row.suffixes[0] for row in file_formats.FORMATS if row.image and row.writers & {"Pillow", "OpenEXR"}]
    for suffix in names:
        image_files.check_writable_format(tmp_path / f"out{suffix}")  # no error: Pillow or OpenEXR writes it


def test_blender_writes_exactly_the_rows_that_name_it():
    blender_rows = [row for row in file_formats.FORMATS if file_formats.BLENDER in row.writers]
    assert {s for row in blender_rows for s in row.suffixes} == {".png", ".exr", ".jpg", ".jpeg", ".tif", ".tiff"}
    assert all(row.blender_format for row in blender_rows)
    assert not file_formats.BLENDER_WRITER.writes(".webp") and file_formats.COMMAND_LINE.writes(".webp")
    assert file_formats.BLENDER_WRITER.writes(".ply")  # the add-on's own data files, for either front-end
    # Blender's TIFF writer is 8/16-bit: only the command line keeps float depth in a TIFF
    assert ".tif" in file_formats.COMMAND_LINE.float_suffixes
    assert ".tif" not in file_formats.BLENDER_WRITER.float_suffixes


def test_a_geometry_result_takes_only_its_mesh_format_and_names_its_companions():
    with pytest.raises(LeanImageError, match=r"Cannot write geometry to 'scene.png': give a \.ply mesh file"):
        OutputPolicy.of("moge2").check(Path("scene.png"))
    assert [p.name for p in OutputPolicy.of("moge2").companion_paths(Path("/out/scene.ply"))] == [
        "scene.ply",
        "scene.json",
        "scene_normal.exr",
    ]
