"""Shot-consistent depth (models/adapters/shot_depth.py, ui/cli/cli_shot.py) on a generated shot with known depth
and a real-onnxruntime stand-in whose output drifts per frame (tests/builders_shot.py)."""

from __future__ import annotations

import gc
import json
import tracemalloc
import weakref

import numpy as np
import OpenEXR
import pytest
from builders_shot import background_mask, drifting_depth_model, shot_frame, write_shot
from lean_image_ai.models.adapters import da3, shot_depth
from lean_image_ai.models.base import RunOptions
from lean_image_ai.models.batch.frame_lists import FrameRef
from lean_image_ai.models.batch.sequence import BatchRun
from lean_image_ai.runtime.errors import LeanImageError
from lean_image_ai.ui.cli.main import main
from PIL import Image

FRAMES = 8


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return drifting_depth_model(tmp_path_factory.mktemp("shot") / "drift.onnx")


def frame_to_frame_change(frames, mask) -> float:
    """Mean per-pixel |frame - previous frame| over ``mask``."""
    return float(np.mean([np.abs(frames[i][mask] - frames[i - 1][mask]).mean() for i in range(1, len(frames))]))


def test_depth_range_text():
    assert shot_depth.parse_depth_range("auto-shot").mode == shot_depth.AUTO_SHOT
    assert shot_depth.parse_depth_range("Per-Frame").mode == shot_depth.PER_FRAME
    assert shot_depth.parse_depth_range("0.5:40").given == (0.5, 40.0)
    for bad in ("40:0.5", "1:1", "near:far", "1:2:3", "nan:1"):
        with pytest.raises(LeanImageError, match="A:B with A < B"):
            shot_depth.parse_depth_range(bad)


def test_robust_range_ignores_stray_pixels():
    depth = np.linspace(1.0, 2.0, 10000, dtype=np.float32).reshape(100, 100)
    depth[0, :5] = 1000.0  # five hot pixels
    low, high = shot_depth.robust_range(depth)
    assert 1.0 <= low < 1.02 and 1.98 < high <= 2.0


def _cli_depth(tmp_path, capsys, source, out, *options):
    code = main(["depth", str(source), str(out), "--model", str(options[0]), "--device", "cpu", *options[1:]])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out.strip().splitlines()[-1]), captured.out


def _greys(folder):
    frames = []
    for path in sorted(folder.glob("*.png")):
        with Image.open(path) as image:
            frames.append((np.asarray(image).astype(np.int64), dict(image.text)))
    return frames


def test_shot_range_keeps_a_static_region_grey(tmp_path, capsys, model):
    """The square comes closer over the shot: per-frame normalisation re-greys the still
    background every frame; one range for the shot keeps it exactly."""
    shot = write_shot(tmp_path / "in", FRAMES, noise=False)
    background = background_mask(FRAMES)
    per_frame, _ = _cli_depth(tmp_path, capsys, shot, tmp_path / "pf" / "d_####.png", model)
    auto, text = _cli_depth(tmp_path, capsys, shot, tmp_path / "as" / "d_####.png", model, "--depth-range", "auto-shot")
    assert "first pass: depth ranges only" in text and per_frame["written"] == auto["written"] == FRAMES
    assert "depth_range" not in per_frame  # the default run is unchanged
    low, high = auto["depth_range"]["range"]
    assert auto["depth_range"]["mode"] == "auto-shot" and low < high
    shot_greys = _greys(tmp_path / "as")
    frame_greys = _greys(tmp_path / "pf")
    assert len(shot_greys) == len(frame_greys) == FRAMES
    shot_spread = np.ptp([g[background] for g, _ in shot_greys], axis=0).max()
    frame_spread = np.ptp([g[background] for g, _ in frame_greys], axis=0).max()
    assert shot_spread == 0  # identical 16-bit levels in every frame
    assert frame_spread > 1000  # of 65535: the flicker the shot range removes
    for _, text_chunks in shot_greys:  # the range used, in every file
        assert text_chunks["lean_image_ai:depth_range"] == f"{low!r} {high!r}"
        assert text_chunks["lean_image_ai:depth_range_mode"] == "auto-shot"


