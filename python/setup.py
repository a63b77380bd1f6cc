"""Builds the pagedattn C library with CMake and ships libpagedattn.so inside the package.

CMake runs on the repository root (the parent of this directory, or $PAGEDATTN_SOURCE_DIR) with
the tests, tools and the cuda backend off; extra CMake arguments can be given in the environment
variable PAGEDATTN_CMAKE_ARGS.
"""

import os
import shlex
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("PAGEDATTN_SOURCE_DIR") or os.path.dirname(HERE)


class BuildWithCMake(build_py):
    """build_py that also configures and builds the C library and copies it into the package."""

    def run(self):
        super().run()
        lib = self._build_library()
        dest_dir = os.path.join(self.build_lib, "pagedattn")
        os.makedirs(dest_dir, exist_ok=True)
        dest = os.path.join(dest_dir, "libpagedattn.so")
        if os.path.exists(dest):
            os.remove(dest)
        shutil.copyfile(lib, dest)
        os.chmod(dest, 0o755)
        if getattr(self, "editable_mode", False):  # pip install -e: the package is the source
            src_dest = os.path.join(HERE, "pagedattn", "libpagedattn.so")
            if os.path.abspath(src_dest) != os.path.abspath(dest):
                shutil.copyfile(lib, src_dest)
                os.chmod(src_dest, 0o755)

    def _build_library(self):
        if not os.path.exists(os.path.join(ROOT, "CMakeLists.txt")):
            raise RuntimeError("pagedattn: %s has no CMakeLists.txt; build the package from the "
                               "repository's python/ directory" % ROOT)
        cmake = shutil.which("cmake")
        if not cmake:
            raise RuntimeError("pagedattn: cmake (>= 3.18) is needed to build the C library")
        build_dir = os.environ.get("PAGEDATTN_CMAKE_BUILD_DIR") or os.path.join(
            HERE, "build", "cmake-%d.%d" % sys.version_info[:2])
        os.makedirs(build_dir, exist_ok=True)
        # The package works on host memory (numpy arrays, torch CPU tensors), so the cuda
        # backend is left out unless PAGEDATTN_CMAKE_ARGS turns it on (later -D wins).
        args = [cmake, "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                "-DPAGEDATTN_BUILD_TESTS=OFF", "-DPAGEDATTN_BUILD_TOOLS=OFF",
                "-DPAGEDATTN_CUDA=OFF"]
        args += shlex.split(os.environ.get("PAGEDATTN_CMAKE_ARGS", ""))
        subprocess.check_call(args)
        jobs = str(os.cpu_count() or 2)
        subprocess.check_call([cmake, "--build", build_dir, "--target", "pagedattn",
                               "--parallel", jobs])
        for cand in ("libpagedattn.so", os.path.join("lib", "libpagedattn.so")):
            path = os.path.join(build_dir, cand)
            if os.path.exists(path):
                return os.path.realpath(path)
        for dirpath, _, files in os.walk(build_dir):
            if "libpagedattn.so" in files:
                return os.path.realpath(os.path.join(dirpath, "libpagedattn.so"))
        raise RuntimeError("pagedattn: the CMake build produced no libpagedattn.so in %s"
                           % build_dir)


class BinaryDistribution(Distribution):
    """The package carries a native library: tag the wheel for this platform."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithCMake}, distclass=BinaryDistribution)
