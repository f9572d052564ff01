"""A plugin project (a directory with pyproject.toml and its ``py-modules``) installed into a
:class:`fakedist.FakeSite` as ``pip install`` would install it, without building anything.

setuptools reads and validates the pyproject.toml exactly as its build would (a malformed one is
refused here as it would be by pip); the distribution's name, version and entry points then become
a ``NAME-VERSION.dist-info`` beside a copy of each module, so gptzoo finds the project's plugins
through importlib.metadata. The scaffold's and docs/plugins.md's tests use it for the projects that
they do not install into a real virtual environment.
"""

from __future__ import annotations

import importlib
import re
import shutil
from pathlib import Path

from fakedist import FakeSite
from setuptools.config.pyprojecttoml import read_configuration


def install_project(site: FakeSite, project: Path) -> str:
    """Install ``project`` into ``site``; the distribution's name."""
    config = read_configuration(project / "pyproject.toml")
    meta = config["project"]
    name, version = meta["name"], meta["version"]
    info = site.root / f"{re.sub(r'[-_.]+', '_', name)}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8")
    groups = meta.get("entry-points", {})
    (info / "entry_points.txt").write_text(
        "".join(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) for group, eps in groups.items()),
        encoding="utf-8",
    )
    for module in config["tool"]["setuptools"]["py-modules"]:
        shutil.copyfile(project / f"{module}.py", site.root / f"{module}.py")
        site.modules.append(module)
    importlib.invalidate_caches()
    site.allow(name)
    return name