def test_given_range_goes_into_exr_header_and_png(tmp_path, capsys, model):
    shot = write_shot(tmp_path / "in", 3, noise=False)
    summary, _ = _cli_depth(tmp_path, capsys, shot, tmp_path / "exr" / "d_####.exr", model, "--depth-range", "5:15")
    assert summary["depth_range"] == {"mode": "given", "range": [5.0, 15.0]}
    with OpenEXR.File(str(tmp_path / "exr" / "d_0002.exr")) as exr:
        assert exr.header()["lean_image_ai:depth_range"] == "5.0 15.0"
        raw = np.asarray(exr.channels()["Y"].pixels)
    assert raw.max() > 1.0  # EXR keeps the model's values; the range is only recorded
    _cli_depth(tmp_path, capsys, shot, tmp_path / "png" / "d_####.png", model, "--depth-range", "5:15")
    grey, chunks = _greys(tmp_path / "png")[1]  # frame 2, as the EXR
    expected = np.clip((raw - 5.0) / 10.0, 0, 1) * 65535
    assert chunks["lean_image_ai:depth_range"] == "5.0 15.0"
    assert np.abs(grey[3:-3, 3:-3] - expected[3:-3, 3:-3]).max() <= 1  # the given range, not the frame's


def test_bad_depth_range_fails_before_anything_is_written(tmp_path, capsys, model):
    shot = write_shot(tmp_path / "in", 2, noise=False)
    code = main(["depth", str(shot), str(tmp_path / "out" / "d_####.png"), "--model", str(model), "--depth-range", "far"])
    assert code == 2 and "A:B with A < B" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_auto_shot_is_refused_for_a_shard(tmp_path, capsys, model):
    shot = write_shot(tmp_path / "in", 4, noise=False)
    code = main(["depth", str(shot), str(tmp_path / "o"), "--model", str(model), "--depth-range", "auto-shot", "--shard", "1/2"])
    assert code == 2 and "--depth-range A:B" in capsys.readouterr().err


ALIGN_FACTOR = 20  # measured 60.8x on this shot (bench/shot_depth.py); asserted with margin


def test_alignment_steadies_the_background(model):
    """Per-frame scale/shift drift (0.96 depth units of change a frame on the background) is
    taken out by aligning each frame to the previous aligned one; the moving square is trimmed."""
    count = 24
    results = da3.run([shot_frame(i, count) for i in range(count)], model, process_res=84)
    raw = [r.depth for r in results]
    aligner = shot_depth.DepthAligner()
    aligned = [aligner(d)[0] for d in raw]
    background = background_mask(count)
    before, after = frame_to_frame_change(raw, background), frame_to_frame_change(aligned, background)
    assert before > ALIGN_FACTOR * after, (before, after)
    # and it keeps the first frame's scale: the background's level stays where frame 1 put it
    first = aligned[0][background].mean()
    assert max(abs(a[background].mean() - first) for a in aligned) < 0.1 * np.ptp(aligned[0][background])


def test_cli_align_depth_with_shot_range(tmp_path, capsys, model):
    shot = write_shot(tmp_path / "in", FRAMES, noise=True)
    summary, _ = _cli_depth(
        tmp_path, capsys, shot, tmp_path / "o" / "d_####.exr", model, "--depth-range", "auto-shot", "--align-depth"
    )
    assert summary["align_depth"] is True and summary["written"] == FRAMES
    frames = []
    for index in range(1, FRAMES + 1):
        with OpenEXR.File(str(tmp_path / "o" / f"d_{index:04d}.exr")) as exr:
            assert exr.header()["lean_image_ai:depth_aligned"] == "yes"
            frames.append(np.asarray(exr.channels()["Y"].pixels))
    unaligned = [da3.run(shot_frame(i, FRAMES), model).depth for i in range(FRAMES)]
    background = background_mask(FRAMES)
    assert frame_to_frame_change(unaligned, background) > ALIGN_FACTOR * frame_to_frame_change(frames, background)


@pytest.mark.parametrize("breaks", [["--skip-existing"], ["--shard", "1/2"]], ids=["skip-existing", "shard"])
def test_align_depth_refuses_what_would_restart_its_chain(tmp_path, capsys, model, breaks):
    """Aligning chains each frame to the one before: a resumed run (skipped frames, or frames
    another process claims) or a shard would restart it part-way, so it is refused up front."""
    shot = write_shot(tmp_path / "in", 3, noise=False)
    out = tmp_path / "o"
    code = main(["depth", str(shot), str(out / "d_####.exr"), "--model", str(model), "--align-depth", *breaks])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "Align Depth (--align-depth) aligns each frame to the one before it" in err, err
    assert "Run the whole shot in one job (Overwrite, --overwrite), or turn off Align Depth." in err
    assert not out.exists()


def test_preview_writes_one_frame(tmp_path, capsys, model):
    shot = write_shot(tmp_path / "in", 5, noise=False)
    summary, _ = _cli_depth(tmp_path, capsys, shot, tmp_path / "o" / "d_####.png", model, "--preview", "3")
    assert summary["preview"] == 3 and summary["frames"] == 1 and summary["written"] == 1
    assert [p.name for p in (tmp_path / "o").iterdir()] == ["d_0003.png"]
    code = main(["depth", str(shot), str(tmp_path / "p" / "d_####.png"), "--model", str(model), "--preview", "9"])
    assert code == 2 and "--preview 9: there is no such frame (frames 1-5)" in capsys.readouterr().err


