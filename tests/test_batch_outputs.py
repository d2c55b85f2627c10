"""Process Sequence (real bpy 5.0.1, real onnxruntime): default outputs beside the input folder,
re-runs that do what they say, and the output type following the input (#22 items 1 and 4)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image as PILImage

sys.path.insert(0, str(Path(__file__).parent))
import blender_helpers as bh  # noqa: E402

bpy = pytest.importorskip("bpy")
bh.import_package()

from builders_families import da3_like_model  # noqa: E402
from lean_image_ai.models.adapters import upscale  # noqa: E402
from lean_image_ai.models.batch import image_files  # noqa: E402
from lean_image_ai.operators import batch_ops, jobs, model_job  # noqa: E402

BICUBIC = str(upscale.DEFAULT_MODEL_PATH)  # the embedded x2: a flat image stays flat


@pytest.fixture(scope="module", autouse=True)
def registered():
    with bh.registered_classes([*jobs.classes, *batch_ops.classes]):
        yield


@pytest.fixture(autouse=True)
def clean(tmp_path, monkeypatch):
    yield from bh.fresh_blender(tmp_path, monkeypatch, make_models_dir=False)


def write_frames(folder: Path, numbers) -> Path:
    folder.mkdir(parents=True)
    for n in numbers:
        rgb = (np.random.default_rng(n).random((12, 16, 3)) * 255).astype(np.uint8)
        PILImage.fromarray(rgb).save(folder / f"plate_{n}.png")
    return folder


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_folder_run_three_times_leaves_one_output_per_frame_beside_it(tmp_path):
    frames = write_frames(tmp_path / "plates", [1001, 1002, 1003])
    expected = [f"plate_upscaled_{n}.png" for n in (1001, 1002, 1003)]
    for flags in ({}, {"skip_existing": True}, {"overwrite": True}):
        result = bpy.ops.lean_image_ai.process_sequence(family="upscale", source=str(frames), model_path=BICUBIC, **flags)
        assert result == {"FINISHED"}, flags
        assert listing(tmp_path / "plates_upscaled") == expected, flags
        assert listing(frames) == ["plate_1001.png", "plate_1002.png", "plate_1003.png"], flags
    assert listing(tmp_path) == ["plates", "plates_upscaled"]


def test_saving_into_the_input_folder_never_takes_results_for_frames(tmp_path):
    frames = write_frames(tmp_path / "in", [1, 2])
    for flags in ({}, {"skip_existing": True}, {"overwrite": True}):
        result = bpy.ops.lean_image_ai.process_sequence(
            family="upscale", source=str(frames), output=str(frames) + "/", model_path=BICUBIC, **flags
        )
        assert result == {"FINISHED"}, flags
    assert listing(frames) == ["plate_1.png", "plate_2.png", "plate_upscaled_0001.png", "plate_upscaled_0002.png"]


def test_sixteen_bit_frames_give_sixteen_bit_pngs(tmp_path):
    folder = tmp_path / "deep"
    folder.mkdir()
    flat = np.full((10, 12, 3), 40000, np.uint16)  # 8 bits would give 156 * 257 = 40092
    for n in (1, 2):
        (folder / f"d_{n:04d}.png").write_bytes(image_files.png16_bytes(flat))
    assert bpy.ops.lean_image_ai.process_sequence(family="upscale", source=str(folder), model_path=BICUBIC) == {"FINISHED"}
    result = image_files.read_image(tmp_path / "deep_upscaled" / "d_upscaled_0001.png")
    assert result.dtype == np.uint16 and result.shape[:2] == (20, 24)
    assert np.abs(result[..., :3].astype(int) - 40000).max() <= 8  # through Blender's linear float buffer


def test_exr_frames_give_float_exrs_and_depth_stays_exr(tmp_path):
    import OpenEXR

    folder = tmp_path / "exr"
    folder.mkdir()
    pixels = np.full((10, 12, 4), 0.3, np.float32)
    pixels[..., 3] = 1.0
    header = {"compression": OpenEXR.ZIP_COMPRESSION, "type": OpenEXR.scanlineimage}
    for n in (1, 2):
        with OpenEXR.File(header, {"RGBA": pixels}) as exr:
            exr.write(str(folder / f"e_{n:04d}.exr"))
    assert bpy.ops.lean_image_ai.process_sequence(family="upscale", source=str(folder), model_path=BICUBIC) == {"FINISHED"}
    assert listing(tmp_path / "exr_upscaled") == ["e_upscaled_0001.exr", "e_upscaled_0002.exr"]
    with OpenEXR.File(str(tmp_path / "exr_upscaled" / "e_upscaled_0001.exr")) as exr:
        channels = exr.channels()
        rgb = channels["RGBA"].pixels[..., :3] if "RGBA" in channels else channels["RGB"].pixels
    np.testing.assert_allclose(rgb, 0.3, atol=2e-3)  # linear float kept, not an 8-bit step (1/255)
    model = da3_like_model(tmp_path / "da3.onnx", fixed_hw=None)
    assert bpy.ops.lean_image_ai.process_sequence(family="da3", source=str(folder), model_path=str(model)) == {"FINISHED"}
    assert listing(tmp_path / "exr_depth") == ["e_depth_0001.exr", "e_depth_0002.exr"]


def test_the_farm_script_without_output_keeps_exr_plates_float_beside_them(tmp_path):
    import subprocess

    import OpenEXR

    folder = tmp_path / "plates"
    folder.mkdir()
    header = {"compression": OpenEXR.ZIP_COMPRESSION, "type": OpenEXR.scanlineimage}
    for n in (1001, 1002):
        with OpenEXR.File(header, {"RGB": np.full((8, 10, 3), 0.5, np.float32)}) as exr:
            exr.write(str(folder / f"plate_{n}.exr"))
    script = Path(__file__).resolve().parent.parent / "examples" / "farm_sequence.py"
    code = (  # bpy as a module stands in for `blender --background --python farm_sequence.py -- ...`
        "import runpy, sys\n"
        f"sys.argv = ['blender', '--', 'upscale', {str(folder / 'plate_####.exr')!r}, '--model-path', {BICUBIC!r}]\n"
        f"runpy.run_path({str(script)!r}, run_name='__main__')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert listing(tmp_path / "plates_upscaled") == ["plate_upscaled_1001.exr", "plate_upscaled_1002.exr"]


def test_frames_are_turned_upright_and_a_multi_page_tiff_warns(tmp_path):
    from PIL import Image

    folder = tmp_path / "phone"
    folder.mkdir()
    stored = np.zeros((12, 20, 3), np.uint8)
    stored[:3] = 255  # a white band along the stored top edge
    image = Image.fromarray(stored)
    exif = image.getexif()
    exif[0x0112] = 6  # displayed turned a quarter right, as a phone's portrait photo
    image.save(folder / "p_0001.png", exif=exif.tobytes())
    assert bpy.ops.lean_image_ai.process_sequence(family="upscale", source=str(folder), model_path=BICUBIC) == {"FINISHED"}
    with PILImage.open(tmp_path / "phone_upscaled" / "p_upscaled_0001.png") as result:
        upright = np.asarray(result.convert("RGB"))
    assert upright.shape[:2] == (40, 24)  # upright: 12x20 stored, shown 20 high and 12 wide, x2
    assert upright[:, -4:].min() > 200 and upright[:, :-8].max() < 50  # the band is on the right
    pages = tmp_path / "pages"
    pages.mkdir()
    frames = [Image.new("RGB", (8, 6), colour) for colour in ("red", "green")]
    frames[0].save(pages / "t_0001.tif", save_all=True, append_images=frames[1:])
    assert bpy.ops.lean_image_ai.process_sequence(family="upscale", source=str(pages), model_path=BICUBIC) == {"FINISHED"}
    assert (tmp_path / "pages_upscaled" / "t_upscaled_0001.png").is_file()
    from lean_image_ai.models.batch.frame_lists import FrameRef

    warnings = []  # what the operator's report gets for that frame
    first = model_job.read_frame(FrameRef(1, pages / "t_0001.tif"), warnings.append)
    assert warnings == ["t_0001.tif has 2 pages; the first (the main image by TIFF convention) was used."]
    assert first.dtype == np.uint8 and tuple(first[0, 0, :3]) == (255, 0, 0)


def test_a_sixteen_bit_tiff_from_blender_reads_with_all_its_bits_on_the_command_line(tmp_path):
    # Blender writes 16-bit TIFF (premultiplied, "RGBa") from a float buffer; Pillow alone keeps 8 bits
    straight = np.zeros((4, 6, 4), np.float32)
    straight[..., 0] = np.linspace(0.1, 0.9, 6)[None, :]
    straight[..., 1] = 0.123456
    straight[..., 2] = 0.5
    straight[..., 3] = np.where(np.arange(6) < 3, 1.0, 0.5)[None, :]
    image = bpy.data.images.new("deep", 6, 4, alpha=True, float_buffer=True, is_data=True)
    try:
        premultiplied = straight.copy()
        premultiplied[..., :3] *= premultiplied[..., 3:]
        image.pixels.foreach_set(premultiplied[::-1].ravel())  # Blender's rows go bottom-up
        image.file_format = "TIFF"
        image.save(filepath=str(tmp_path / "deep.tif"), save_copy=True)
    finally:
        bpy.data.images.remove(image)
    read = image_files.read_image(tmp_path / "deep.tif")
    assert read.dtype == np.uint16 and read.shape == (4, 6, 4)
    assert image_files.input_kind(tmp_path / "deep.tif") == "16-bit"
    np.testing.assert_allclose(read / 65535.0, straight, atol=3 / 65535)  # 8 bits would be 1/255 off
