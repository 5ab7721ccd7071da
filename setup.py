"""Builds streamnccl against the torch installed in this environment (`pip install
--no-build-isolation .`: build isolation would fetch another torch to compile against).

Two extensions:
- streamnccl._C, the product: the core and host path always, the NCCL path when torch is a CUDA
  build and NCCL is found (NCCL_HOME, then the pip `nvidia.nccl` package, then CUDA_HOME);
- streamnccl._testing, the test doubles (the fake GPU, the simulated device, the no-op device
  of the launch bench), only with STREAMNCCL_BUILD_TESTING=1 (scripts/test.sh sets it). It links
  against _C, so nothing of the product is compiled twice and `import streamnccl` loads none
  of it.

A torch outside the supported range (pyproject.toml's dependency) is refused here, with the
reason, before pip could think of replacing it.
"""

import copy
import os
import re
import sys
from pathlib import Path

import torch
from setuptools import setup
from torch.utils import cpp_extension

VERSION = "0.1.0"
ROOT = Path(__file__).resolve().parent
PRODUCT = "streamnccl._C"
TESTING = "streamnccl._testing"


def supported_torch():
    """The (oldest, first unsupported) torch releases, as (major, minor), from pyproject.toml."""
    found = re.search(r'"torch>=(\d+)\.(\d+),<(\d+)\.(\d+)"', (ROOT / "pyproject.toml").read_text())
    low_major, low_minor, high_major, high_minor = map(int, found.groups())
    return (low_major, low_minor), (high_major, high_minor)


def check_torch():
    low, high = supported_torch()
    have = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    if not low <= have < high:
        newest = f"{high[0]}.{high[1] - 1}" if high[1] > 0 else "the release before"
        sys.exit(
            f"streamnccl supports torch {low[0]}.{low[1]} to {newest}; this environment has torch "
            f"{torch.__version__}. streamnccl builds against the torch installed and leaves it "
            "as it is: install a supported torch first (scripts/setup.sh installs 2.15.0 into an "
            "environment that has none)."
        )


def cpp_sources(*folders):
    return sorted(str(p.relative_to(ROOT)) for f in folders for p in (ROOT / f).glob("*.cpp"))


def nccl_candidates():
    """Folders that may hold include/nccl.h and lib/libnccl.so*, in the order we trust them."""
    if os.environ.get("NCCL_HOME"):
        yield Path(os.environ["NCCL_HOME"])
    try:
        import nvidia.nccl  # the NCCL torch itself loads

        yield from (Path(p) for p in nvidia.nccl.__path__)
    except ImportError:
        pass
    if cpp_extension.CUDA_HOME:
        yield Path(cpp_extension.CUDA_HOME)


def find_nccl():
    for home in nccl_candidates():
        include = home / "include"
        for lib in (home / "lib", home / "lib64", home / "lib" / "x86_64-linux-gnu"):
            if (include / "nccl.h").exists() and list(lib.glob("libnccl.so*")):
                return include, lib
    return None


def nccl_wanted():
    if os.environ.get("STREAMNCCL_BUILD_NCCL", "1") == "0":
        return False
    return torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None


