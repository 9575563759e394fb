"""Fixture wheels of a fixed nemo-automodel: the real 0.7.0 wheel with ``_nccl_backend_override`` fixed.

The release that carries NVIDIA-NeMo/Automodel#4602 is not out. To rehearse the pin bump
the suite builds it, several ways, from the real 0.7.0 release wheel: each *style* rewrites
only the body of ``_nccl_backend_override`` so that mesh sub-groups keep every half of the
default group, learning that group a different way. Like the expected upstream fix, every
style keeps the ``device_type != "cuda": return None`` guard, so a CPU (gloo) mesh still
needs the cpu-mesh-timeout workaround.

* ``getbackend`` - ``dist.get_backend()`` (as ``automodel_patch/keep-cpu-backend.patch`` does, once it has found a
  default group in ``dist.group.WORLD``);
* ``getbackendconfig`` - ``dist.get_backend_config()``;
* ``optionsonly`` - options alone per axis: no backend string, so torch uses the default group's;
* ``defaultgroup`` - the default group object: ``_get_default_group()._device_types``;
* ``cudaquery`` - fixed like ``getbackend``, but it also asks ``torch.cuda.current_device()``
  for the options' device, which raises on a machine without a GPU: detection there cannot
  judge it (the "unknown" case).

Each wheel gets a local version label (``0.7.0+fixed.<style>``) in its file name, its
metadata, its RECORD and ``nemo_automodel.__version__``. Wheels are cached under
``<release cache>/fixtures/<builder digest>/<style>/`` (the digest covers this file, so a
change here rebuilds them) and never committed.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import tempfile
import zipfile
from pathlib import Path

from tests.harness.releases import CACHE, release_wheel

__all__ = ["BASE_RELEASE", "JUDGEABLE_STYLES", "STYLES", "fixture_version", "fixture_wheel"]

BASE_RELEASE = "0.7.0"
MESH_UTILS = "nemo_automodel/components/distributed/mesh_utils.py"
PACKAGE_INFO = "nemo_automodel/package_info.py"

_UPSTREAM_BODY = """    timeout = datetime.timedelta(minutes=timeout_minutes)
    override = {}
    for axis in axes:
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        override[axis] = ("nccl", options)
    return override
"""
_LOOP = """    timeout = datetime.timedelta(minutes=timeout_minutes)
    override = {{}}
    for axis in axes:
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
{extra}        override[axis] = {value}
    return override
"""

#: style -> (lines before the loop, extra lines in the loop, the value given to each axis)
_STYLES: dict[str, tuple[str, str, str]] = {
    "getbackend": (
        '    backend = str(dist.get_backend()) if dist.is_initialized() else "nccl"\n',
        "",
        "(backend, options)",
    ),
    "getbackendconfig": (
        '    backend = dist.get_backend_config() if dist.is_initialized() else "nccl"\n',
        "",
        "(backend, options)",
    ),
    "optionsonly": (
        "    # No backend string: DeviceMesh then builds each sub-group with the default group's backend.\n",
        "",
        "options",
    ),
    "defaultgroup": (
        "    world = dist.distributed_c10d._get_default_group() if dist.is_initialized() else None\n"
        '    devices = {device.type for device in world._device_types} if world is not None else {"cuda"}\n'
        '    backend = "cuda:nccl,cpu:gloo" if "cpu" in devices else "nccl"\n',
        "",
        "(backend, options)",
    ),
    "cudaquery": (
        '    backend = str(dist.get_backend()) if dist.is_initialized() else "nccl"\n'
        "    torch.cuda.current_device()  # where the communicators will live; raises without a GPU\n",
        "",
        "(backend, options)",
    ),
}
STYLES = tuple(_STYLES)
#: Styles the probe can judge on a CPU-only machine (``cudaquery`` needs a GPU to answer).
JUDGEABLE_STYLES = ("getbackend", "getbackendconfig", "optionsonly", "defaultgroup")


def fixture_version(style: str) -> str:
    return f"{BASE_RELEASE}+fixed.{style}"


def _fixed_mesh_utils(source: str, style: str) -> str:
    before, extra, value = _STYLES[style]
    if source.count(_UPSTREAM_BODY) != 1:
        raise RuntimeError(f"the {BASE_RELEASE} _nccl_backend_override body is not where the fixture expects it")
    body = _LOOP.format(extra=extra, value=value)
    comment = f"    # Fixed (fixture style {style!r}): keep every backend half of the default group.\n"
    return source.replace(_UPSTREAM_BODY, comment + before + body)


def _labelled_package_info(source: str, version: str) -> str:
    # The version the module reports: the local label, and no "+<git sha>" of an enclosing checkout.
    return source + f"\n__version__ = {version!r}  # fixture wheel\n"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _digest() -> str:
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]


def _build(base: Path, style: str, target: Path) -> None:
    version = fixture_version(style)
    old_info, new_info = f"nemo_automodel-{BASE_RELEASE}.dist-info/", f"nemo_automodel-{version}.dist-info/"
    files: dict[str, bytes] = {}
    with zipfile.ZipFile(base) as archive:
        for name in archive.namelist():
            data = archive.read(name)
            if name == MESH_UTILS:
                data = _fixed_mesh_utils(data.decode(), style).encode()
            elif name == PACKAGE_INFO:
                data = _labelled_package_info(data.decode(), version).encode()
            elif name == old_info + "METADATA":
                data = re.sub(rb"(?m)^Version: .*$", f"Version: {version}".encode(), data, count=1)
            files[name.replace(old_info, new_info) if name.startswith(old_info) else name] = data
    record = new_info + "RECORD"
    lines = [_record_line(name, data) for name, data in files.items() if name != record]
    files[record] = ("\n".join([*lines, f"{record},,"]) + "\n").encode()
    with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".whl", delete=False) as tmp:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as out:
            for name, data in files.items():
                out.writestr(name, data)
    os.replace(tmp.name, target)


def fixture_wheel(style: str) -> Path:
    """The fixture wheel of ``style``, built on first use from the real 0.7.0 wheel (raises
    :class:`tests.harness.releases.ReleaseUnavailable` when that cannot be fetched)."""
    if style not in _STYLES:
        raise ValueError(f"unknown fixture style {style!r}; known: {', '.join(STYLES)}")
    folder = CACHE / "fixtures" / _digest() / style
    target = folder / f"nemo_automodel-{fixture_version(style)}-py3-none-any.whl"
    if not target.exists():
        folder.mkdir(parents=True, exist_ok=True)
        _build(release_wheel(BASE_RELEASE), style, target)
    return target
