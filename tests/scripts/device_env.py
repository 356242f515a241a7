"""An interpreter environment that sees only what the device image has (plus chosen extras): a directory of
links to the installed top-level modules of the image's distributions and everything they require,
used with ``python -S`` (no site-packages) — so a package the device lacks is simply not there, exactly
as ``import`` and ``importlib.util.find_spec`` would find it on the device."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

#: Distributions of the device image (besides the standard library).
DEVICE_IMAGE = ("torch", "transformers", "safetensors", "pyarrow", "fsspec", "numpy", "prometheus-client", "aiohttp")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(names: tuple[str, ...] | list[str]) -> set[str]:
    """``names`` and every distribution they require (markers evaluated here, no extras), as installed."""
    seen: set[str] = set()
    todo = [_normal(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # required only on other platforms or Python versions, or not installed here
        seen.add(name)
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(_normal(req.name))
    return seen


def link_tree(target: Path, distributions: set[str]) -> Path:
    """Links in ``target`` to every top-level file or directory the installed ``distributions`` consist of
    (their modules, extension libraries and ``.dist-info``); returns ``target``."""
    target.mkdir(parents=True, exist_ok=True)
    for name in sorted(distributions):
        dist = metadata.distribution(name)
        base = Path(str(dist.locate_file("")))
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            source = base / top
            link = target / top
            if source.exists() and not link.exists() and top not in ("__pycache__", "bin"):
                link.symlink_to(source)
    return target
