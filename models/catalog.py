"""The model catalog: which ONNX files exist, where they come from and how to feed them.

bpy-free. Every fact in the built-in table was read from a public source (named in the entry's
``notes``); what could not be confirmed is ``None`` and the note says so. Never put a guessed
URL, size or checksum here: the installer deletes a download that does not match them.

A :class:`Catalog` holds the built-in entries plus the user's own ONNX files (registered by
path); the user entries can be saved to / loaded from a JSON file so Blender preferences can
keep them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..runtime.errors import LeanImageError, ModelFileError

FAMILIES = ("ben2", "da3", "moge2", "upscale")

MODELS_DIR_ENV = "LEAN_IMAGE_AI_MODELS"

USER_MODELS_FORMAT = 1

_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _freeze(value: Any) -> Any:
    """Read-only copy of a JSON-like value (dicts become mapping proxies, lists become tuples)."""
    if isinstance(value, Mapping):
        return MappingProxyType({str(k): _freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    """Plain JSON-serialisable copy of a frozen value."""
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_thaw(v) for v in value]
    return value


@dataclass(frozen=True)
class CatalogEntry:
    """One installable (or user-supplied) ONNX model.

    ``size_bytes`` and ``sha256`` are what the installer verifies; they are set only where the
    real value is known. ``approx_size_bytes`` is a display hint (e.g. "~0.7 GB") and is never
    used for verification. ``path`` is set only for user entries: the user's own file.
    ``preprocess`` holds the constants that differ between exports (normalisation, input size,
    family-specific knobs such as DA3 ``process_res``, MoGe-2 ``num_tokens`` range, upscale
    ``scale`` / ``tile``).
    """

    id: str
    family: str
    variant: str
    title: str
    filename: str
    url: str | None
    size_bytes: int | None
    sha256: str | None
    license: str
    source: str
    preprocess: Mapping[str, Any] = field(default_factory=dict, hash=False)
    notes: str = ""
    approx_size_bytes: int | None = None
    path: str | None = None

    def __post_init__(self):
        if not self.id or not isinstance(self.id, str):
            raise ValueError("a catalog entry needs a non-empty string id")
        if self.family not in FAMILIES:
            raise ValueError(f"entry {self.id!r}: family {self.family!r} is not one of {FAMILIES}")
        if not self.filename or os.path.basename(self.filename) != self.filename:
            raise ValueError(f"entry {self.id!r}: filename {self.filename!r} must be a bare file name")
        if self.url is not None and not (self.url.startswith("https://") or self.url.startswith("http://")):
            raise ValueError(f"entry {self.id!r}: url {self.url!r} must be http(s) or None")
        for name in ("size_bytes", "approx_size_bytes"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise ValueError(f"entry {self.id!r}: {name} must be a positive int or None, got {value!r}")
        if self.sha256 is not None:
            if not isinstance(self.sha256, str) or not _SHA256_RE.match(self.sha256):
                raise ValueError(f"entry {self.id!r}: sha256 must be 64 lower-case hex digits or None")
        object.__setattr__(self, "preprocess", _freeze(self.preprocess or {}))

    @property
    def is_user(self) -> bool:
        """True for a model the user registered by path (nothing to download)."""
        return self.path is not None

    @property
    def downloadable(self) -> bool:
        return self.url is not None

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _thaw(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CatalogEntry:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


# --------------------------------------------------------------------------------------------
# Built-in entries. Sources are in each entry's notes; "unknown" means not confirmed, not absent.
# --------------------------------------------------------------------------------------------

_BEN2_COMMON = {
    "input_size": (1024, 1024),  # (height, width)
    "resample": "lanczos",
    "channels": "RGB",
    "rescale": 1.0 / 255.0,
    "output": "matte",
    "postprocess": "min-max normalise, resize back, multiply into source alpha",
}

_MOGE2_COMMON = {
    "channels": "RGB",
    "rescale": 1.0 / 255.0,
    "mean": None,  # the export normalises inside the graph
    "std": None,
    "patch_size": 14,
    "num_tokens_range": (1200, 3600),
    "resolution_levels": 10,  # level 0..9 maps linearly onto num_tokens_range
    "mask_threshold": 0.5,
    "principal_point": (0.5, 0.5),
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

_UPSCALE_COMMON = {
    "channels": "RGB",
    "rescale": 1.0 / 255.0,
    "mean": None,
    "std": None,
    "scale": 4,
    "tile_overlap": 16,
    "pad_mode": "reflect",
}

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
        preprocess={
            **_BEN2_COMMON,
            "mean": IMAGENET_MEAN,
            "std": IMAGENET_STD,
            "input_dtype": "float32",
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
        preprocess={
            **_BEN2_COMMON,
            "mean": (0.0, 0.0, 0.0),
            "std": (1.0, 1.0, 1.0),
            "input_dtype": "float32",
        },
        notes=(
            "Official export linked from the BEN2 README (~213 MiB; public users report it emits "
            "float16). URL pinned to revision e48a207; size and sha256 agree across several "
            "public manifests. Normalisation: /255 only (torchvision ToTensor), as the repo's "
            "onnx_run.py does according to its users. DOUBT: a later rembg session feeds it "
            "mean 0.5 / std 1.0 instead."
        ),
        approx_size_bytes=222_932_053,
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
        preprocess={
            "input_size": (280, 504),  # (height, width), fixed in this export
            "fixed_input": True,
            "process_res": 504,
            "patch_multiple": 14,
            "channels": "RGB",
            "rescale": 1.0 / 255.0,
            "mean": IMAGENET_MEAN,
            "std": IMAGENET_STD,
            "outputs": ("depth", "sky"),
            "focal_reference_px": 300.0,
            "sky_threshold": 0.3,
        },
        notes=(
            "Community export of the official DA3METRIC-LARGE checkpoint (Apache-2.0), announced "
            "by its author in ByteDance-Seed/Depth-Anything-3 issue #65; file name confirmed by "
            "several public download scripts. Fixed input 1x3x280x504, outputs 'depth' and 'sky'. "
            "Size and sha256 UNKNOWN (download scripts say ~0.7 GB); only the transfer length is "
            "checked. Its ROS2/TensorRT adapter scales raw depth to metres with "
            "depth * focal_px / 300 and treats sky < 0.3 as sky; both are third-party findings."
        ),
        approx_size_bytes=731_000_000,
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
        preprocess=dict(_MOGE2_COMMON),
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
        preprocess=dict(_MOGE2_COMMON),
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
        preprocess=dict(_MOGE2_COMMON),
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
        preprocess={**_UPSCALE_COMMON, "tile": 128},
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
        preprocess={**_UPSCALE_COMMON, "tile": 256},
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
        preprocess={**_UPSCALE_COMMON, "tile": 128},
        notes=(
            "~67 MB. " + _QUALCOMM_NOTE + " One later snapshot of this card shows the license "
            "tag 'other' (Qualcomm terms may apply to the export)."
        ),
        approx_size_bytes=67_100_000,
    ),
)

# Defaults for user models of each family (the user can override any key).
FAMILY_DEFAULT_PREPROCESS: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        "ben2": _freeze({**_BEN2_COMMON, "mean": IMAGENET_MEAN, "std": IMAGENET_STD}),
        "da3": _freeze(
            {
                "process_res": 504,
                "patch_multiple": 14,
                "fixed_input": False,
                "channels": "RGB",
                "rescale": 1.0 / 255.0,
                "mean": IMAGENET_MEAN,
                "std": IMAGENET_STD,
            }
        ),
        "moge2": _freeze(_MOGE2_COMMON),
        "upscale": _freeze({**_UPSCALE_COMMON, "scale": None, "tile": 256}),
    }
)


# --------------------------------------------------------------------------------------------
# User models
# --------------------------------------------------------------------------------------------


def _slug(text: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug[:40] or "model"


def register_user_model(
    family: str,
    path: str | os.PathLike,
    *,
    title: str | None = None,
    scale: int | None = None,
    preprocess: Mapping[str, Any] | None = None,
) -> CatalogEntry:
    """Make a catalog entry for the user's own ONNX file (any 4x SR model, another BEN2 export...).

    The file must exist now. Nothing is copied: the entry points at the file where it lies.
    ``scale`` is for the upscale family only (the model's output/input ratio, if known; the
    adapter can also read it from the session). ``preprocess`` overrides the family defaults.
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; expected one of {', '.join(FAMILIES)}")
    if scale is not None:
        if family != "upscale":
            raise ValueError(f"'scale' only applies to upscale models, not to {family!r}")
        if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1:
            raise ValueError(f"scale must be a positive integer, got {scale!r}")
    p = Path(path).expanduser()
    try:
        p = p.resolve()
    except OSError:
        p = p.absolute()
    if not p.is_file():
        raise ModelFileError(
            f"Cannot register {str(p)!r} as a {family} model: there is no file at that path. "
            "Pick the .onnx file itself (not its folder)."
        )
    digest = hashlib.sha1(str(p).encode("utf-8")).hexdigest()[:8]
    settings = dict(FAMILY_DEFAULT_PREPROCESS[family])
    if family == "upscale":
        settings["scale"] = scale
    if preprocess:
        settings.update(preprocess)
    return CatalogEntry(
        id=f"user-{family}-{_slug(p.stem)}-{digest}",
        family=family,
        variant="user",
        title=title or f"{p.stem} (your model)",
        filename=p.name,
        url=None,
        size_bytes=None,
        sha256=None,
        license="user-supplied (check the model's own terms)",
        source=f"user file {p}",
        preprocess=settings,
        notes="Registered by path; not downloaded or checksummed by the add-on.",
        path=str(p),
    )


