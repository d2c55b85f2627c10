"""The built-in model table: the public ONNX exports the add-on can download.

Every fact here was read from a public source (named in the entry's ``notes``); what could not be
confirmed is ``None`` and the note says so. Never put a guessed URL, size or checksum here: the
installer deletes a download that does not match them. ``settings`` are checked against the
family's record (models/family.py) when the table is loaded.
"""

from __future__ import annotations

from ..imaging import IMAGENET_MEAN, IMAGENET_STD
from .catalog_entry import CatalogEntry

_BEN2_COMMON = {"input_size": (1024, 1024)}  # (height, width), used only if the export's is dynamic

_MOGE2_COMMON = {  # the export normalises the image inside the graph
    "patch_size": 14,
    "num_tokens_range": (1200, 3600),
    "resolution_levels": 10,  # level 0..9 maps linearly onto num_tokens_range
    "mask_threshold": 0.5,
}

_MOGE2_NOTES = (
    "Official ONNX export by the MoGe author (Ruicheng). Size and sha256 agree across several "
    "independent public download manifests. License: MoGe is MIT (its DINOv2 part Apache-2.0); "
    "the ONNX repository itself carries no license tag. Inputs: 'image' 1x3xHxW RGB/255 and "
    "'num_tokens' int64 scalar. Outputs points/normal/mask plus the metric scale (one public "
    "consumer reports the published file names that output 'scale', the PyTorch code calls it "
    "'metric_scale'): read names from the session. Post-processing (focal/shift recovery) is not "
    "in the export."
)

_UPSCALE_COMMON: dict = {}  # the overlap comes from each graph

_QUALCOMM_NOTE = (
    "ONNX export published by Qualcomm AI Hub; the file was listed on the repository's main "
    "branch. Qualcomm re-uploads it often (content and checksum change between uploads) and "
    "newer model cards point to zip downloads instead, so size and sha256 are unknown (None) and "
    "the address may stop working; if it does, register your own ONNX export by path. Input is "
    "a fixed 128x128 tile according to public users of this export (read it from the session). "
    "License tag on the card: BSD-3-Clause (Real-ESRGAN weights, Xintao Wang)."
)

