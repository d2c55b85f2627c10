"""models/adapters/resampling.py against the libraries it reproduces: OpenCV (DA3's input), Pillow
(BEN2's input) and torch's F.interpolate (MoGe-2's input and outputs, BEN2's matte).

OpenCV and torch come with the `reference` extra (dlr-moge needs both); Pillow with `dev`."""

import numpy as np
import pytest
from lean_image_ai.models.adapters import resampling

# shrinking and enlarging by integer and fractional factors, one side at a time, and the
# adapters' own sizes (DA3's 280x504, BEN2's 1024²)
SIZES = [(66, 87), (48, 65), (146, 218), (97, 124), (110, 131), (280, 504), (200, 100), (1, 3)]


def picture(h=97, w=131, seed=0):
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    smooth = np.stack([xx / w, yy / h, ((xx * 3 + yy) % 11) / 10.0], axis=2) * 255
    # smooth ramps (where rounding ties happen) and noise (where edges and weights show)
    return np.clip(0.6 * smooth + 0.4 * rng.integers(0, 256, (h, w, 3)), 0, 255).astype(np.uint8)


def levels(a, b) -> np.ndarray:
    return np.abs(a.astype(np.int64) - b.astype(np.int64))


@pytest.mark.parametrize("size", SIZES)
def test_cv2_area_and_cubic_within_one_level_of_opencv_on_uint8(size):
    cv2 = pytest.importorskip("cv2")
    image = picture()
    h, w = size
    cubic = levels(
        resampling.cv2_resize(image, size, "cubic"), cv2.resize(image, (w, h), interpolation=cv2.INTER_CUBIC)
    )
    # the wheels' cubic on uint8 is Intel IPP's (float): a rare last-level difference (OpenCV's own
    # code, without IPP, sums 11-bit fixed-point coefficients: a level off in ~4 % of the pixels)
    assert cubic.max() <= 1 and cubic.mean() < 1e-3
    if h <= image.shape[0] and w <= image.shape[1]:
        area = levels(
            resampling.cv2_resize(image, size, "area"),
            cv2.resize(image, (w, h), interpolation=cv2.INTER_AREA),
        )
        assert area.max() <= 1 and area.mean() < 1e-2


@pytest.mark.parametrize(
    "source,size", [((97, 131), (66, 87)), ((97, 131), (48, 65)), ((360, 640), (284, 504))]
)
def test_cv2_area_is_opencvs_to_the_level_on_uint8_at_fractional_factors(source, size):
    """OpenCV sums each row's taps first, then the rows, in float32: the same order and weights
    give its very levels (360x640 -> 284x504 is DA3's first step on a 640x360 photo)."""
    cv2 = pytest.importorskip("cv2")
    image = picture(*source, seed=3)
    expected = cv2.resize(image, (size[1], size[0]), interpolation=cv2.INTER_AREA)
    np.testing.assert_array_equal(resampling.cv2_resize(image, size, "area"), expected)


def test_cv2_area_matches_opencv_exactly_on_a_halving():
    cv2 = pytest.importorskip("cv2")
    image = picture(98, 132, seed=1)
    ours = resampling.cv2_resize(image, (49, 66), "area")
    # OpenCV's integer-factor path rounds halves up: a 2x2 mean of 1, 2, 2, 2 is 2
    np.testing.assert_array_equal(ours, cv2.resize(image, (66, 49), interpolation=cv2.INTER_AREA))
    block = np.array([[1, 2], [2, 2]], np.uint8)[:, :, None]
    assert resampling.cv2_resize(block, (1, 1), "area")[0, 0, 0] == 2


def test_cv2_float_images_stay_float_with_the_same_weights():
    cv2 = pytest.importorskip("cv2")
    image = picture().astype(np.float32) / 255.0
    for interpolation, flag in (("area", cv2.INTER_AREA), ("cubic", cv2.INTER_CUBIC)):
        ours = resampling.cv2_resize(image, (48, 65), interpolation)
        assert ours.dtype == np.float32
        np.testing.assert_allclose(ours, cv2.resize(image, (65, 48), interpolation=flag), atol=1e-5)


@pytest.mark.parametrize("size", [*SIZES, (1024, 1024), (97, 131)])
def test_pil_lanczos_is_pillows_to_the_level(size):
    from PIL import Image

    image = picture(seed=2)
    expected = np.asarray(Image.fromarray(image).resize((size[1], size[0]), Image.LANCZOS))
    np.testing.assert_array_equal(resampling.pil_lanczos(image, size), expected)


def test_pil_lanczos_rounds_between_its_passes():
    # the same weights in float, rounded once at the end, miss Pillow by a level somewhere
    from PIL import Image

    image = picture(seed=3)
    expected = np.asarray(Image.fromarray(image).resize((400, 300), Image.LANCZOS))
    once = np.clip(np.rint(resampling.pil_lanczos(image.astype(np.float32), (300, 400))), 0, 255)
    assert levels(once, expected).max() >= 1
    np.testing.assert_array_equal(resampling.pil_lanczos(image, (300, 400)), expected)