NUMPY_TRACE_DOMAIN = 389047  # numpy reports its array buffers to tracemalloc under this domain


def _large_blocks(snapshot, size: int) -> int:
    """numpy array buffers of at least ``size`` bytes alive in ``snapshot``."""
    arrays = snapshot.filter_traces([tracemalloc.DomainFilter(True, NUMPY_TRACE_DOMAIN)])
    return sum(1 for trace in arrays.traces if trace.size >= size)


@pytest.mark.parametrize("align", [False, True])
def test_first_pass_keeps_no_frame(model, align, fresh_runtime):
    """The first pass keeps two floats a frame: after 200 frames no frame's depth array is alive
    and no more frame-sized memory blocks are held than after a 3-frame warm-up (the aligner's one
    previous frame aside)."""
    count = 200
    shot = shot_depth.ShotDepth(shot_depth.DepthRangeChoice(shot_depth.AUTO_SHOT), align=align)
    alive = []

    def record(ref, result):
        alive.append(weakref.ref(result.depth))
        shot.record(result.depth)

    def infer(frames, options):
        return da3.run(frames, model, options=options, process_res=84)

    refs = [FrameRef(n, None) for n in range(1, count + 1)]
    frame_bytes = shot_frame(0, count)[..., 0].size * 4  # one float32 depth map
    options = RunOptions(runtime=fresh_runtime)
    warm_up = shot_depth.ShotDepth(shot_depth.DepthRangeChoice(shot_depth.AUTO_SHOT))
    BatchRun(refs[:3], infer, lambda ref: shot_frame(0, count), lambda r, res: warm_up.record(res.depth), options=options).run()
    gc.collect()
    tracemalloc.start()
    try:
        before = _large_blocks(tracemalloc.take_snapshot(), frame_bytes // 2)
        report = BatchRun(refs, infer, lambda ref: shot_frame(ref.number - 1, count), record, options=options).run()
        gc.collect()
        after = _large_blocks(tracemalloc.take_snapshot(), frame_bytes // 2)
    finally:
        tracemalloc.stop()
    assert len(report.written) == count and shot.frames_recorded == count
    assert sum(r() is not None for r in alive) == 0
    assert after - before <= (1 if align else 0), (before, after)
    shot.finish_first_pass()
    low, high = shot.shot_range
    assert np.isfinite([low, high]).all() and low < high


def _pumped(batch) -> None:
    """As Blender runs a batch: the worker on a thread, this thread reading, writing, pumping."""
    import threading

    worker = threading.Thread(target=batch.infer_all)
    worker.start()
    try:
        while not batch.pump(0.05):
            pass
    finally:
        worker.join(30)
    assert not worker.is_alive()


def _two_pass(model, runtime, count, write, cancel, settings):
    from lean_image_ai.models.batch.shot_batch import TwoPassBatch

    refs = [FrameRef(n, None) for n in range(1, count + 1)]

    def make_pass(writer, extra, first_pass):
        def infer(frames, options):
            return da3.run(frames, model, options=options, process_res=84, **extra)

        return BatchRun(refs, infer, lambda ref: shot_frame(ref.number - 1, count, noise=False), writer,
                        options=RunOptions(runtime=runtime, cancel=cancel))

    return TwoPassBatch(settings, make_pass, write, cancel)


def test_two_pass_batch_pumped_like_blender(model, fresh_runtime):
    import threading

    from lean_image_ai.models.batch.shot_batch import ShotSettings

    settings = ShotSettings("da3", depth_range="auto-shot")
    written = []
    batch = _two_pass(model, fresh_runtime, 5, lambda ref, result: written.append(
        settings.depth_product(result.depth, ".png", frozenset())[0].value_range), threading.Event(), settings)
    _pumped(batch)
    assert batch.report.written == [1, 2, 3, 4, 5] and settings.depth.frames_recorded == 5
    assert len(set(written)) == 1 and written[0] == settings.depth.shot_range
    assert batch.shot_line.startswith("shot depth range: ")


def test_two_pass_batch_cancelled_in_its_first_pass_writes_nothing(model, fresh_runtime):
    import threading

    from lean_image_ai.models.batch.shot_batch import ShotSettings

    settings = ShotSettings("da3", depth_range="auto-shot")
    cancel = threading.Event()
    recorded = settings.record

    def record_then_cancel(ref, result):
        recorded(ref, result)
        if ref.number == 2:
            cancel.set()

    settings.record = record_then_cancel
    written = []
    batch = _two_pass(model, fresh_runtime, 6, lambda ref, result: written.append(ref), cancel, settings)
    _pumped(batch)
    assert batch.report.cancelled and not written and settings.depth.shot_range is None