def loaded_libstdcxx():
    """The libstdc++ shared library this process (torch) has loaded, or None.

    A compiler that links libstdc++ statically (one configured so, or one that ships only
    libstdc++.a) would put a second copy into the extension. Calls between the copies then mix
    two libraries' internals: on a GPU machine whose compiler (CXX, not the system's g++) did
    this while torch loaded the system's newer libstdc++, writing an integer to a
    std::ostringstream crashed. Naming torch's own library on the link line, ahead of the
    compiler's, satisfies every reference, so nothing of a static copy is linked in."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None  # not Linux: the platform's own rules apply
    for line in maps.splitlines():
        path = line.split()[-1]
        if Path(path).name.startswith("libstdc++.so"):
            return path
    return None


def extensions():
    libstdcxx = loaded_libstdcxx()
    common = dict(
        include_dirs=[str(ROOT / "csrc")],
        define_macros=[("STREAMNCCL_VERSION", f'"{VERSION}"')],
        extra_compile_args={
            "cxx": [
                "-O2",
                # torch 2.15's headers need C++20; the older ones take it too, so every
                # supported torch builds one way.
                "-std=c++20",
                "-Wall",
                "-Wno-unused-function",
                # No debug info (Python's flags ask for it): it was 62 of the extension's 64 MB
                # and much of its compile time.
                "-g0",
                # Error messages (__FILE__ in TORCH_CHECK and NCCL errors) name csrc/..., not
                # the folder the extension was built in.
                f"-ffile-prefix-map={ROOT}/=",
            ]
        },
        extra_link_args=[libstdcxx] if libstdcxx else [],
    )
    product = ["csrc", "csrc/core", "csrc/core/hooks", "csrc/host"]
    doubles = ["csrc/testing", "csrc/sim"]
    nccl = find_nccl() if nccl_wanted() else None
    make = cpp_extension.CppExtension
    if nccl is None:
        if nccl_wanted():
            print("streamnccl: NCCL not found (NCCL_HOME, nvidia.nccl, CUDA_HOME); host path only")
    else:
        include, lib = nccl
        print(f"streamnccl: building the NCCL path against {include / 'nccl.h'}")
        common["include_dirs"].append(str(include))
        common["define_macros"].append(("STREAMNCCL_WITH_NCCL", "1"))
        # The pip wheel ships only the versioned soname.
        common["extra_link_args"] += ["-l:libnccl.so.2", f"-Wl,-rpath,{lib}"]
        common["library_dirs"] = [str(lib)]
        product.append("csrc/cuda")
        doubles.append("csrc/fake")
        make = cpp_extension.CUDAExtension
    # Copies for each extension: torch's adds its own folders to the lists it is given, and a
    # list shared by both named torch's headers twice in _C's compile command whenever the
    # doubles were built too, so a build of _C alone compiled everything again.
    built = [make(name=PRODUCT, sources=cpp_sources(*product), **copy.deepcopy(common))]
    if os.environ.get("STREAMNCCL_BUILD_TESTING", "0") == "1":
        built.append(make(name=TESTING, sources=cpp_sources(*doubles), **copy.deepcopy(common)))
    return built


class BuildExtension(cpp_extension.BuildExtension):
    """torch's build, plus: object files kept in build/ (pip's editable builds would otherwise
    compile everything again in a fresh temporary folder; ninja then rebuilds what changed);
    the test doubles linked against the product; and the torch built against written down
    beside the product, which `import streamnccl` holds against the torch running."""

    def finalize_options(self):
        super().finalize_options()
        self.build_temp = str(ROOT / "build" / "temp")

    def build_extension(self, ext):
        if ext.name == TESTING:
            # Built after the product (extensions() lists it first), which it finds at run time
            # beside itself.
            product = Path(self.get_ext_fullpath(PRODUCT))
            ext.library_dirs = [*ext.library_dirs, str(product.parent)]
            ext.extra_link_args = [*ext.extra_link_args, f"-l:{product.name}", "-Wl,-rpath,$ORIGIN"]
        super().build_extension(ext)

    def run(self):
        super().run()  # into build_lib; with inplace (editable installs), copied beside the sources
        if self.inplace:
            package = ROOT / self.get_finalized_command("build_py").get_package_dir("streamnccl")
        else:
            package = Path(self.build_lib) / "streamnccl"
        (package / "_build_info.py").write_text(
            '"""Written by setup.py when streamnccl._C was built."""\n\n'
            f"TORCH_VERSION = {torch.__version__!r}  # the torch it was built against\n"
        )
        if all(ext.name != TESTING for ext in self.extensions):
            # One built earlier, linked against an earlier _C: neither kept beside the sources
            # nor left in build/ for a wheel or an install to pick up.
            for folder in {package, Path(self.build_lib) / "streamnccl"}:
                for stale in folder.glob("_testing.*"):
                    stale.unlink()


check_torch()
setup(
    version=VERSION,
    ext_modules=extensions(),
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