BUILTIN_ENTRIES: tuple[CatalogEntry, ...] = (
    CatalogEntry(
        id="ben2-fp16",
        family="ben2",
        variant="base-fp16",
        title="BEN2 Base (fp16, ONNX Community)",
        filename="ben2-base-fp16.onnx",
        url=(
            "https://huggingface.co/onnx-community/BEN2-ONNX/resolve/"
            "c552aa82688edce09f0ac9d2e31ad53d9d629010/onnx/model_fp16.onnx"
        ),
        size_bytes=219_121_675,
        sha256="dfdc25f421f32a0d1268e0f2ff2153d340e8f1d52d3dd16f5dc33c1ce85cedf1",
        license="MIT",
        source="onnx-community/BEN2-ONNX (onnx/model_fp16.onnx)",
        settings={
            **_BEN2_COMMON,
            "mean": IMAGENET_MEAN,
            "std": IMAGENET_STD,
        },
        notes=(
            "fp16 weights, ~219 MB. URL pinned to revision c552aa8 so the checksum cannot drift; "
            "size and sha256 agree across several public manifests that pin this revision. "
            "Normalisation: ImageNet mean/std after /255, as the export's preprocessor_config.json "
            "(seen in a mirror of this repo) and its users document. DOUBT: the upstream BEN2 "
            "ONNX script uses /255 only and rembg uses mean 0.5 / std 1; if mattes look washed "
            "out, try the PramaLLC entry's constants."
        ),
        approx_size_bytes=219_121_675,
        weight_dtype="float16",
    ),
    CatalogEntry(
        id="ben2-base",
        family="ben2",
        variant="base",
        title="BEN2 Base (official ONNX, PramaLLC)",
        filename="ben2-base.onnx",
        url=(
            "https://huggingface.co/PramaLLC/BEN2/resolve/"
            "e48a20765fb421d19dcdb0bf3cc61e802ca5ec8f/BEN2_Base.onnx"
        ),
        size_bytes=222_932_053,
        sha256="22cea62108ff53b7ccc20f7a008bf30494228d84b1687f29ecbe76936a998101",
        license="MIT",
        source="PramaLLC/BEN2 (BEN2_Base.onnx)",
        settings={
            **_BEN2_COMMON,
            "mean": (0.0, 0.0, 0.0),
            "std": (1.0, 1.0, 1.0),
        },
        notes=(
            "Official export linked from the BEN2 README (~213 MiB; public users report it emits "
            "float16). URL pinned to revision e48a207; size and sha256 agree across several "
            "public manifests. Normalisation: /255 only (torchvision ToTensor), as the repo's "
            "onnx_run.py does according to its users. DOUBT: a later rembg session feeds it "
            "mean 0.5 / std 1.0 instead. Its weights are fp16 as well (the fp32 Swin-B graph is "
            "409 MB); on CPU an fp16 graph of BEN2 ran 1.22x slower and peaked 0.86 GB higher than "
            "fp32, so an fp32 export registered by path is picked first on CPU."
        ),
        approx_size_bytes=222_932_053,
        weight_dtype="float16",
    ),
    CatalogEntry(
        id="da3-metric-large",
        family="da3",
        variant="metric-large-280x504",
        title="Depth Anything 3 Metric Large (fixed 280x504)",
        filename="da3-metric-large-280x504.onnx",
        url="https://huggingface.co/TillBeemelmanns/Depth-Anything-V3-ONNX/resolve/main/DA3METRIC-LARGE.onnx",
        size_bytes=None,
        sha256=None,
        license="Apache-2.0",
        source="TillBeemelmanns/Depth-Anything-V3-ONNX (DA3METRIC-LARGE.onnx)",
        settings={  # the export's input is fixed at 1x3x280x504: the session says so
            "process_res": 504,
            "patch_multiple": 14,
            "mean": IMAGENET_MEAN,
            "std": IMAGENET_STD,
        },
        notes=(
            "Community export of the official DA3METRIC-LARGE checkpoint (Apache-2.0), announced "
            "by its author in ByteDance-Seed/Depth-Anything-3 issue #65; file name confirmed by "
            "several public download scripts. Fixed input 1x3x280x504, outputs 'depth' and 'sky'. "
            "Size and sha256 UNKNOWN (download scripts say ~0.7 GB); only the transfer length is "
            "checked. METRIC-LARGE has 334 M parameters, 1.34 GB in fp32: a ~0.7 GB file holds "
            "fp16 weights (weight_dtype below follows that size; an fp32 export of it is ~1.34 GB "
            "and needs that much RAM for its weights). The I/O dtype is read from the session. "
            "Sky: upstream's sky head ends in ReLU (non-negative scores, not logits; "
            "sky_activation 'auto' returns a non-negative sky raw and applies a sigmoid only to an "
            "output with negative values). Its ROS2/TensorRT adapter scales raw depth to metres "
            "with depth * focal_px / 300 and treats sky < 0.3 as sky; both are third-party findings."
        ),
        approx_size_bytes=731_000_000,
        weight_dtype="float16",
    ),
    CatalogEntry(
        id="moge2-vits",
        family="moge2",
        variant="vits-normal",
        title="MoGe-2 ViT-S (normals)",
        filename="moge2-vits-normal.onnx",
        url="https://huggingface.co/Ruicheng/moge-2-vits-normal-onnx/resolve/main/model.onnx",
        size_bytes=140_852_051,
        sha256="24eacb5dc7a2c54c7bc98f7de085ffbed79ad006ea5b664c2c2cdc02ff3a52f0",
        license="MIT",
        source="Ruicheng/moge-2-vits-normal-onnx (model.onnx)",
        settings=dict(_MOGE2_COMMON),
        notes=_MOGE2_NOTES,
        approx_size_bytes=140_852_051,
    ),
    CatalogEntry(
        id="moge2-vitb",
        family="moge2",
        variant="vitb-normal",
        title="MoGe-2 ViT-B (normals)",
        filename="moge2-vitb-normal.onnx",
        url="https://huggingface.co/Ruicheng/moge-2-vitb-normal-onnx/resolve/main/model.onnx",
        size_bytes=419_411_850,
        sha256="bbf14e07a30f11e69d36ab861590123f5598ababcbc8946a063eb4a966f35a21",
        license="MIT",
        source="Ruicheng/moge-2-vitb-normal-onnx (model.onnx)",
        settings=dict(_MOGE2_COMMON),
        notes=_MOGE2_NOTES,
        approx_size_bytes=419_411_850,
    ),
    CatalogEntry(
        id="moge2-vitl",
        family="moge2",
        variant="vitl-normal",
        title="MoGe-2 ViT-L (normals)",
        filename="moge2-vitl-normal.onnx",
        url="https://huggingface.co/Ruicheng/moge-2-vitl-normal-onnx/resolve/main/model.onnx",
        size_bytes=1_324_265_014,
        sha256="afbc4ccc3450298f3afb35b90f015f4c4f552dea21dc6470d5f7b78b77e2d751",
        license="MIT",
        source="Ruicheng/moge-2-vitl-normal-onnx (model.onnx)",
        settings=dict(_MOGE2_COMMON),
        notes=_MOGE2_NOTES,
        approx_size_bytes=1_324_265_014,
    ),
    CatalogEntry(
        id="upscale-realesr-general-x4v3",
        family="upscale",
        variant="realesr-general-x4v3",
        title="Real-ESRGAN General x4v3 (Qualcomm ONNX export)",
        filename="realesr-general-x4v3-qualcomm.onnx",
        url="https://huggingface.co/qualcomm/Real-ESRGAN-General-x4v3/resolve/main/Real-ESRGAN-General-x4v3.onnx",
        size_bytes=None,
        sha256=None,
        license="BSD-3-Clause",
        source="qualcomm/Real-ESRGAN-General-x4v3 (Real-ESRGAN-General-x4v3.onnx)",
        settings=dict(_UPSCALE_COMMON),
        notes="~4.9 MB. " + _QUALCOMM_NOTE,
        approx_size_bytes=4_870_000,
    ),
    CatalogEntry(
        id="upscale-realesr-general-wdn-x4v3",
        family="upscale",
        variant="realesr-general-wdn-x4v3",
        title="Real-ESRGAN General WDN x4v3 (bring your own ONNX)",
        filename="realesr-general-wdn-x4v3.onnx",
        url=None,
        size_bytes=None,
        sha256=None,
        license="BSD-3-Clause",
        source="xinntao/Real-ESRGAN (official weights are .pth only)",
        settings=dict(_UPSCALE_COMMON),
        notes=(
            "No public ONNX file of this model could be confirmed at a stable address (the "
            "official release ships realesr-general-wdn-x4v3.pth, ~5 MB). Export it to ONNX "
            "yourself (or take a trusted export) and register it by path, or save it under this "
            "entry's file name in the models folder. Size and sha256 unknown."
        ),
    ),
    CatalogEntry(
        id="upscale-realesrgan-x4plus",
        family="upscale",
        variant="realesrgan-x4plus",
        title="Real-ESRGAN x4plus (Qualcomm ONNX export)",
        filename="realesrgan-x4plus-qualcomm.onnx",
        url="https://huggingface.co/qualcomm/Real-ESRGAN-x4plus/resolve/main/Real-ESRGAN-x4plus.onnx",
        size_bytes=None,
        sha256=None,
        license="BSD-3-Clause",
        source="qualcomm/Real-ESRGAN-x4plus (Real-ESRGAN-x4plus.onnx)",
        settings=dict(_UPSCALE_COMMON),
        notes=(
            "~67 MB. " + _QUALCOMM_NOTE + " One later snapshot of this card shows the license "
            "tag 'other' (Qualcomm terms may apply to the export)."
        ),
        approx_size_bytes=67_100_000,
    ),
)