@pytest.mark.parametrize("antialias", [False, True])
@pytest.mark.parametrize("size", SIZES)
def test_torch_bilinear_is_f_interpolate_to_float_noise(size, antialias):
    torch = pytest.importorskip("torch")
    # not an image's range (a head's logits); torch computes its weights in float32: ~1e-5
    image = picture(seed=4).astype(np.float32) / 255.0 * 3.0 - 1.0
    tensor = torch.from_numpy(image).permute(2, 0, 1)[None]
    expected = (
        torch.nn.functional.interpolate(
            tensor, size, mode="bilinear", align_corners=False, antialias=antialias
        )[0]
        .permute(1, 2, 0)
        .numpy()
    )
    np.testing.assert_allclose(
        resampling.torch_bilinear(image, size, antialias=antialias), expected, atol=5e-5
    )
    plane = resampling.torch_bilinear(image[:, :, 0], size, antialias=antialias)
    np.testing.assert_allclose(plane, expected[:, :, 0], atol=5e-5)


def test_bilinear_without_antialias_skips_pixels_when_shrinking():
    # a 1-pixel line between the taps of a 4x shrink vanishes without antialias, not with it
    line = np.zeros((8, 8), np.float32)
    line[:, 4] = 1.0
    assert resampling.torch_bilinear(line, (2, 2), antialias=False).max() == 0.0
    assert resampling.torch_bilinear(line, (2, 2), antialias=True).max() > 0.0


def test_bad_sizes_and_kinds_are_refused():
    with pytest.raises(ValueError, match="cannot resize"):
        resampling.cv2_resize(picture(), (0, 5), "area")
    with pytest.raises(ValueError, match="'area' or 'cubic'"):
        resampling.cv2_resize(picture(), (5, 5), "lanczos")
    with pytest.raises(ValueError, match="INTER_AREA enlarging"):
        resampling.cv2_resize(picture(), (200, 5), "area")


def _f_interpolate(torch, image, size, antialias=False):
    tensor = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)[None]
    out = torch.nn.functional.interpolate(tensor, size, mode="bilinear", align_corners=False, antialias=antialias)
    return out[0].permute(1, 2, 0).numpy()


@pytest.mark.parametrize("image_size,size", [((70, 98), (80, 112)), ((30, 98), (31, 250)), ((40, 40), (40, 97))])
def test_bilinear_preimage_shrinks_back_to_the_image_through_f_interpolate(image_size, size):
    # MoGe-2's export shrinks what it is fed to its token grid (bilinear, no antialias): any
    # ratio, the worst-conditioned one side larger by one pixel among them
    torch = pytest.importorskip("torch")
    image = picture(*image_size, seed=5).astype(np.float32) / 255.0
    fed = resampling.bilinear_preimage(image, size)
    assert fed.shape == (*size, 3) and fed.dtype == np.float32
    np.testing.assert_allclose(_f_interpolate(torch, fed, image_size), image, atol=1e-4)


@pytest.mark.parametrize("size,grid", [((120, 200), (42, 56)), ((60, 90), (56, 84)), ((50, 300), (70, 140))])
def test_antialiased_preimage_is_read_by_a_plain_shrink_as_the_antialiased_one(size, grid):
    # what MoGe-2's adapter feeds at the picture's size (2.9x to 1.07x shrinks, and a side that
    # grows: kept as it is); a smooth picture keeps its preimage near itself
    torch = pytest.importorskip("torch")
    image = picture(*size, seed=3).astype(np.float32) / 255.0
    fed = resampling.antialiased_preimage(image, grid)
    assert fed.shape == image.shape and fed.dtype == np.float32
    wanted = _f_interpolate(torch, image, grid, antialias=True)
    np.testing.assert_allclose(_f_interpolate(torch, fed, grid), wanted, atol=1e-4)
    assert np.abs(_f_interpolate(torch, image, grid) - wanted).max() > 1e-2  # the plain shrink alone is not


def test_a_preimage_is_never_smaller_than_its_image():
    with pytest.raises(ValueError, match="larger than its image"):
        resampling.bilinear_preimage(np.zeros((10, 10, 3), np.float32), (9, 12))


def test_a_bilinear_preimage_exists_at_every_ratio_and_stays_in_a_sane_range():
    # each output pixel reads two neighbours, the left ones strictly increasing: A A^T is
    # invertible at every ratio, worst just above 1x (values within ~18x of the image's)
    image = picture(3, 14, seed=9).astype(np.float32) / 255.0
    for width in range(15, 50):
        fed = resampling.bilinear_preimage(image, (3, width))
        back = resampling.torch_bilinear(fed, (3, 14), antialias=False)
        assert np.abs(back - image).max() < 1e-5, width
        assert np.abs(fed).max() < 20.0, width
