"""Builds the `connex-ai` distribution (import package `connex`) for
`pip install --no-build-isolation .` (pyproject.toml).

The extension connex._connex is built by CMake (target connex_python) for the interpreter that runs
pip, in CONNEX_PIP_BUILD_DIR (default: $XDG_CACHE_HOME/connex/build-pip, else
~/.cache/connex/build-pip — a cache kept between installs, so a second `pip install .` rebuilds
only what changed, and ccache makes a fresh one cheap), and copied beside the pure-Python part,
python/connex/. setuptools' own build and metadata files go there too: an install writes nothing
into the checkout. The version is the CMake project's.
"""

import os
import pathlib
import re
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent


def cache_dir():
    explicit = os.environ.get("CONNEX_PIP_BUILD_DIR")
    if explicit:
        return pathlib.Path(explicit)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(cache) / "connex" / "build-pip"


PIP_DIR = cache_dir()


def cmake_version():
    text = (ROOT / "CMakeLists.txt").read_text()
    match = re.search(r"project\(connex VERSION (\d+\.\d+\.\d+)", text)
    if not match:
        sys.exit("setup.py: no 'project(connex VERSION x.y.z' in CMakeLists.txt")
    return match.group(1)


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = PIP_DIR
        configure = ["cmake", "-S", str(ROOT), "-B", str(build_dir),
                     "-DCMAKE_BUILD_TYPE=" + os.environ.get("CONNEX_PIP_BUILD_TYPE", "Release"),
                     "-DCONNEX_PYTHON=ON", "-DPython3_EXECUTABLE=" + sys.executable]
        if shutil.which("ninja") and not (build_dir / "CMakeCache.txt").exists():
            configure += ["-G", "Ninja"]
        jobs = os.environ.get("CONNEX_PIP_JOBS", str(os.cpu_count() or 1))
        for command in (configure, ["cmake", "--build", str(build_dir), "--target",
                                    "connex_python", "-j", jobs]):
            print("setup.py:", " ".join(command), flush=True)
            subprocess.run(command, check=True)
        built = sorted((build_dir / "python" / "connex").glob("_connex*.so"))
        if not built:
            sys.exit(f"setup.py: CMake built no _connex*.so in {build_dir}/python/connex")
        target = pathlib.Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built[-1], target)


# setuptools' own build and metadata directories go to the cache too (its defaults, build/ and
# python/*.egg-info, are in the checkout; build/ is the CMake tree of the presets).
PIP_DIR.mkdir(parents=True, exist_ok=True)

setup(
    version=cmake_version(),
    options={"build": {"build_base": str(PIP_DIR / "setuptools")},
             "egg_info": {"egg_base": str(PIP_DIR)}},
    packages=["connex", "connex.pp"],
    package_dir={"": "python"},
    package_data={"connex": ["*.pyi", "py.typed"]},
    ext_modules=[Extension("connex._connex", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
)