class Catalog:
    """Built-in entries plus the user's registered models. Safe to share between threads."""

    def __init__(
        self,
        builtin: Iterable[CatalogEntry] = BUILTIN_ENTRIES,
        user: Iterable[CatalogEntry] = (),
    ):
        self._lock = threading.RLock()
        self._builtin: dict[str, CatalogEntry] = {}
        for entry in builtin:
            if entry.id in self._builtin:
                raise ValueError(f"duplicate built-in catalog id {entry.id!r}")
            self._builtin[entry.id] = entry
        self._user: dict[str, CatalogEntry] = {}
        for entry in user:
            self._put_user(entry)

    def _put_user(self, entry: CatalogEntry) -> None:
        if entry.id in self._builtin:
            raise ValueError(f"user model id {entry.id!r} clashes with a built-in entry")
        if not entry.is_user:
            raise ValueError(
                f"entry {entry.id!r} has no path; only path-registered models can be user models"
            )
        self._user[entry.id] = entry

    def get(self, id: str) -> CatalogEntry:
        with self._lock:
            entry = self._builtin.get(id) or self._user.get(id)
        if entry is None:
            raise KeyError(f"no model with id {id!r} in the catalog")
        return entry

    def __contains__(self, id: object) -> bool:
        with self._lock:
            return id in self._builtin or id in self._user

    def entries(self, family: str | None = None) -> list[CatalogEntry]:
        if family is not None and family not in FAMILIES:
            raise ValueError(f"unknown model family {family!r}; expected one of {', '.join(FAMILIES)}")
        with self._lock:
            everything = [*self._builtin.values(), *self._user.values()]
        return [e for e in everything if family is None or e.family == family]

    def user_entries(self) -> list[CatalogEntry]:
        with self._lock:
            return list(self._user.values())

    def add_user_model(
        self,
        family: str,
        path: str | os.PathLike,
        *,
        title: str | None = None,
        scale: int | None = None,
        preprocess: Mapping[str, Any] | None = None,
    ) -> CatalogEntry:
        entry = register_user_model(family, path, title=title, scale=scale, preprocess=preprocess)
        with self._lock:
            self._put_user(entry)
        return entry

    def remove_user_model(self, id: str) -> CatalogEntry:
        """Forget a user model (the file itself is left alone)."""
        with self._lock:
            if id in self._builtin:
                raise ValueError(f"{id!r} is a built-in model; only user models can be removed")
            try:
                return self._user.pop(id)
            except KeyError:
                raise KeyError(f"no user model with id {id!r}") from None

    # -- persistence of user entries ------------------------------------------------------

    def user_models_json(self) -> str:
        with self._lock:
            payload = {
                "format": USER_MODELS_FORMAT,
                "user_models": [e.to_dict() for e in self._user.values()],
            }
        return json.dumps(payload, indent=2, sort_keys=True)

    def save_user_models(self, path: str | os.PathLike) -> Path:
        """Write the user entries to ``path`` atomically (temp file, then rename)."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            tmp.write_text(self.user_models_json(), encoding="utf-8")
            os.replace(tmp, target)
        finally:
            if tmp.exists():
                tmp.unlink()
        return target

    def load_user_models(self, path: str | os.PathLike, *, replace: bool = True) -> list[CatalogEntry]:
        """Read user entries saved by :meth:`save_user_models`. A missing file loads nothing.

        Entries whose file has since disappeared are still loaded (the UI can show them as
        missing). With ``replace`` the current user entries are dropped first.
        """
        source = Path(path)
        if not source.exists():
            if replace:
                with self._lock:
                    self._user.clear()
            return []
        try:
            payload = json.loads(source.read_text(encoding="utf-8"))
            if not isinstance(payload, dict) or payload.get("format") != USER_MODELS_FORMAT:
                raise ValueError(f"expected format {USER_MODELS_FORMAT}, got {payload.get('format')!r}")
            loaded = [CatalogEntry.from_dict(item) for item in payload.get("user_models", [])]
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            raise LeanImageError(
                f"Could not read the saved user models from {str(source)!r}: {exc}. "
                "Fix or delete that file, then register your models again."
            ) from exc
        with self._lock:
            if replace:
                self._user.clear()
            for entry in loaded:
                self._put_user(entry)
        return loaded


# --------------------------------------------------------------------------------------------
# Where models live
# --------------------------------------------------------------------------------------------


def default_models_dir() -> Path:
    """The folder for downloaded models when the caller (e.g. Blender) does not pass one.

    ``$LEAN_IMAGE_AI_MODELS`` wins; otherwise a per-user cache folder:
    Linux ``$XDG_CACHE_HOME`` or ``~/.cache`` + ``/lean_image_ai/models``, macOS
    ``~/Library/Caches/lean_image_ai/models``, Windows ``%LOCALAPPDATA%\\lean_image_ai\\models``.
    """
    override = os.environ.get(MODELS_DIR_ENV)
    if override:
        return Path(override).expanduser()
    home = Path.home()
    if sys.platform.startswith("win"):
        base = os.environ.get("LOCALAPPDATA")
        root = Path(base) if base else home / "AppData" / "Local"
    elif sys.platform == "darwin":
        root = home / "Library" / "Caches"
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = Path(xdg) if xdg and os.path.isabs(xdg) else home / ".cache"
    return root / "lean_image_ai" / "models"


__all__ = [
    "BUILTIN_ENTRIES",
    "FAMILIES",
    "FAMILY_DEFAULT_PREPROCESS",
    "MODELS_DIR_ENV",
    "Catalog",
    "CatalogEntry",
    "default_models_dir",
    "register_user_model",
]
