"""Shared fixtures: tiny ImageNet-like source trees and configs for the data layer tests."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

import numpy as np
import pytest
from PIL import Image

from ralp_pipe.cli import main as cli
from ralp_pipe.config import Config, load

BUNDLE = "bundles/smoke-0123.tar.gz"  # the `bundle` fixture, below its results folder
RALP_PIPE = Path(sys.executable).with_name("ralp-pipe")  # the installed command


@pytest.fixture(autouse=True, scope="session")
def _sigint_as_in_a_terminal() -> Iterator[None]:
    """SIGINT as a terminal's foreground job has it. A shell that starts the suite in the background leaves it
    ignored, and this process and every stage it starts would inherit that: the Ctrl-C tests would see nothing."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(autouse=True, scope="session")
def _configurations_composed_once() -> Iterator[None]:
    """What composing a configuration repeats, done once per session (:func:`ralp_pipe.config.load` took 0.3-0.6 s,
    and hundreds of tests call it): Hydra's composition for each config folder, config name and list of overrides
    while the folder's files hold what they held; OmegaConf's parse of each YAML text; the schema it makes of each
    dataclass. Each call gets a copy of what the first one made, so no test sees another's changes; what ``load``
    does with the composition (resolving, type-checking, validating) runs every time, and so does every call that
    fails."""
    import hydra
    from omegaconf import OmegaConf

    real = hydra.initialize_config_dir, hydra.compose, OmegaConf.load, OmegaConf.structured
    real_init, real_compose, real_load, real_structured = real
    made: dict[tuple[Any, ...], Any] = {}
    folder: list[str] = []

    def once(key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        if key not in made:
            made[key] = make()
        return copy.deepcopy(made[key])

    @contextlib.contextmanager
    def initialize_config_dir(config_dir: str, *args: Any, **kwargs: Any) -> Iterator[None]:
        with real_init(config_dir, *args, **kwargs):
            folder.append(config_dir)
            try:
                yield
            finally:
                folder.pop()

    def compose(config_name: str | None = None, overrides: list[str] | None = None, **kwargs: Any) -> Any:
        if not folder or kwargs:
            return real_compose(config_name, overrides, **kwargs)
        files = _files_as_they_are(Path(folder[-1]))
        return once(
            ("compose", folder[-1], config_name, tuple(overrides or ()), files),
            lambda: real_compose(config_name, overrides),
        )

    def load(file_: Any) -> Any:
        try:
            if isinstance(file_, (str, Path)):
                text = Path(file_).read_text(encoding="utf-8")
            else:
                start = file_.tell()
                text = file_.read()
                file_.seek(start)
        except (OSError, ValueError, AttributeError):  # unreadable, undecodable, not seekable: as OmegaConf has it
            return real_load(file_)
        return once(("load", text), lambda: real_load(file_))

    def structured(obj: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(obj, type) or args or kwargs:
            return real_structured(obj, *args, **kwargs)
        return once(("structured", obj), lambda: real_structured(obj))

    hydra.initialize_config_dir, hydra.compose = initialize_config_dir, compose
    OmegaConf.load, OmegaConf.structured = staticmethod(load), staticmethod(structured)  # type: ignore[method-assign]
    yield
    hydra.initialize_config_dir, hydra.compose = real_init, real_compose
    OmegaConf.load, OmegaConf.structured = staticmethod(real_load), staticmethod(real_structured)  # type: ignore[method-assign]


def _files_as_they_are(folder: Path) -> tuple[tuple[str, bytes], ...]:
    """Every file under `folder` with its content's digest."""
    found = []
    for parent, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(parent, name)
            with open(path, "rb") as file:
                found.append((path, hashlib.blake2b(file.read(), digest_size=16).digest()))
    return tuple(sorted(found))


def encode(image: Image.Image, fmt: str = "JPEG") -> bytes:
    """Bytes of `image` saved in `fmt`."""
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


def noise_image(seed: int, mode: str = "RGB", size: tuple[int, int] = (40, 32)) -> Image.Image:
    """A small random image (width, height = size) in `mode`."""
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "CMYK": 4, "L": 1}[mode]
    pixels = rng.integers(0, 256, size=(size[1], size[0], channels), dtype=np.uint8)
    return Image.fromarray(pixels.squeeze(-1) if channels == 1 else pixels, mode)


@pytest.fixture
def rgb_tree(tmp_path: Path) -> Path:
    """Class folders n00000000..n00000002 with 2, 3 and 4 plain RGB JPEGs."""
    root = tmp_path / "imagenet"
    for label, count in enumerate((2, 3, 4)):
        folder = root / f"n{label:08d}"
        folder.mkdir(parents=True)
        for number in range(count):
            (folder / f"n{label:08d}_{number}.JPEG").write_bytes(encode(noise_image(label * 10 + number)))
    return root


def folders_to_tars(root: Path, target: Path) -> Path:
    """The ImageNet-21K distribution of `root`: one `<synset>.tar` per class folder."""
    target.mkdir()
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        with tarfile.open(target / f"{folder.name}.tar", "w") as archive:
            for path in sorted(folder.iterdir()):
                archive.add(path, arcname=path.name)
    return target


@pytest.fixture
def make_config(tmp_path: Path) -> Callable[..., Config]:
    """Build a validated Config for a source tree, writing results under tmp_path/results."""

    def build(source: Path | None, *overrides: str, layout: str = "folders") -> Config:
        base = [
            f"paths.results={tmp_path / 'results'}",
            "dataset.num_classes=5",
            "dataset.shards.images_per_shard=3",
            "dataset.shards.workers=1",
            "dataset.shards.resize_shorter=null",
        ]
        if source is not None:
            base = ["dataset=imagenet1k", f"dataset.layout={layout}", f"dataset.source={source}", *base]
        return load([*base, *overrides])

    return build


@pytest.fixture(scope="session")
def bundled_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results folder of 8 runs, aggregated and bundled through the CLI once per session (do not change it)."""
    from workflow_records import write_aggregated  # pandas: imported only by the tests using it

    root = write_aggregated(tmp_path_factory.mktemp("bundled") / "results", models=("vgg11",), gpus=(2, 4))
    includes = [str(root / name) for name in ("configs", "runs", "plans", "concurrent", "tables")]
    assert cli(["bundle", "--root", str(root), "--include", *includes, "--out", str(root / BUNDLE)]) == 0
    return root


@pytest.fixture
def bundle(tmp_path: Path, bundled_results: Path) -> Path:
    """A complete bundle of 8 runs, made through the CLI after `aggregate`: in this test's own copy of
    :func:`bundled_results`, so `bundle.parents[1]` is its results folder."""
    return Path(shutil.copytree(bundled_results, tmp_path / "results")) / BUNDLE


class Ran(NamedTuple):
    """What a run of the command did (the fields of subprocess.CompletedProcess that the tests read)."""

    returncode: int
    stdout: str
    stderr: str


@pytest.fixture(params=["in-process", pytest.param("command", marks=pytest.mark.slow)])
def ralp_pipe(request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]) -> Callable[..., Ran]:
    """Run `ralp-pipe ARGV...` and return its exit status, stdout and stderr. A test using it runs twice: once
    through the CLI's entry point in this process (a unit test: the stage's modules are imported once per
    session), once as the installed command in a subprocess of its own (slow: each imports its stage afresh,
    torch included), whose stderr also shows whatever its imports print."""

    def run(*argv: str, timeout: float = 300) -> Ran:
        if request.param == "command":
            proc = subprocess.run([str(RALP_PIPE), *argv], capture_output=True, text=True, timeout=timeout)
            return Ran(proc.returncode, proc.stdout, proc.stderr)
        capsys.readouterr()  # only what the command prints
        status = cli(list(argv))
        out, err = capsys.readouterr()
        return Ran(status, out, err)

    return run
