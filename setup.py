"""Builds streamnccl._C: the core and host path always, the NCCL path when torch is a CUDA
build and NCCL is found (NCCL_HOME, then the pip `nvidia.nccl` package, then CUDA_HOME).

Install with `pip install --no-build-isolation -e .` so the extension builds against the
torch already installed (build isolation would fetch another one).
"""

import os
from pathlib import Path

import torch
from setuptools import setup
from torch.utils import cpp_extension

VERSION = "0.1.0"
ROOT = Path(__file__).resolve().parent


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


def make_extension():
    libstdcxx = loaded_libstdcxx()
    common = dict(
        name="streamnccl._C",
        include_dirs=[str(ROOT / "csrc")],
        define_macros=[("STREAMNCCL_VERSION", f'"{VERSION}"')],
        # The file prefix map: error messages (__FILE__ in TORCH_CHECK and NCCL errors) and the
        # debug info name csrc/..., not the folder the extension was built in.
        extra_compile_args={
            "cxx": ["-O2", "-std=c++17", "-Wall", "-Wno-unused-function"]
            + [f"-ffile-prefix-map={ROOT}/="]
        },
        extra_link_args=[libstdcxx] if libstdcxx else [],
    )
    nccl = find_nccl() if nccl_wanted() else None
    if nccl is None:
        if nccl_wanted():
            print("streamnccl: NCCL not found (NCCL_HOME, nvidia.nccl, CUDA_HOME); host path only")
        return cpp_extension.CppExtension(
            sources=cpp_sources("csrc", "csrc/core", "csrc/host", "csrc/sim"), **common
        )
    include, lib = nccl
    print(f"streamnccl: building the NCCL path against {include / 'nccl.h'}")
    common["include_dirs"].append(str(include))
    common["define_macros"].append(("STREAMNCCL_WITH_NCCL", "1"))
    # The pip wheel ships only the versioned soname.
    common["extra_link_args"] += ["-l:libnccl.so.2", f"-Wl,-rpath,{lib}"]
    return cpp_extension.CUDAExtension(
        sources=cpp_sources("csrc", "csrc/core", "csrc/host", "csrc/sim", "csrc/cuda", "csrc/fake"),
        library_dirs=[str(lib)],
        **common,
    )


class IncrementalBuildExtension(cpp_extension.BuildExtension):
    """Keeps object files in build/ even for pip's editable builds, which would otherwise
    compile everything again in a fresh temporary folder; ninja then rebuilds what changed."""

    def finalize_options(self):
        super().finalize_options()
        self.build_temp = str(ROOT / "build" / "temp")


setup(
    version=VERSION,
    ext_modules=[make_extension()],
    cmdclass={"build_ext": IncrementalBuildExtension.with_options(use_ninja=True)},
)
